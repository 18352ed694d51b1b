"""Attention sinks (``sinks=``, FlashInfer's name; gpt-oss's ``s_aux``): a per-query-head logit
that joins every row's softmax denominator with no value vector.  Every entry point, both
backends, against the float64 reference (which takes the softmax over [logits..., sink] itself).
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import errors
from cupy_flashattn.reference import attention_ref

from helpers import cu_seqlens, BF16, assert_within_bound, raises_explained, randn, ref_and_naive, kv_layout, scatter_into_pages, to_np

XPS = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


def _xp(name):
    return np if name == "numpy" else pytest.importorskip("cupy")


def _sinks(rng, H):
    # Around the size of real logits (gpt-oss's s_aux are O(1)), some above every score so the
    # sink holds most of the mass of some rows.
    return rng.uniform(-2.0, 4.0, H).astype(np.float32)


def _lse_close(lse, ref):
    lse = to_np(lse).astype(np.float64)
    np.testing.assert_allclose(lse, ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("xp_name", XPS)
@pytest.mark.parametrize("H,Hk,D,Sq,Sk,causal,window", [
    (8, 2, 64, 97, 97, True, (-1, -1)),      # GQA, causal
    (4, 4, 80, 33, 130, False, (-1, -1)),    # MHA, Sq != Sk
    (6, 1, 40, 40, 17, True, (-1, -1)),      # MQA, Sq > Sk: the first rows see no key
    (8, 4, 128, 64, 300, False, (16, 8)),    # local window
])
def test_dense_sinks_match_the_reference(xp_name, H, Hk, D, Sq, Sk, causal, window):
    xp = _xp(xp_name)
    rng = np.random.default_rng(H * 1000 + Sk)
    dt = BF16
    q, k, v = randn(rng, (2, Sq, H, D), dt), randn(rng, (2, Sk, Hk, D), dt), randn(rng, (2, Sk, Hk, D), dt)
    sinks = _sinks(rng, H)
    ref, ref_lse, naive = ref_and_naive(q, k, v, causal=causal, window_size=window, sinks=sinks)
    out = xp.full(q.shape, np.nan, dtype=dt)
    res, lse = fa.flash_attn_func(xp.asarray(q), xp.asarray(k), xp.asarray(v), causal=causal,
                                  window_size=window, sinks=xp.asarray(sinks),
                                  return_softmax_lse=True, out=out)
    assert_within_bound(res, ref, naive, dt)
    _lse_close(lse, ref_lse)
    # The sink changed the result (the test could not pass without it).
    plain = attention_ref(q, k, v, causal=causal, window_size=window)
    assert np.abs(plain - ref).max() > 10 * np.abs(to_np(res).astype(np.float64) - ref).max()
    if Sq > Sk and causal:  # rows that see no key: out 0, LSE = the sink
        empty = Sq - Sk
        assert (to_np(res)[:, :empty] == 0).all()
        np.testing.assert_allclose(to_np(lse)[:, :, :empty],
                                   np.broadcast_to(sinks[None, :, None], (2, H, empty)), rtol=1e-6)


@pytest.mark.parametrize("xp_name", XPS)
@pytest.mark.parametrize("P", [0, 1, 16, 48])
def test_varlen_and_paged_sinks(xp_name, P):
    xp = _xp(xp_name)
    rng = np.random.default_rng(7 + P)
    dt, H, Hk, D = np.dtype(np.float16), 8, 2, 64
    lens_q, lens_k = [1, 97, 40], [30, 97, 260]
    qs = [randn(rng, (n, H, D), dt) for n in lens_q]
    ks = [randn(rng, (n, Hk, D), dt) for n in lens_k]
    vs = [randn(rng, (n, Hk, D), dt) for n in lens_k]
    sinks = _sinks(rng, H)
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    k, v, table = kv_layout(rng, ks, vs, P, dt)
    kw = {} if table is None else {"block_table": xp.asarray(table)}
    res = fa.flash_attn_varlen_func(
        xp.asarray(np.concatenate(qs)), xp.asarray(k), xp.asarray(v), xp.asarray(cu_q),
        xp.asarray(cu_k), max(lens_q), max(lens_k), causal=True, sinks=xp.asarray(sinks), **kw)
    for b in range(3):
        ref, _, naive = ref_and_naive(qs[b], ks[b], vs[b], causal=True, sinks=sinks)
        assert_within_bound(to_np(res)[cu_q[b]:cu_q[b + 1]], ref, naive, dt, what=f"seq {b}")


@pytest.mark.parametrize("xp_name", XPS)
@pytest.mark.parametrize("paged,splits", [(False, 1), (False, 3), (True, 1), (True, 4)])
def test_kvcache_decode_with_sinks_counts_the_sink_once_across_splits(xp_name, paged, splits):
    """Decode step with append; split-KV partials leave the sink out and the combine adds it
    once (num_splits is honoured by the CUDA backend; NumPy runs the same call unsplit)."""
    xp = _xp(xp_name)
    rng = np.random.default_rng(11 + splits)
    dt, B, H, Hk, D, cap = BF16, 3, 16, 4, 128, 512
    lens = np.array([0, 200, 500], np.int32)
    q = randn(rng, (B, 1, H, D), dt)
    k_new, v_new = randn(rng, (B, 1, Hk, D), dt), randn(rng, (B, 1, Hk, D), dt)
    keys, values = randn(rng, (B, cap, Hk, D), dt), randn(rng, (B, cap, Hk, D), dt)
    sinks = _sinks(rng, H)
    kw = {}
    if paged:
        k_cache, v_cache, table = scatter_into_pages(rng, list(keys), list(values), 16, dt)
        kw["block_table"] = xp.asarray(table)
    else:
        k_cache, v_cache = keys.copy(), values.copy()
    res, lse = fa.flash_attn_with_kvcache(
        xp.asarray(q), xp.asarray(k_cache), xp.asarray(v_cache), xp.asarray(k_new),
        xp.asarray(v_new), cache_seqlens=xp.asarray(lens), num_splits=splits,
        sinks=xp.asarray(sinks), return_softmax_lse=True, **kw)
    for b in range(B):
        n = lens[b]
        kb = np.concatenate([keys[b, :n], k_new[b]])
        vb = np.concatenate([values[b, :n], v_new[b]])
        ref, ref_lse, naive = ref_and_naive(q[b], kb, vb, sinks=sinks)
        assert_within_bound(to_np(res)[b], ref, naive, dt, what=f"seq {b}")
        _lse_close(to_np(lse)[b], ref_lse)


@pytest.mark.parametrize("xp_name", XPS)
def test_paged_kv_cache_and_flash_attention_object_take_sinks(xp_name):
    xp = _xp(xp_name)
    rng = np.random.default_rng(5)
    dt, H, Hk, D = np.dtype(np.float16), 8, 2, 64
    cache = fa.PagedKVCache(num_blocks=16, page_block_size=16, num_heads_k=Hk, head_dim=D,
                            dtype=dt, xp=xp, max_blocks_per_seq=8)
    sid = cache.add_sequence()
    k0, v0 = randn(rng, (1, 37, Hk, D), dt), randn(rng, (1, 37, Hk, D), dt)
    cache.append([sid], xp.asarray(k0), xp.asarray(v0))
    q = randn(rng, (1, 1, H, D), dt)
    sinks = _sinks(rng, H)
    res = fa.flash_attn_with_kvcache(xp.asarray(q), cache, None, sinks=xp.asarray(sinks))
    ref, _, naive = ref_and_naive(q[0], k0[0], v0[0], sinks=sinks)
    assert_within_bound(to_np(res)[0], ref, naive, dt)
    attn = fa.FlashAttention(causal=True, sinks=xp.asarray(sinks))
    qd = randn(rng, (1, 20, H, D), dt)
    kd, vd = randn(rng, (1, 20, Hk, D), dt), randn(rng, (1, 20, Hk, D), dt)
    ref, _, naive = ref_and_naive(qd, kd, vd, causal=True, sinks=sinks)
    assert_within_bound(attn(xp.asarray(qd), xp.asarray(kd), xp.asarray(vd)), ref, naive, dt)


@pytest.mark.parametrize("xp_name", XPS)
def test_merging_a_sink_state_with_a_plain_one_is_exact(xp_name):
    """The documented rule: the sink enters exactly one of the states merged (here the first
    chunk of keys); merge_attention_states then gives attention over all keys with the sink."""
    xp = _xp(xp_name)
    rng = np.random.default_rng(9)
    dt, H, Hk, D, Sq = BF16, 4, 2, 64, 5  # (float32 on the GPU computes with bf16 operands: issue 14)
    q = randn(rng, (1, Sq, H, D), dt)
    k, v = randn(rng, (1, 90, Hk, D), dt), randn(rng, (1, 90, Hk, D), dt)
    sinks = _sinks(rng, H)
    X = xp.asarray
    oa, la = fa.flash_attn_func(X(q), X(k[:, :50]), X(v[:, :50]), sinks=X(sinks), return_softmax_lse=True)
    ob, lb = fa.flash_attn_func(X(q), X(k[:, 50:]), X(v[:, 50:]), return_softmax_lse=True)
    out, lse = fa.merge_attention_states(oa, la, ob, lb)
    ref, ref_lse, naive = ref_and_naive(q, k, v, sinks=sinks)
    assert_within_bound(out, ref, naive, dt, what="merged out")
    _lse_close(lse, ref_lse)
    # Counting the sink in both states is NOT that attention (the documented rule matters).
    ob2, lb2 = fa.flash_attn_func(X(q), X(k[:, 50:]), X(v[:, 50:]), sinks=X(sinks),
                                  return_softmax_lse=True)
    twice, _ = fa.merge_attention_states(oa, la, ob2, lb2)
    assert np.abs(to_np(twice).astype(np.float64) - ref).max() > 3 * np.abs(
        to_np(out).astype(np.float64) - ref).max()


@pytest.mark.parametrize("bad,cls,fragments", [
    (lambda xp: xp.zeros(8, np.float16), errors.DTypeError, ("sinks", "float32")),
    (lambda xp: xp.zeros((1, 8), np.float32), errors.ShapeError, ("sinks", "(8,)")),
    (lambda xp: xp.zeros(4, np.float32), errors.ShapeError, ("sinks", "one logit per query head")),
])
def test_bad_sinks_get_a_typed_error(bad, cls, fragments):
    rng = np.random.default_rng(0)
    q = randn(rng, (1, 4, 8, 32), np.float32)
    with raises_explained(cls, *fragments):
        fa.flash_attn_func(q, q[:, :, :2], q[:, :, :2], sinks=bad(np))


@pytest.mark.parametrize("xp_name", XPS)
def test_no_key_at_all_gives_zero_and_the_sink_as_lse(xp_name):
    """k/v of no row: nothing is launched, and every row is the sink's alone (out 0, LSE sink)."""
    xp = _xp(xp_name)
    rng = np.random.default_rng(4)
    q = xp.asarray(randn(rng, (2, 3, 4, 32), np.float16))
    kv = xp.zeros((2, 0, 2, 32), np.float16)
    sinks = _sinks(rng, 4)
    out, lse = fa.flash_attn_func(q, kv, kv, sinks=xp.asarray(sinks), return_softmax_lse=True)
    assert (to_np(out) == 0).all()
    np.testing.assert_array_equal(to_np(lse), np.broadcast_to(sinks[None, :, None], (2, 4, 3)))
