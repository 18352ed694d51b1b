"""candle's ``mm_prefix_ranges``: bidirectional key ranges inside a causal mask (image tokens of
a multimodal prompt).  CPU backend against the float64 reference, which applies the rule
independently (the CUDA kernels: tests/gpu/test_gpu_prefix_ranges.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import errors
from cupy_flashattn.reference import attention_ref

from helpers import cu_seqlens, prefix_ranges, BF16, assert_within_bound, raises_explained, randn, ref_and_naive, kv_layout, to_np


@pytest.mark.parametrize("window", [(-1, -1), (8, -1)])
def test_dense_causal_with_ranges_matches_the_reference(window):
    rng = np.random.default_rng(1)
    dt, B, S, H, Hk, D = BF16, 2, 97, 4, 2, 64
    q, k, v = randn(rng, (B, S, H, D), dt), randn(rng, (B, S, Hk, D), dt), randn(rng, (B, S, Hk, D), dt)
    # A range crossing the left window edge, one at the end, one sequence without any.
    ranges = prefix_ranges([[(5, 30), (60, 97)], []])
    ref, _, naive = ref_and_naive(q, k, v, causal=True, window_size=window, mm_prefix_ranges=ranges)
    out = fa.flash_attn_func(q, k, v, causal=True, window_size=window, mm_prefix_ranges=ranges)
    assert_within_bound(out, ref, naive, dt)
    plain = attention_ref(q, k, v, causal=True, window_size=window)
    # Rows inside a range changed (they see later keys), the sequence without ranges did not.
    assert np.abs(plain[0, 5:30] - ref[0, 5:30]).max() > 0.05
    np.testing.assert_array_equal(to_np(out)[1], fa.flash_attn_func(
        q[1:], k[1:], v[1:], causal=True, window_size=window)[0])


@pytest.mark.parametrize("P", [0, 16, 48])
def test_varlen_and_paged_ranges_crossing_pages(P):
    rng = np.random.default_rng(2 + P)
    dt, H, Hk, D = np.dtype(np.float16), 4, 1, 40
    lens = [70, 130]
    qs = [randn(rng, (n, H, D), dt) for n in lens]
    ks = [randn(rng, (n, Hk, D), dt) for n in lens]
    vs = [randn(rng, (n, Hk, D), dt) for n in lens]
    ranges = prefix_ranges([[(10, 40)], [(0, 20), (45, 100)]])  # 45..100 crosses pages of 16 and 48
    cu = cu_seqlens(lens)
    k, v, table = kv_layout(rng, ks, vs, P, dt)
    kw = {} if table is None else {"block_table": table}
    out = fa.flash_attn_varlen_func(np.concatenate(qs), k, v, cu, cu, max(lens), max(lens),
                                    causal=True, mm_prefix_ranges=ranges, **kw)
    for b in range(2):
        ref, _, naive = ref_and_naive(qs[b], ks[b], vs[b], causal=True, mm_prefix_ranges=ranges[b])
        assert_within_bound(out[cu[b]:cu[b + 1]], ref, naive, dt, what=f"seq {b}")


def test_decode_step_inside_a_range():
    """A decode query whose position lies in a range (a range reaching past the cache end)."""
    rng = np.random.default_rng(3)
    dt, B, H, Hk, D, cap = np.dtype(np.float32), 2, 4, 2, 64, 64
    lens = np.array([20, 50], np.int32)
    kc, vc = randn(rng, (B, cap, Hk, D), dt), randn(rng, (B, cap, Hk, D), dt)
    q = randn(rng, (B, 1, H, D), dt)
    ranges = prefix_ranges([[(15, 30)], [(0, 10)]])
    out = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                     mm_prefix_ranges=ranges)
    for b in range(B):
        n = int(lens[b])
        ref = attention_ref(q[b], kc[b, :n], vc[b, :n], causal=True, mm_prefix_ranges=ranges[b])
        np.testing.assert_allclose(out[b], ref, atol=2e-5)


@pytest.mark.parametrize("bad,cls,fragments", [
    (np.zeros((2, 1, 2), np.int64), errors.DTypeError, ("mm_prefix_ranges", "int32")),
    (np.zeros((2, 2), np.int32), errors.ShapeError, ("mm_prefix_ranges", "(B=2, max_ranges, 2)")),
    (np.array([[[-3, 4]], [[0, 0]]], np.int32), errors.SeqlenError, ("mm_prefix_ranges", "start >= 0")),
    (np.array([[[10, 20], [15, 30]], [[0, 0], [0, 0]]], np.int32), errors.ArgumentError,
     ("mm_prefix_ranges", "overlap or are unsorted")),
])
def test_bad_ranges_get_a_typed_error(bad, cls, fragments):
    rng = np.random.default_rng(0)
    q = randn(rng, (2, 8, 2, 16), np.float32)
    with raises_explained(cls, *fragments):
        fa.flash_attn_func(q, q, q, causal=True, mm_prefix_ranges=bad)


def test_ranges_whose_pairs_are_not_contiguous_get_a_layout_error():
    q = randn(np.random.default_rng(0), (2, 8, 2, 16), np.float32)
    strided = np.zeros((2, 2, 4), np.int32)[..., ::2]
    with raises_explained(errors.LayoutError, "mm_prefix_ranges", "ascontiguousarray"):
        fa.flash_attn_func(q, q, q, causal=True, mm_prefix_ranges=strided)
