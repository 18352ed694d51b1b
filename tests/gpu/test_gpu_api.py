"""The public functions on CuPy arrays (CUDA backend) against the float64 reference, with
flash-attn's bound; outputs poisoned with NaN through ``out=``.  Marked ``gpu``: skipped without
a usable CUDA device."""

import numpy as np
import pytest

import cupy_flashattn as fa
from helpers import (
    BF16, assert_lse_close, assert_within_bound, cu_seqlens, filled_paged_cache, randn,
    ref_and_naive, rotary_ref, scatter_into_pages,
)

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

GPU_DTYPES = [np.dtype(np.float16), BF16]


def _dev(a):
    return cp.asarray(a)


def _poisoned(shape, dtype):
    return cp.full(shape, np.nan, dtype=dtype)


@pytest.mark.parametrize("dtype", GPU_DTYPES + [np.dtype(np.float32)], ids=str)
@pytest.mark.parametrize("D", [59, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_api(dtype, D, causal):
    rng = np.random.default_rng(D + causal)
    B, Sq, Sk, H, Hk = 2, 113, 203, 8, 2
    q, k, v = randn(rng, (B, Sq, H, D), dtype), randn(rng, (B, Sk, Hk, D), dtype), randn(rng, (B, Sk, Hk, D), dtype)
    out = _poisoned(q.shape, dtype)
    res, lse = fa.flash_attn_func(_dev(q), _dev(k), _dev(v), causal=causal, out=out, return_softmax_lse=True)
    assert isinstance(res, cp.ndarray) and lse.shape == (B, H, Sq)
    ref, ref_lse, naive = ref_and_naive(q, k, v, causal=causal)
    if dtype == np.float32:  # computed through 16-bit operands: bound by the bf16 naive error
        naive = ref_and_naive(q.astype(BF16), k.astype(BF16), v.astype(BF16), causal=causal)[2]
        dtype = BF16
    assert_within_bound(out, ref, naive, dtype)
    assert_lse_close(lse, ref_lse, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("P", [1, 16, 48, 256])
def test_paged_varlen_api(P):
    rng = np.random.default_rng(P)
    dtype, H, Hk, D = BF16, 12, 2, 128
    lens_q, lens_k = [1, 97, 0, 33], [1025, 97, 5, 0]
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    q = randn(rng, (int(cu_q[-1]), H, D), dtype)
    keys = [randn(rng, (n, Hk, D), dtype) for n in lens_k]
    values = [randn(rng, (n, Hk, D), dtype) for n in lens_k]
    k_pages, v_pages, table = scatter_into_pages(rng, keys, values, P, dtype, spare_blocks=2,
                                                 min_pages=1)
    for causal in (False, True):
        out = _poisoned(q.shape, dtype)
        _, lse = fa.flash_attn_varlen_func(
            _dev(q), _dev(k_pages), _dev(v_pages), _dev(cu_q), _dev(cu_k), max(lens_q), max(lens_k),
            causal=causal, block_table=_dev(table), out=out, return_softmax_lse=True, check=True,
        )
        got, got_lse = out.get(), lse.get()
        for b in range(4):
            s, e = cu_q[b], cu_q[b + 1]
            if e == s:
                continue
            ref, ref_lse, naive = ref_and_naive(q[s:e], keys[b], values[b], causal=causal)
            assert_within_bound(got[s:e], ref, naive, dtype, what=f"P={P} seq {b}")
            assert_lse_close(got_lse[:, s:e], ref_lse, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, (1.0, True), (0.5, False)])
def test_kvcache_api(paged, rotary):
    rng = np.random.default_rng(3)
    dtype, B, H, Hk, D, S_cache, S_new = np.dtype(np.float16), 3, 32, 8, 128, 512, 2
    q = randn(rng, (B, S_new, H, D), dtype)
    k_new, v_new = randn(rng, (B, S_new, Hk, D), dtype), randn(rng, (B, S_new, Hk, D), dtype)
    seqlens = np.array([0, 250, 510], np.int32)
    k_before, v_before = randn(rng, (B, S_cache, Hk, D), dtype), randn(rng, (B, S_cache, Hk, D), dtype)
    kw = dict(causal=True)
    if rotary is not None:
        frac, interleaved = rotary
        angles = rng.uniform(0, 2 * np.pi, (S_cache, int(D * frac) // 2))
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        kw.update(rotary_cos=_dev(cos), rotary_sin=_dev(sin), rotary_interleaved=interleaved)
    P = 16
    if paged:
        table = rng.permutation(B * S_cache // P).astype(np.int32).reshape(B, S_cache // P)
        k_cache = np.empty((B * S_cache // P, P, Hk, D), dtype)
        v_cache = np.empty_like(k_cache)
        for b in range(B):
            k_cache[table[b]] = k_before[b].reshape(-1, P, Hk, D)
            v_cache[table[b]] = v_before[b].reshape(-1, P, Hk, D)
        kw.update(block_table=_dev(table))
    else:
        k_cache, v_cache = k_before.copy(), v_before.copy()
    kc, vc = _dev(k_cache), _dev(v_cache)
    out = fa.flash_attn_with_kvcache(_dev(q), kc, vc, _dev(k_new), _dev(v_new), cache_seqlens=_dev(seqlens), **kw).get()
    kc, vc = kc.get(), vc.get()
    for b in range(B):
        n = seqlens[b] + S_new
        k_exp = k_new[b].astype(np.float64)
        q_b = q[b]
        if rotary is not None:
            k_exp = rotary_ref(k_new[b], cos, sin, seqlens[b] + np.arange(S_new), interleaved)
            q_b = rotary_ref(q[b], cos, sin, seqlens[b] + np.arange(S_new), interleaved).astype(dtype)
        pos = np.arange(n)
        got_k = kc[table[b, pos // P], pos % P] if paged else kc[b, :n]
        got_v = vc[table[b, pos // P], pos % P] if paged else vc[b, :n]
        exp_k = np.concatenate([k_before[b, : seqlens[b]], k_exp.astype(dtype)])
        exp_v = np.concatenate([v_before[b, : seqlens[b]], v_new[b]])
        np.testing.assert_allclose(got_k.astype(np.float32), exp_k.astype(np.float32), rtol=2e-3, atol=2e-3)
        np.testing.assert_array_equal(got_v, exp_v)
        ref, _, naive = ref_and_naive(q_b, exp_k, exp_v, causal=True)
        assert_within_bound(out[b], ref, naive, dtype, what=f"batch {b}")


@pytest.mark.parametrize("D", [64, 512])  # 512: the V-split decode kernel (candle's paged limit)
def test_paged_cache_object_on_gpu(D):
    rng = np.random.default_rng(9)
    dtype, H, Hk, P = BF16, 8, 2, 16
    cache, ids, ks, vs = filled_paged_cache(rng, [40, 3], 16, P, Hk, D, dtype, cp)
    q = randn(rng, (2, 1, H, D), dtype)
    kn, vn = randn(rng, (2, 1, Hk, D), dtype), randn(rng, (2, 1, Hk, D), dtype)
    out = fa.flash_attn_with_kvcache(_dev(q), cache, None, _dev(kn), _dev(vn), seq_ids=ids, causal=True).get()
    for j in range(2):
        kk = np.concatenate([ks[j], kn[j]])
        vv = np.concatenate([vs[j], vn[j]])
        ref, _, naive = ref_and_naive(q[j], kk, vv, causal=True)
        assert_within_bound(out[j], ref, naive, dtype)


def test_mixed_libraries_rejected():
    q = cp.zeros((1, 2, 2, 8), np.float16)
    k = np.zeros((1, 2, 2, 8), np.float16)
    with pytest.raises(fa.DeviceError, match="mixes array libraries"):
        fa.flash_attn_func(q, k, k)


def test_check_true_catches_bad_block_id_on_gpu():
    k = cp.asarray(np.random.default_rng(0).standard_normal((4, 16, 2, 64)).astype(np.float16))
    q = cp.asarray(np.random.default_rng(1).standard_normal((3, 2, 64)).astype(np.float16))
    table = cp.asarray(np.array([[0, 7]], np.int32))
    cu_q, cu_k = cp.asarray(np.array([0, 3], np.int32)), cp.asarray(np.array([0, 20], np.int32))
    with pytest.raises(fa.BlockTableError, match="entry \\[0, 1\\]"):
        fa.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 20, block_table=table, check=True)


def test_bad_block_id_without_check_never_faults():
    """Without check=True the bad id is not seen on the host; the kernel must treat it as absent
    instead of reading outside the pool (compute-sanitizer runs this file's small cases)."""
    rng = np.random.default_rng(2)
    k = cp.asarray(randn(rng, (4, 16, 2, 64), np.float16))
    q = cp.asarray(randn(rng, (3, 2, 64), np.float16))
    table = cp.asarray(np.array([[0, 1_000_000]], np.int32))
    cu_q, cu_k = cp.asarray(np.array([0, 3], np.int32)), cp.asarray(np.array([0, 20], np.int32))
    out = fa.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 20, block_table=table, check=False)
    cp.cuda.runtime.deviceSynchronize()
    assert out.shape == q.shape


def test_dlpack_torch_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    q = torch.randn(1, 16, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 16, 4, 64, device="cuda", dtype=torch.float16)
    out = fa.flash_attn_func(q, k, k, causal=True)
    assert isinstance(out, cp.ndarray)
    ref, _, naive = ref_and_naive(q.cpu().numpy(), k.cpu().numpy(), k.cpu().numpy(), causal=True)
    assert_within_bound(out, ref, naive, np.float16)
