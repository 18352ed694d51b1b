"""The public functions on NumPy inputs (CPU backend) against the float64 reference, with
flash-attn's bound.  Outputs are poisoned with NaN before each call (through ``out=``)."""

import numpy as np
import pytest

import cupy_flashattn as fa
from helpers import cu_seqlens, BF16, DTYPES, assert_lse_close, assert_within_bound, randn, ref_and_naive, rotary_ref


def _poisoned(shape, dtype):
    return np.full(shape, np.nan, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [40, 59, 80])
@pytest.mark.parametrize("Sq,Sk", [(1, 97), (97, 1), (113, 203), (203, 113)])
@pytest.mark.parametrize("causal", [False, True])
def test_dense(dtype, D, Sq, Sk, causal):
    rng = np.random.default_rng(hash((str(dtype), D, Sq, Sk, causal)) % 2**32)
    B, H, Hk = 2, 6, 2
    q, k, v = randn(rng, (B, Sq, H, D), dtype), randn(rng, (B, Sk, Hk, D), dtype), randn(rng, (B, Sk, Hk, D), dtype)
    out = _poisoned(q.shape, dtype)
    res, lse = fa.flash_attn_func(q, k, v, causal=causal, out=out, return_softmax_lse=True)
    # float32 LSE (flash-attn's) for every dtype but float64, whose LSE is float64.
    lse_dtype = np.float64 if dtype == np.float64 else np.float32
    assert res is out and lse.shape == (B, H, Sq) and lse.dtype == lse_dtype
    ref, ref_lse, naive = ref_and_naive(q, k, v, causal=causal)
    assert_within_bound(out, ref, naive, dtype)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize(
    "opts",
    [dict(window_size=(17, 3)), dict(window_size=(-1, 5)), dict(softcap=5.0), dict(alibi=True),
     dict(causal=True, alibi=True, softcap=3.0), dict(softmax_scale=0.05)],
    ids=str,
)
@pytest.mark.parametrize("ratio", [1, 4, 7])
def test_dense_features(opts, ratio):
    rng = np.random.default_rng(7)
    opts = dict(opts)
    B, Sq, Sk, Hk, D = 2, 97, 131, 1, 64
    H = Hk * ratio
    dtype = np.dtype(np.float16)
    q, k, v = randn(rng, (B, Sq, H, D), dtype), randn(rng, (B, Sk, Hk, D), dtype), randn(rng, (B, Sk, Hk, D), dtype)
    if opts.pop("alibi", False):
        opts["alibi_slopes"] = rng.uniform(0.01, 0.3, (B, H)).astype(np.float32)
    out, lse = fa.flash_attn_func(q, k, v, return_softmax_lse=True, **opts)
    ref, ref_lse, naive = ref_and_naive(q, k, v, **opts)
    assert_within_bound(out, ref, naive, dtype)
    assert_lse_close(lse, ref_lse)


def test_fully_masked_rows_give_zero_and_inf_lse():
    """Sq > Sk with causal: the first Sq - Sk queries see no key (bottom-right alignment)."""
    rng = np.random.default_rng(1)
    q, k, v = randn(rng, (1, 9, 2, 16), np.float32), randn(rng, (1, 4, 2, 16), np.float32), randn(rng, (1, 4, 2, 16), np.float32)
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_softmax_lse=True)
    assert (out[0, :5] == 0).all() and np.isinf(lse[0, :, :5]).all() and (lse[0, :, :5] > 0).all()
    assert np.isfinite(lse[0, :, 5:]).all()


def _varlen_batch(rng, lens_q, lens_k, H, Hk, D, dtype):
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    q = randn(rng, (int(cu_q[-1]), H, D), dtype)
    k = randn(rng, (int(cu_k[-1]), Hk, D), dtype)
    v = randn(rng, (int(cu_k[-1]), Hk, D), dtype)
    return q, k, v, cu_q, cu_k


def _check_varlen(out, lse, q, keys, values, cu_q, dtype, **kw):
    """keys[b], values[b]: each sequence's logical keys, gathered independently of the backend."""
    for b in range(len(cu_q) - 1):
        s, e = cu_q[b], cu_q[b + 1]
        if e == s:
            continue
        ref, ref_lse, naive = ref_and_naive(q[s:e], keys[b], values[b],
                                            alibi_slopes=None if kw.get("alibi_slopes") is None else kw["alibi_slopes"][b],
                                            **{k: v for k, v in kw.items() if k != "alibi_slopes"})
        assert_within_bound(out[s:e], ref, naive, dtype, what=f"sequence {b}")
        assert_lse_close(lse[:, s:e], ref_lse)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16, np.dtype(np.float32)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_mixed_lengths(dtype, causal):
    rng = np.random.default_rng(3)
    lens_q, lens_k = [1, 0, 97, 33, 5], [97, 4, 1025, 0, 5]
    q, k, v, cu_q, cu_k = _varlen_batch(rng, lens_q, lens_k, 8, 2, 80, dtype)
    out = _poisoned(q.shape, dtype)
    res, lse = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         return_softmax_lse=True, out=out)
    assert lse.shape == (8, q.shape[0])
    keys = [k[cu_k[b]:cu_k[b + 1]] for b in range(5)]
    values = [v[cu_k[b]:cu_k[b + 1]] for b in range(5)]
    _check_varlen(out, lse, q, keys, values, cu_q, dtype, causal=causal)


def _scatter_into_pages(rng, keys, values, P, Hk, D, dtype, extra_blocks=3):
    """Write each sequence's keys into randomly permuted pages; returns (k_pages, v_pages, table)."""
    pages_per_seq = [max(1, -(-len(kb) // P)) for kb in keys]
    num_blocks = sum(pages_per_seq) + extra_blocks
    perm = rng.permutation(num_blocks).astype(np.int32)
    k_pages = randn(rng, (num_blocks, P, Hk, D), dtype)  # garbage everywhere else: never zeros
    v_pages = randn(rng, (num_blocks, P, Hk, D), dtype)
    table = np.full((len(keys), max(pages_per_seq) + 1), -1, dtype=np.int32)  # -1: unused entries
    nxt = 0
    for b, (kb, vb) in enumerate(zip(keys, values)):
        for i in range(pages_per_seq[b]):
            table[b, i] = perm[nxt]
            nxt += 1
        for p in range(len(kb)):
            k_pages[table[b, p // P], p % P] = kb[p]
            v_pages[table[b, p // P], p % P] = vb[p]
    return k_pages, v_pages, table


@pytest.mark.parametrize("P", [1, 16, 48, 256])
@pytest.mark.parametrize("ratio", [1, 6])
def test_paged_varlen(P, ratio):
    rng = np.random.default_rng(P * 10 + ratio)
    dtype, Hk, D = np.dtype(np.float16), 1, 59
    H = Hk * ratio
    lens_q, lens_k = [3, 97, 1, 0], [50, 300, 1, 7]
    q, k, v, cu_q, cu_k = _varlen_batch(rng, lens_q, lens_k, H, Hk, D, dtype)
    keys = [k[cu_k[b]:cu_k[b + 1]] for b in range(4)]
    values = [v[cu_k[b]:cu_k[b + 1]] for b in range(4)]
    k_pages, v_pages, table = _scatter_into_pages(rng, keys, values, P, Hk, D, dtype)
    for causal in (False, True):
        out = _poisoned(q.shape, dtype)
        res, lse = fa.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lens_q), max(lens_k),
                                             causal=causal, block_table=table, return_softmax_lse=True, out=out)
        _check_varlen(out, lse, q, keys, values, cu_q, dtype, causal=causal)


def test_seqused_k():
    rng = np.random.default_rng(5)
    dtype = np.dtype(np.float32)
    q, k, v, cu_q, cu_k = _varlen_batch(rng, [4, 6], [20, 30], 4, 4, 32, dtype)
    used = np.array([11, 30], np.int32)
    out, lse = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 30, seqused_k=used, return_softmax_lse=True)
    keys = [k[0:11], k[20:50]]
    values = [v[0:11], v[20:50]]
    _check_varlen(out, lse, q, keys, values, cu_q, dtype)


# -- flash_attn_with_kvcache -------------------------------------------------------------------


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, (1.0, True), (0.5, False)])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_append_rotary(paged, rotary, causal):
    rng = np.random.default_rng(11)
    dtype, B, H, Hk, D, S_cache, S_new = np.dtype(np.float32), 3, 8, 2, 64, 96, 3
    Sq = S_new
    q = randn(rng, (B, Sq, H, D), dtype)
    k_new, v_new = randn(rng, (B, S_new, Hk, D), dtype), randn(rng, (B, S_new, Hk, D), dtype)
    seqlens = np.array([0, 17, 93], np.int32)
    keys_before = randn(rng, (B, S_cache, Hk, D), dtype)
    values_before = randn(rng, (B, S_cache, Hk, D), dtype)
    kw = dict(causal=causal)
    cos = sin = None
    if rotary is not None:
        frac, interleaved = rotary
        rd = int(D * frac)
        # A row per cache position (flash-attn's rule); the paged table has spare columns.
        angles = rng.uniform(0, 2 * np.pi, (2 * S_cache, rd // 2))
        cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    if paged:
        P = 16
        keys_list = [keys_before[b] for b in range(B)]
        k_cache, v_cache, table = _scatter_into_pages(rng, keys_list, [values_before[b] for b in range(B)], P, Hk, D, dtype)
        kw.update(block_table=table)
    else:
        k_cache, v_cache = keys_before.copy(), values_before.copy()
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                          return_softmax_lse=True, **kw)
    for b in range(B):
        n = seqlens[b] + S_new
        k_rot = k_new[b].astype(np.float64)
        q_b = q[b].astype(np.float64)
        if rotary is not None:
            k_rot = rotary_ref(k_new[b], cos, sin, seqlens[b] + np.arange(S_new), interleaved)
            q_pos = seqlens[b] + (np.arange(Sq) if causal else np.zeros(Sq, int))
            q_b = rotary_ref(q[b], cos, sin, q_pos, interleaved)
        expected_k = np.concatenate([keys_before[b, : seqlens[b]].astype(np.float64), k_rot])
        expected_v = np.concatenate([values_before[b, : seqlens[b]], v_new[b]]).astype(np.float64)
        if paged:
            pos = np.arange(n)
            got_k = k_cache[table[b, pos // P], pos % P]
            got_v = v_cache[table[b, pos // P], pos % P]
        else:
            got_k, got_v = k_cache[b, :n], v_cache[b, :n]
            # positions beyond the append are untouched
            np.testing.assert_array_equal(k_cache[b, n:], keys_before[b, n:])
        np.testing.assert_allclose(got_k, expected_k, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got_v, expected_v.astype(dtype))
        ref, ref_lse, naive = ref_and_naive(q_b.astype(dtype), expected_k.astype(dtype), expected_v.astype(dtype), causal=causal)
        assert_within_bound(out[b], ref, naive, dtype, what=f"batch {b}")
        assert_lse_close(lse[b], ref_lse)


def test_kvcache_leftpad_and_batch_idx():
    rng = np.random.default_rng(12)
    dtype, B, H, Hk, D, S = np.dtype(np.float16), 2, 4, 4, 40, 50
    q = randn(rng, (B, 2, H, D), dtype)
    k_cache, v_cache = randn(rng, (3, S, Hk, D), dtype), randn(rng, (3, S, Hk, D), dtype)
    seqlens = np.array([30, 44], np.int32)
    leftpad = np.array([5, 0], np.int32)
    batch_idx = np.array([2, 0], np.int32)
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, cache_leftpad=leftpad,
                                     cache_batch_idx=batch_idx, causal=True)
    for b in range(B):
        row = batch_idx[b]
        kb, vb = k_cache[row, leftpad[b]:seqlens[b]], v_cache[row, leftpad[b]:seqlens[b]]
        ref, _, naive = ref_and_naive(q[b], kb, vb, causal=True)
        assert_within_bound(out[b], ref, naive, dtype)


# -- PagedKVCache through the functions ----------------------------------------------------------


def test_paged_cache_inference_loop():
    """Prefill three prompts, decode token by token, free one, reuse its pages; every step
    matches the reference over the keys appended so far."""
    rng = np.random.default_rng(21)
    dtype, H, Hk, D, P = np.dtype(np.float32), 4, 2, 32, 16
    cache = fa.PagedKVCache(num_blocks=40, page_block_size=P, num_heads_k=Hk, head_dim=D, dtype=dtype)
    lens = [37, 5, 70]
    ids = [cache.add_sequence() for _ in lens]
    history_k = {i: randn(rng, (n, Hk, D), dtype) for i, n in zip(ids, lens)}
    history_v = {i: randn(rng, (n, Hk, D), dtype) for i, n in zip(ids, lens)}
    cu = cu_seqlens(lens)
    cache.append(ids, np.concatenate([history_k[i] for i in ids]), np.concatenate([history_v[i] for i in ids]), cu_seqlens=cu)
    # prefill attention over the cache (varlen, causal)
    q = randn(rng, (int(cu[-1]), H, D), dtype)
    out = fa.flash_attn_varlen_func(q, cache, None, cu, None, max(lens), None, causal=True)
    _check_varlen(out, fa.flash_attn_varlen_func(q, cache, None, cu, None, max(lens), None, causal=True,
                                                 return_softmax_lse=True)[1],
                  q, [history_k[i] for i in ids], [history_v[i] for i in ids], cu, dtype, causal=True)
    for step in range(3):
        if step == 1:
            cache.free(ids[1])
            ids = [ids[0], ids[2], cache.add_sequence()]
            history_k[ids[2]] = np.zeros((0, Hk, D), dtype)
            history_v[ids[2]] = np.zeros((0, Hk, D), dtype)
        q = randn(rng, (len(ids), 1, H, D), dtype)
        k_new, v_new = randn(rng, (len(ids), 1, Hk, D), dtype), randn(rng, (len(ids), 1, Hk, D), dtype)
        out = fa.flash_attn_with_kvcache(q, cache, None, k_new, v_new, seq_ids=ids, causal=True)
        for j, i in enumerate(ids):
            history_k[i] = np.concatenate([history_k[i], k_new[j]])
            history_v[i] = np.concatenate([history_v[i], v_new[j]])
            ref, _, naive = ref_and_naive(q[j], history_k[i], history_v[i], causal=True)
            assert_within_bound(out[j], ref, naive, dtype, what=f"step {step} seq {i}")


def test_configured_object_matches_functions():
    rng = np.random.default_rng(4)
    q, k, v = (randn(rng, s, np.float32) for s in [(2, 9, 4, 32), (2, 13, 2, 32), (2, 13, 2, 32)])
    attn = fa.FlashAttention(causal=True, softcap=4.0, window_size=(6, -1))
    np.testing.assert_array_equal(attn(q, k, v), fa.flash_attn_func(q, k, v, causal=True, softcap=4.0, window_size=(6, -1)))
    assert "causal=True" in repr(attn)


def test_return_attn_probs_tuple():
    rng = np.random.default_rng(4)
    q, k, v = (randn(rng, s, np.float32) for s in [(1, 3, 2, 8), (1, 5, 2, 8), (1, 5, 2, 8)])
    out, lse, probs = fa.flash_attn_func(q, k, v, return_attn_probs=True)
    assert probs is None and lse.shape == (1, 2, 3)
