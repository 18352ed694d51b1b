"""candle's ``mm_prefix_ranges`` on the CUDA kernels (window.cuh's PrefixRanges), through the
public functions, against the float64 reference (which applies the rule on its own,
reference.py) with flash-attn's bound; outputs poisoned with NaN through ``out=``.

Every kernel family that masks: sm80 and sm90 prefill (forced), the float32 / float64 precise
prefill, split-KV decode.  Ranges cross the left window edge, tile edges (the sm80 tile is 128
rows x 64 keys at D=64, sm90's 128 x 128), page boundaries, the cache end, and sit in the decode
step itself.  Marked ``gpu``."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import errors
from helpers import (
    BF16, prefix_ranges, assert_within_bound, cu_seqlens, kv_layout, randn, ref_and_naive,
    raises_explained, scatter_into_pages,
)

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


@pytest.fixture(params=["sm80", "sm90"])
def prefill_arch(request):
    from cupy_flashattn._cuda import is_available
    from cupy_flashattn._cuda.launch import force_prefill_arch

    if not is_available():
        pytest.skip("no sm_80+ GPU")
    if request.param == "sm90" and int(cp.cuda.Device().compute_capability) != 90:
        pytest.skip("the sm_90a kernels need a compute capability 9.0 GPU")
    force_prefill_arch(request.param)
    yield request.param
    force_prefill_arch(None)


def _poisoned(shape, dtype):
    return cp.full(shape, np.nan, dtype=dtype)


# Sequence 0: a range crossing the left edge of an 8-key window and the 64-key tile edge, one
# ending exactly on a 128-row tile edge, one running to the last key; sequence 1: none.
DENSE_SPANS = [[(5, 70), (100, 128), (900, 1025)], []]


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("window", [(-1, -1), (8, -1), (40, 3)])
@pytest.mark.parametrize("D", [64, 80])
def test_dense_prefill(prefill_arch, dtype, window, D):
    rng = np.random.default_rng(D + window[0])
    B, S, H, Hk = 2, 1025, 4, 2
    q, k, v = randn(rng, (B, S, H, D), dtype), randn(rng, (B, S, Hk, D), dtype), randn(rng, (B, S, Hk, D), dtype)
    ranges = prefix_ranges(DENSE_SPANS)
    out = _poisoned(q.shape, dtype)
    fa.flash_attn_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=True,
                       window_size=window, mm_prefix_ranges=cp.asarray(ranges), out=out)
    ref, _, naive = ref_and_naive(q, k, v, causal=True, window_size=window, mm_prefix_ranges=ranges)
    assert_within_bound(out, ref, naive, dtype)
    plain = ref_and_naive(q[:1], k[:1], v[:1], causal=True, window_size=window)[0]
    assert np.abs(plain[0, 5:70] - ref[0, 5:70]).max() > 0.05  # the ranges changed those rows


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
def test_precise_prefill(dtype):
    """float32 / float64 run the precise kernels (sm80/flash_fwd_precise.cu) at their own
    precision: the ranges must hold there too, to that precision's bound."""
    from cupy_flashattn._cuda import is_available

    if not is_available():
        pytest.skip("no sm_80+ GPU")
    rng = np.random.default_rng(11)
    B, S, H, D = 2, 300, 2, 64
    q, k, v = (randn(rng, (B, S, H, D), dtype) for _ in range(3))
    ranges = prefix_ranges([[(0, 37), (150, 290)], [(64, 65), (200, 300)]])
    out = _poisoned(q.shape, dtype)
    fa.flash_attn_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=True,
                       mm_prefix_ranges=cp.asarray(ranges), out=out)
    ref, _, naive = ref_and_naive(q, k, v, causal=True, mm_prefix_ranges=ranges)
    assert_within_bound(out, ref, naive, dtype)


@pytest.mark.parametrize("P", [0, 1, 16, 48, 256])
def test_varlen_and_paged_ranges_crossing_pages(prefill_arch, P):
    rng = np.random.default_rng(2 + P)
    dt, H, Hk, D = BF16, 8, 1, 128  # MQA
    lens = [97, 1025, 1, 300]
    qs = [randn(rng, (n, H, D), dt) for n in lens]
    ks = [randn(rng, (n, Hk, D), dt) for n in lens]
    vs = [randn(rng, (n, Hk, D), dt) for n in lens]
    # 45..100 crosses pages of 16 and 48; 255..530 crosses a 256 page; (0, 1) is a 1-token range.
    ranges = prefix_ranges([[(10, 40), (45, 97)], [(0, 20), (255, 530)], [(0, 1)], []])
    cu = cu_seqlens(lens)
    k, v, table = kv_layout(rng, ks, vs, P, dt)
    kw = {} if table is None else {"block_table": cp.asarray(table)}
    cu_k = cp.asarray(cu)
    q = np.concatenate(qs)
    out = _poisoned(q.shape, dt)
    fa.flash_attn_varlen_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), cp.asarray(cu), cu_k,
                              max(lens), max(lens), causal=True, mm_prefix_ranges=cp.asarray(ranges),
                              out=out, **kw)
    for b in range(len(lens)):
        ref, _, naive = ref_and_naive(qs[b], ks[b], vs[b], causal=True, mm_prefix_ranges=ranges[b])
        assert_within_bound(out[int(cu[b]):int(cu[b + 1])], ref, naive, dt, what=f"seq {b}")


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("Sq", [1, 3])
@pytest.mark.parametrize("cap", [64, 4096])  # 4096: split-KV (several CTAs per row, combined)
def test_decode_steps_insideprefix_ranges(paged, Sq, cap):
    """Decode kernels (with_kvcache, a few new tokens appended): queries whose positions lie in
    a range see its later keys; a range reaching past the cache end is clipped."""
    from cupy_flashattn._cuda import is_available

    if not is_available():
        pytest.skip("no sm_80+ GPU")
    rng = np.random.default_rng(3 + paged + 10 * Sq + cap)
    dt, B, H, Hk, D = np.dtype(np.float16), 3, 8, 2, 128
    lens = np.array([20, cap - 8, cap // 2], np.int32)  # before the append of Sq tokens
    kc, vc = randn(rng, (B, cap, Hk, D), dt), randn(rng, (B, cap, Hk, D), dt)
    knew, vnew = randn(rng, (B, Sq, Hk, D), dt), randn(rng, (B, Sq, Hk, D), dt)
    q = randn(rng, (B, Sq, H, D), dt)
    # seq 0: the new tokens sit inside (15, 40), which runs past the cache end; seq 1: a range
    # before the queries (causal rows see it anyway); seq 2: a range around the step.
    mid = int(lens[2])
    ranges = prefix_ranges([[(15, 40)], [(0, 10)], [(mid - 5, mid + Sq + 7)]])
    full = [np.concatenate([kc[b, :lens[b]], knew[b]]) for b in range(B)]
    fullv = [np.concatenate([vc[b, :lens[b]], vnew[b]]) for b in range(B)]
    kw = {}
    if paged:
        P = 16
        kp, vp, table = scatter_into_pages(rng, [kc[b] for b in range(B)], [vc[b] for b in range(B)], P, dt)
        k_cache, v_cache = cp.asarray(kp), cp.asarray(vp)
        kw["block_table"] = cp.asarray(table)
    else:
        k_cache, v_cache = cp.asarray(kc), cp.asarray(vc)
    out = _poisoned(q.shape, dt)
    fa.flash_attn_with_kvcache(cp.asarray(q), k_cache, v_cache, k=cp.asarray(knew), v=cp.asarray(vnew),
                               cache_seqlens=cp.asarray(lens), causal=True,
                               mm_prefix_ranges=cp.asarray(ranges), out=out, **kw)
    for b in range(B):
        ref, _, naive = ref_and_naive(q[b], full[b], fullv[b], causal=True, mm_prefix_ranges=ranges[b])
        assert_within_bound(out[b], ref, naive, dt, what=f"seq {b}")


def test_unused_ranges_change_nothing(prefill_arch):
    """Ranges that are all unused (start >= end) leave every bit of the output as without them."""
    rng = np.random.default_rng(5)
    B, S, H, D = 2, 513, 4, 128
    q, k, v = (cp.asarray(randn(rng, (B, S, H, D), BF16)) for _ in range(3))
    unused = cp.asarray(np.array([[[9, 9], [30, 4]], [[0, 0], [7, 1]]], np.int32))
    a = fa.flash_attn_func(q, k, v, causal=True, mm_prefix_ranges=unused)
    b = fa.flash_attn_func(q, k, v, causal=True)
    assert (a.view(np.uint16) == b.view(np.uint16)).all()


def test_gpu_errors_are_typed():
    from cupy_flashattn._cuda import is_available

    if not is_available():
        pytest.skip("no sm_80+ GPU")
    q = cp.asarray(randn(np.random.default_rng(0), (2, 8, 2, 16), np.float16))
    with raises_explained(errors.DTypeError, "mm_prefix_ranges", "int32"):
        fa.flash_attn_func(q, q, q, causal=True, mm_prefix_ranges=cp.zeros((2, 1, 2), np.int64))
    strided = cp.zeros((2, 2, 4), np.int32)[..., ::2]  # pairs not contiguous
    with raises_explained(errors.LayoutError, "mm_prefix_ranges", "ascontiguousarray"):
        fa.flash_attn_func(q, q, q, causal=True, mm_prefix_ranges=strided)
    overlapping = cp.asarray(np.array([[[0, 5], [3, 8]], [[0, 0], [0, 0]]], np.int32))
    with raises_explained(errors.ArgumentError, "mm_prefix_ranges", "overlap"):
        fa.flash_attn_func(q, q, q, causal=True, mm_prefix_ranges=overlapping, check=True)
