"""float32 on Hopper through float16 hi / lo planes (cuda_src/f32_split.cu + the sm90 kernel's
float32 instantiation): the routing, the planes themselves, inputs far outside float16's range,
NaN / inf, and replay under a CUDA graph -- each against the float64 reference with the float32
naive bound.  tests/gpu/test_gpu_precise.py's float32 cases run on this path too on a 9.0 device
(dense, varlen, logit features, the 1e-5 accuracy test); these add what only this path can get
wrong.  Outputs are poisoned with NaN."""

import numpy as np
import pytest

import cupy_flashattn as fa
from helpers import (
    assert_lse_close, assert_within_bound, cu_seqlens, randn, ref_and_naive, scaled_float32_case,
)

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

F32 = np.dtype(np.float32)


@pytest.fixture(scope="module", autouse=True)
def hopper():
    from cupy_flashattn import _cuda

    if not _cuda.is_available() or int(cp.cuda.Device().compute_capability) != 90:
        pytest.skip("the float16-plane float32 kernel is sm_90a (a compute capability 9.0 GPU)")
    fa.set_float32_precision("highest")
    yield


def _dev(a):
    return cp.asarray(a)


def _poisoned(shape):
    return cp.full(shape, np.nan, dtype=F32)


def test_float32_routes_to_the_planes_kernel():
    """Dense / varlen D <= 128 on the sm90 float32 kernel; paged and D = 256 on sm80's."""
    from cupy_flashattn._cuda.launch import select_kernel
    from cupy_flashattn.problem import AttentionProblem

    def key(D, paged=False):
        q = cp.zeros((64, 4, D), F32)
        k = cp.zeros((4, 16, 2, D) if paged else (64, 2, D), F32)
        p = AttentionProblem(q=q, k=k, v=k, out=q.copy(), softmax_lse=cp.zeros((4, 64), F32),
                             batch_size=1, seqlen_q=64, seqlen_k=64,
                             max_seqlen_q=64, max_seqlen_k=64,
                             block_table=cp.zeros((1, 4), np.int32) if paged else None,
                             page_block_size=16 if paged else 0, softmax_scale=0.1)
        return select_kernel(p).name

    assert key(128) == "fa_fwd_sm90_f32_d128" and key(40) == "fa_fwd_sm90_f32_d64"
    assert key(128, paged=True) == "fa_fwd_f32_d128_paged" and key(256) == "fa_fwd_f32_d256"


@pytest.mark.parametrize("D", [40, 128])
def test_planes_hold_22_bits_with_a_power_of_two_scale(D):
    """The pre-pass alone: hi + lo = x * scale to 2^-22 (relative to the row's largest value
    for Q, to the head's for K / V), scale a power of two with max |x| scale < 2^14; the
    inverse scales stored."""
    from cupy_flashattn._cuda.f32_planes import F32Planes

    rng = np.random.default_rng(D)
    d8 = -(-D // 8) * 8
    q = randn(rng, (37, 3, d8), F32) * np.exp2(rng.integers(-60, 60, (37, 3, 1))).astype(F32)
    k = randn(rng, (50, 2, d8), F32) * np.float32(1e-9)
    v = randn(rng, (50, 2, d8), F32) * np.float32(3e12)
    ws = F32Planes(_dev(q), _dev(k), _dev(v)).run(_dev(q), _dev(k), _dev(v))
    qr, kvr = ws.q_rscale.get().astype(np.float64), ws.kv_rscale.get().astype(np.float64)
    for rs in (qr, kvr):
        assert (np.frexp(rs)[0] == 0.5).all(), "the scales are powers of two"
    for x, planes, rs in ((q, ws.q_planes, qr[:, :, None]), (k, ws.k_planes, kvr[0][None, :, None]),
                          (v, ws.v_planes, kvr[1][None, :, None])):
        pl = planes.get().astype(np.float64)
        back = (pl[:, :, 0] + pl[:, :, 1]) * rs
        top = np.abs(x).max(axis=2, keepdims=True) if x is q else np.abs(x).max(axis=(0, 2), keepdims=True)
        assert (np.abs(pl[:, :, 0]).max(axis=2) < 2**14).all()
        assert (np.abs(pl[:, :, 0]).max() > 2**12)
        err = np.abs(back - x) / top
        assert err.max() < 2.0**-21, f"hi + lo off by {err.max():.3g} of the largest value"


@pytest.mark.parametrize("q_mag, k_mag, v_mag", [(1e-12, 1e12, 1e-30), (1e15, 1e-15, 1e25), (1.0, 1.0, 1.0)])
@pytest.mark.parametrize("causal", [False, True])
def test_magnitudes_float16_cannot_hold(q_mag, k_mag, v_mag, causal):
    """Values far outside float16's range (the planes carry the scale), rows of Q 2^-20 .. 2^2
    apart (each its own scale) and rows of K 2^-16 .. 1 apart (one scale per head: the small
    rows keep their bits down to 2^-24 of the largest), GQA, D = 80, Sk 1025, Sq 97.  (Rows of
    logits ~1e6 are left out: there float32's own rounding of a logit, ~0.1, already decides the
    winning key, and the bound measures noise.)"""
    q, k, v, scale = scaled_float32_case(q_mag, k_mag, v_mag, causal)
    out = _poisoned(q.shape)
    _, lse = fa.flash_attn_func(_dev(q), _dev(k), _dev(v), causal=causal, softmax_scale=scale,
                                out=out, return_softmax_lse=True)
    ref, ref_lse, naive = ref_and_naive(q, k, v, causal=causal, softmax_scale=scale)
    # The bound's epsilon is for outputs of O(1): measure in units of V's magnitude.
    assert_within_bound(out.get() / v_mag, ref / v_mag, naive / v_mag, F32)
    assert_lse_close(lse.get(), ref_lse, rtol=1e-5, atol=1e-5)


def test_varlen_gqa_windows_and_lengths():
    """Varlen with lengths 1, 97, 0, 1025, local windows and GQA 12/3, D = 128."""
    rng = np.random.default_rng(11)
    H, Hk, D = 12, 3, 128
    lens_q, lens_k = [1, 97, 0, 300], [1025, 97, 5, 1]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = randn(rng, (int(cu_q[-1]), H, D), F32)
    keys = [randn(rng, (n, Hk, D), F32) for n in lens_k]
    values = [randn(rng, (n, Hk, D), F32) for n in lens_k]
    for window in ((-1, -1), (64, 0), (10, 30)):
        out = _poisoned(q.shape)
        fa.flash_attn_varlen_func(_dev(q), _dev(np.concatenate(keys)), _dev(np.concatenate(values)),
                                  cu_seqlens_q=_dev(cu_q), cu_seqlens_k=_dev(cu_k),
                                  max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                                  window_size=window, out=out)
        got = out.get()
        for b in range(4):
            s, e = cu_q[b], cu_q[b + 1]
            if e > s:
                ref, _, naive = ref_and_naive(q[s:e], keys[b], values[b], window_size=window)
                assert_within_bound(got[s:e], ref, naive, F32, what=f"window {window} seq {b}")


def test_nan_and_inf_inputs_come_out_nan():
    """A NaN key makes the rows that see it NaN, and only them (the per-head scale skips it);
    an inf query row gives a NaN row; every other row within the bound."""
    rng = np.random.default_rng(5)
    B, S, H, D = 1, 130, 2, 64
    q, k, v = (randn(rng, (B, S, H, D), F32) for _ in range(3))
    k[0, 100, 0, 3] = np.nan
    q[0, 7, 1, :] = np.inf
    out = fa.flash_attn_func(_dev(q), _dev(k), _dev(v), causal=True).get()
    nan_rows = np.isnan(out).any(axis=-1)  # (B, S, H)
    expect = np.zeros_like(nan_rows)
    expect[0, 100:, 0] = True  # causal: rows >= 100 of head 0 see key 100
    expect[0, 7, 1] = True
    np.testing.assert_array_equal(nan_rows, expect)
    q[0, 7, 1, :] = 0.0
    k[0, 100, 0, 3] = 0.0
    ref, _, naive = ref_and_naive(q, k, v, causal=True)
    keep = ~expect
    assert_within_bound(out[keep], ref[keep], naive[keep], F32)


def test_graph_replay_matches_eager():
    """The pre-pass and the kernel captured once in a CUDA graph, replayed on new values in the
    same arrays: equal to eager calls (the planes are a workspace of the plan, no allocation)."""
    rng = np.random.default_rng(9)
    shapes = ((2, 200, 4, 64), (2, 333, 2, 64), (2, 333, 2, 64))
    q, k, v = (_dev(randn(rng, s, F32)) for s in shapes)
    out = cp.empty(q.shape, F32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fa.flash_attn_func(q, k, v, causal=True, out=out)  # plan, compile, workspace
        stream.synchronize()
        stream.begin_capture()
        fa.flash_attn_func(q, k, v, causal=True, out=out)
        graph = stream.end_capture()
        for seed in (1, 2):
            r = np.random.default_rng(seed)
            for a, s in zip((q, k, v), shapes):
                a[...] = _dev(randn(r, s, F32))
            out[...] = np.nan
            graph.launch(stream)
            stream.synchronize()
            eager = fa.flash_attn_func(q, k, v, causal=True)
            stream.synchronize()
            np.testing.assert_array_equal(out.get(), eager.get())
