"""Head dims 257..512 on the CUDA kernels -- the sm80 V-split prefill (sm80/kernel_traits.cuh:
two CTAs per (query tile, head), each with half of V's columns) and the V-split split-KV decode
(flash_decode.cu DecodeTraits) -- through every entry point, against the float64 reference with
flash-attn's bound; outputs poisoned with NaN through ``out=``; the LSE (written by the first
V-split CTA alone) checked too.  Both run on any GPU of the sm80 family (a 9.0 device too).
A PagedKVCache at D=512 is one case of test_gpu_api.py::test_paged_cache_object_on_gpu.
Marked ``gpu``."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa
from helpers import (
    BF16, assert_lse_close, assert_within_bound, cu_seqlens, kv_layout, randn, ref_and_naive,
)

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

F16 = np.dtype(np.float16)


@pytest.fixture(scope="module", autouse=True)
def gpu():
    from cupy_flashattn._cuda import is_available

    if not is_available():
        pytest.skip("no sm_80+ GPU")


def _poisoned(shape, dtype):
    return cp.full(shape, np.nan, dtype=dtype)


@pytest.mark.parametrize("D", [264, 320, 384, 448, 512])
@pytest.mark.parametrize("causal", [False, True])
def test_dense(D, causal):
    rng = np.random.default_rng(D + causal)
    dt = BF16 if D % 128 else F16
    B, Sq, Sk, H, Hk = 2, 97, 300, 4, 2  # GQA; 97 and 300: partial 64-row and 32-key tiles
    q, k, v = randn(rng, (B, Sq, H, D), dt), randn(rng, (B, Sk, Hk, D), dt), randn(rng, (B, Sk, Hk, D), dt)
    out = _poisoned(q.shape, dt)
    _, lse = fa.flash_attn_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=causal, out=out,
                                return_softmax_lse=True)
    ref, ref_lse, naive = ref_and_naive(q, k, v, causal=causal)
    assert_within_bound(out, ref, naive, dt)
    assert_lse_close(lse, ref_lse, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("D", [384, 512])
def test_softcap_alibi_window(D):
    rng = np.random.default_rng(D)
    dt, B, S, H = BF16, 1, 130, 2
    q, k, v = (randn(rng, (B, S, H, D), dt) for _ in range(3))
    slopes = rng.uniform(0.01, 0.2, (H,)).astype(np.float32)
    kw = dict(causal=True, window_size=(40, 0), softcap=20.0)
    out = _poisoned(q.shape, dt)
    fa.flash_attn_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), alibi_slopes=cp.asarray(slopes),
                       out=out, **kw)
    ref, _, naive = ref_and_naive(q, k, v, alibi_slopes=slopes, **kw)
    assert_within_bound(out, ref, naive, dt)


@pytest.mark.parametrize("P", [0, 1, 16, 48, 256])
def test_varlen_and_paged(P):
    rng = np.random.default_rng(7 + P)
    dt, H, Hk, D = F16, 8, 1, 512  # MQA
    lens_q, lens_k = [1, 97, 0, 33], [1025, 97, 5, 40]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = randn(rng, (int(cu_q[-1]), H, D), dt)
    ks = [randn(rng, (n, Hk, D), dt) for n in lens_k]
    vs = [randn(rng, (n, Hk, D), dt) for n in lens_k]
    k, v, table = kv_layout(rng, ks, vs, P, dt, min_pages=1)
    kw = {} if table is None else {"block_table": cp.asarray(table)}
    out = _poisoned(q.shape, dt)
    fa.flash_attn_varlen_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), cp.asarray(cu_q),
                              cp.asarray(cu_k), max(lens_q), max(lens_k), causal=True, out=out, **kw)
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        ref, _, naive = ref_and_naive(q[cu_q[b]:cu_q[b + 1]], ks[b], vs[b], causal=True)
        assert_within_bound(out[int(cu_q[b]):int(cu_q[b + 1])], ref, naive, dt, what=f"seq {b}")


@pytest.mark.parametrize("D", [320, 512])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("S_cache,S_new", [(512, 1), (512, 3), (4096, 1)])
def test_kvcache_decode_step(D, paged, S_cache, S_new):
    """Decode steps with append on the V-split decode kernel (GQA 8/2 packed; 4096 keys split
    over several CTAs and combined), the LSE too."""
    rng = np.random.default_rng(D + paged + S_cache + S_new)
    dt, B, H, Hk, P = BF16, 3, 8, 2, 16
    q = randn(rng, (B, S_new, H, D), dt)
    k_new, v_new = randn(rng, (B, S_new, Hk, D), dt), randn(rng, (B, S_new, Hk, D), dt)
    k_before, v_before = randn(rng, (B, S_cache, Hk, D), dt), randn(rng, (B, S_cache, Hk, D), dt)
    kw = {}
    if paged:
        table = rng.permutation(B * S_cache // P).astype(np.int32).reshape(B, S_cache // P)
        k_cache = np.empty((B * S_cache // P, P, Hk, D), dt)
        v_cache = np.empty_like(k_cache)
        for b in range(B):
            k_cache[table[b]] = k_before[b].reshape(-1, P, Hk, D)
            v_cache[table[b]] = v_before[b].reshape(-1, P, Hk, D)
        kw.update(block_table=cp.asarray(table))
    else:
        k_cache, v_cache = k_before.copy(), v_before.copy()
    seqlens = np.array([0, S_cache // 2, S_cache - S_new], np.int32)
    out = _poisoned(q.shape, dt)
    _, lse = fa.flash_attn_with_kvcache(
        cp.asarray(q), cp.asarray(k_cache), cp.asarray(v_cache), cp.asarray(k_new),
        cp.asarray(v_new), cache_seqlens=cp.asarray(seqlens), causal=True, out=out,
        return_softmax_lse=True, **kw)
    for b in range(B):
        n = int(seqlens[b])
        kk = np.concatenate([k_before[b, :n], k_new[b]])
        vv = np.concatenate([v_before[b, :n], v_new[b]])
        ref, ref_lse, naive = ref_and_naive(q[b], kk, vv, causal=True)
        assert_within_bound(out[b], ref, naive, dt, what=f"batch {b}")
        assert_lse_close(lse[b], ref_lse, rtol=2e-3, atol=2e-3)


def test_float32_at_medium_precision_runs_d512():
    """float32 above 256 runs through the 16-bit kernels at precision "medium"."""
    rng = np.random.default_rng(3)
    q, k, v = (randn(rng, (1, 70, 2, 512), np.float32) for _ in range(3))
    prev = fa.get_float32_precision()
    fa.set_float32_precision("medium")
    try:
        out = fa.flash_attn_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=True)
    finally:
        fa.set_float32_precision(prev)
    ref, _, naive = ref_and_naive(q.astype(BF16), k.astype(BF16), v.astype(BF16), causal=True)
    assert_within_bound(out, ref, naive, BF16)
