"""Head dims 257..512 (candle's paged limit): every entry point on the CPU backend against the
float64 reference (the CUDA V-split kernels: tests/gpu/test_gpu_large_head_dims.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import errors

from helpers import cu_seqlens, BF16, assert_within_bound, raises_explained, randn, ref_and_naive, scatter_into_pages


@pytest.mark.parametrize("D", [264, 320, 384, 448, 512])
def test_dense_causal_large_head_dims(D):
    rng = np.random.default_rng(D)
    q, k, v = randn(rng, (1, 33, 4, D), BF16), randn(rng, (1, 40, 2, D), BF16), randn(rng, (1, 40, 2, D), BF16)
    ref, _, naive = ref_and_naive(q, k, v, causal=True)
    assert_within_bound(fa.flash_attn_func(q, k, v, causal=True), ref, naive, BF16)


@pytest.mark.parametrize("D,P", [(512, 16), (384, 48)])
def test_paged_varlen_and_kv_cache_large_head_dims(D, P):
    rng = np.random.default_rng(D + P)
    dt, H, Hk = np.dtype(np.float16), 4, 1
    lens = [20, 75]
    qs = [randn(rng, (n, H, D), dt) for n in lens]
    ks = [randn(rng, (n, Hk, D), dt) for n in lens]
    vs = [randn(rng, (n, Hk, D), dt) for n in lens]
    k, v, table = scatter_into_pages(rng, ks, vs, P, dt)
    cu = cu_seqlens(lens)
    out = fa.flash_attn_varlen_func(np.concatenate(qs), k, v, cu, cu, max(lens), max(lens),
                                    causal=True, block_table=table)
    for b in range(2):
        ref, _, naive = ref_and_naive(qs[b], ks[b], vs[b], causal=True)
        assert_within_bound(out[cu[b]:cu[b + 1]], ref, naive, dt, what=f"seq {b}")
    # A PagedKVCache of that head dim, one decode step with append.
    cache = fa.PagedKVCache(8, P, Hk, D, dt)
    sid = cache.add_sequence()
    cache.append([sid], ks[1][None], vs[1][None])
    q1 = randn(rng, (1, 1, H, D), dt)
    kn, vn = randn(rng, (1, 1, Hk, D), dt), randn(rng, (1, 1, Hk, D), dt)
    res = fa.flash_attn_with_kvcache(q1, cache, None, k=kn, v=vn, causal=True)
    ref, _, naive = ref_and_naive(q1[0], np.concatenate([ks[1], kn[0]]), np.concatenate([vs[1], vn[0]]))
    assert_within_bound(res[0], ref, naive, dt)


@pytest.mark.gpu
def test_float32_above_256_at_float32_accuracy_gets_a_typed_error_with_the_fix():
    """The float32-accuracy kernels stop at 256; the error names the precision that runs it."""
    cp = pytest.importorskip("cupy")
    q = cp.zeros((1, 4, 2, 320), np.float32)
    with raises_explained(errors.UnsupportedError, "q", "320", "set_float32_precision"):
        fa.flash_attn_func(q, q, q)
    with raises_explained(errors.UnsupportedError, "head_dim", "float64", "128"):
        fa.PagedKVCache(4, 16, 2, 200, np.float64, xp=cp)
