"""Mixed batches (chunked prefill next to decode steps in one varlen call over a paged cache):
the decode kernel serves the short sequences, the prefill kernel the long ones, each skipping
the other's on the device.  Every row is checked against the float64 reference, with outputs
poisoned so a row neither kernel wrote fails."""

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import _cuda
from helpers import cu_seqlens, BF16, assert_lse_close, assert_within_bound, randn, ref_and_naive, scatter_into_pages

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


@pytest.mark.parametrize("H,Hk", [(32, 8), (16, 16), (12, 1)])
@pytest.mark.parametrize("P", [16, 48])
@pytest.mark.parametrize("causal", [False, True])
def test_mixed_prefill_and_decode(H, Hk, P, causal):
    rng = np.random.default_rng(H * 7 + P + causal)
    dtype, D = BF16, 128
    limit = _cuda.decode_len_q_limit(H, Hk)
    # decode steps (1 token), a short chunk right at the threshold, long prefill chunks, empty
    lens_q = [1, 300, 1, limit, limit + 1, 0, 97, 1]
    lens_k = [700, 300, 33, 64 + limit, 500, 9, 1025, 1]
    B = len(lens_q)
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    q = randn(rng, (int(cu_q[-1]), H, D), dtype)
    keys = [randn(rng, (n, Hk, D), dtype) for n in lens_k]
    values = [randn(rng, (n, Hk, D), dtype) for n in lens_k]
    k_pages, v_pages, table = scatter_into_pages(rng, keys, values, P, dtype, spare_blocks=3)
    problem_out = cp.full(q.shape, np.nan, dtype=dtype)
    _, lse = fa.flash_attn_varlen_func(
        cp.asarray(q), cp.asarray(k_pages), cp.asarray(v_pages), cp.asarray(cu_q), cp.asarray(cu_k),
        max(lens_q), max(lens_k), causal=causal, block_table=cp.asarray(table), out=problem_out,
        return_softmax_lse=True,
    )
    got, got_lse = problem_out.get(), lse.get()
    for b in range(B):
        s, e = cu_q[b], cu_q[b + 1]
        if e == s:
            continue
        ref, ref_lse, naive = ref_and_naive(q[s:e], keys[b], values[b], causal=causal)
        assert_within_bound(got[s:e], ref, naive, dtype, what=f"seq {b} (len_q {lens_q[b]})")
        assert_lse_close(got_lse[:, s:e], ref_lse, rtol=2e-3, atol=2e-3)
