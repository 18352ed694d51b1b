"""Zero-size inputs (issue 10, defect 4): an empty batch is legal input, not a layout error.

NumPy gives an array with a 0 extent all-zero strides, and the front end used to read those as
a bad layout (``LayoutError: out must be viewable as (tokens, H, D)``), or refused an empty
varlen batch (``cu_seqlens = [0]``).  Now, on both backends:

- no query row (B = 0, Sq = 0, total_q = 0, a PagedKVCache with no sequence): the call returns
  its zero-size ``out`` (the given ``out=`` itself) and LSE, and no attention backend runs;
- no key row at all (Sk = 0, total_k = 0, a cache of 0 rows, a pool of 0 pages): every query
  row outputs 0 with LSE +inf (the library's "no key" convention), again without the backend;
- empty sequences inside a non-empty batch (cu_seqlens repeating an offset, cache_seqlens 0,
  fresh PagedKVCache sequences): the backend runs, and the result matches the float64
  reference (0 / +inf for the rows that see no key);
- genuinely bad zero extents (head_dim 0, nheads 0, nheads_k 0, pages of 0 rows, an empty
  cu_seqlens) stay typed errors.

Every ``out=`` is poisoned with NaN before the call.  The ``check_*`` functions take the array
module and are shared with ``tests/gpu/test_gpu_empty.py``; "no backend" is asserted by
replacing ``_calls._backend_run`` with a function that fails the test (the GPU file also
replaces the kernel getters).
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import _backend_cpu, _calls, errors
from cupy_flashattn.problem import AttentionProblem
from cupy_flashattn.reference import attention_ref
from helpers import cu_seqlens, BF16, assert_within_bound, randn, ref_and_naive, scatter_into_pages, to_np

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
#: dtypes both backends accept (float64 is CPU only: see CPU_DTYPES)
GPU_DTYPES = [F16, BF16, F32]
CPU_DTYPES = GPU_DTYPES + [F64]
H, HK, D = 4, 2, 16
LSE_TOL = dict(rtol=1e-3, atol=2e-3)  # the GPU computes in fp16/bf16 operands


# --------------------------------------------------------------------------------------------
# Shared helpers (NumPy or CuPy through ``xp``)
# --------------------------------------------------------------------------------------------


def forbid_backend(monkeypatch):
    """Fail the test if an attention backend is asked to run (empty work must not reach it)."""

    def reached(xp, problem, plan):
        raise AssertionError(f"the attention backend ran for empty work: {problem.q.shape}")

    monkeypatch.setattr(_calls, "_backend_run", reached)


def dev(xp, a):
    """A NumPy array on ``xp``'s side (None passes through)."""
    return a if a is None or xp is np else xp.asarray(a)


def i32(xp, values):
    return dev(xp, np.asarray(values, dtype=np.int32).reshape(-1))


def zeros(xp, shape, dtype):
    return dev(xp, np.zeros(shape, dtype))


def poisoned(xp, shape, dtype):
    """An ``out=`` buffer full of NaN (NumPy gives it all-zero strides when it is zero-size)."""
    return dev(xp, np.full(shape, np.nan, dtype))


def rand(xp, rng, shape, dtype):
    return dev(xp, randn(rng, shape, dtype))


def assert_empty(result, shape, dtype, *, lse_shape=None, out=None):
    """``result`` is ``out`` or ``(out, lse)`` with the given zero-size shapes; ``out`` is the
    caller's buffer when one was given."""
    if lse_shape is not None:
        result, lse = result
        # float64 inputs get a float64 LSE, every other dtype float32.
        assert tuple(lse.shape) == tuple(lse_shape) and np.dtype(lse.dtype) == (F64 if np.dtype(dtype) == F64 else F32)
    assert tuple(result.shape) == tuple(shape) and np.dtype(result.dtype) == np.dtype(dtype)
    assert result.size == 0
    if out is not None:
        assert result is out


def assert_no_key(out, lse=None):
    """Every row saw no key: out is exactly 0 (no NaN left from the poison) and LSE +inf."""
    lse_dtype = F64 if np.dtype(out.dtype) == F64 else F32  # float64 inputs: float64 LSE
    out = to_np(out).astype(np.float64)
    assert out.size and not np.isnan(out).any(), "an out element was not written"
    np.testing.assert_array_equal(out, 0.0)
    if lse is not None:
        lse = to_np(lse)
        assert lse.size and np.dtype(lse.dtype) == lse_dtype
        np.testing.assert_array_equal(lse, np.inf)


def assert_matches(out, lse, q, k, v, dtype, **kw):
    """out / lse of one dense batch (or one sequence) against the float64 reference."""
    ref, ref_lse, naive = ref_and_naive(q, k, v, **kw)
    assert_within_bound(out, ref, naive, dtype)
    lse = to_np(lse).astype(np.float64)
    assert not np.isnan(lse).any(), "an LSE element was not written"
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse))
    finite = ~np.isinf(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], **LSE_TOL)


cu = cu_seqlens  # (tests/helpers.py)


# --------------------------------------------------------------------------------------------
# No query row: zero-size results, no backend
# --------------------------------------------------------------------------------------------


DENSE_NO_QUERIES = [  # (B, Sq, Sk)
    (0, 4, 5), (2, 0, 5), (0, 0, 0), (0, 3, 0), (3, 0, 0),
]


def check_dense_no_queries(xp, dtype, B, Sq, Sk):
    rng = np.random.default_rng(B * 100 + Sq * 10 + Sk)
    q = rand(xp, rng, (B, Sq, H, D), dtype)
    k, v = rand(xp, rng, (B, Sk, HK, D), dtype), rand(xp, rng, (B, Sk, HK, D), dtype)
    shape, lse_shape = (B, Sq, H, D), (B, H, Sq)
    assert_empty(fa.flash_attn_func(q, k, v), shape, dtype)
    assert_empty(fa.flash_attn_func(q, k, v, return_softmax_lse=True), shape, dtype,
                 lse_shape=lse_shape)
    out = poisoned(xp, shape, dtype)
    assert_empty(fa.flash_attn_func(q, k, v, out=out, return_softmax_lse=True), shape, dtype,
                 lse_shape=lse_shape, out=out)
    res = fa.flash_attn_func(q, k, v, return_attn_probs=True)
    assert len(res) == 3 and res[2] is None
    assert_empty(res[:2], shape, dtype, lse_shape=lse_shape)
    # Masks, GQA, ALiBi of both shapes, softcap: all still just shapes.
    for slopes in (np.full(H, 0.1, F32), np.full((B, H), 0.1, F32)):
        res = fa.flash_attn_func(q, k, v, causal=True, window_size=(2, 0), softcap=5.0,
                                 alibi_slopes=dev(xp, slopes), return_softmax_lse=True,
                                 out=poisoned(xp, shape, dtype))
        assert_empty(res, shape, dtype, lse_shape=lse_shape)


def check_varlen_no_queries(xp, dtype):
    rng = np.random.default_rng(1)
    # B = 0: cu_seqlens = [0], everything else zero-size.
    q, k = rand(xp, rng, (0, H, D), dtype), rand(xp, rng, (0, HK, D), dtype)
    empty_cu = i32(xp, [0])
    assert_empty(fa.flash_attn_varlen_func(q, k, k, empty_cu, empty_cu, 0, 0), (0, H, D), dtype)
    out = poisoned(xp, (0, H, D), dtype)
    res = fa.flash_attn_varlen_func(q, k, k, empty_cu, empty_cu, 0, 0, causal=True,
                                    seqused_k=i32(xp, []),
                                    alibi_slopes=dev(xp, np.zeros((0, H), F32)),
                                    return_softmax_lse=True, out=out)
    assert_empty(res, (0, H, D), dtype, lse_shape=(H, 0), out=out)
    # B = 3 sequences with no query (keys exist).
    kk = rand(xp, rng, (7, HK, D), dtype)
    res = fa.flash_attn_varlen_func(q, kk, kk, i32(xp, [0, 0, 0, 0]), i32(xp, [0, 2, 2, 7]), 0, 5,
                                    return_softmax_lse=True, out=poisoned(xp, (0, H, D), dtype))
    assert_empty(res, (0, H, D), dtype, lse_shape=(H, 0))
    # Paged, B = 0: a (0, max_blocks_per_seq) table; and B = 2 without a query.
    pages = rand(xp, rng, (3, 4, HK, D), dtype)
    res = fa.flash_attn_varlen_func(q, pages, pages, empty_cu, empty_cu, 0, 0,
                                    block_table=dev(xp, np.zeros((0, 2), np.int32)),
                                    seqused_k=i32(xp, []), return_softmax_lse=True)
    assert_empty(res, (0, H, D), dtype, lse_shape=(H, 0))
    res = fa.flash_attn_varlen_func(q, pages, pages, i32(xp, [0, 0, 0]), i32(xp, [0, 3, 8]), 0, 5,
                                    block_table=dev(xp, np.array([[0, 1], [2, 0]], np.int32)),
                                    page_block_size=4, return_attn_probs=True)
    assert res[2] is None
    assert_empty(res[:2], (0, H, D), dtype, lse_shape=(H, 0))


def check_kvcache_no_queries(xp, dtype):
    rng = np.random.default_rng(2)
    # B = 0 against a contiguous cache (of rows that no sequence uses), with and without lens,
    # new tokens and rotary tables.
    q = rand(xp, rng, (0, 1, H, D), dtype)
    kc = rand(xp, rng, (0, 6, HK, D), dtype)
    shape, lse_shape = (0, 1, H, D), (0, H, 1)
    assert_empty(fa.flash_attn_with_kvcache(q, kc, kc), shape, dtype)
    new = rand(xp, rng, (0, 1, HK, D), dtype)
    cos = dev(xp, np.ones((8, D // 4), F32))
    sin = dev(xp, np.zeros((8, D // 4), F32))
    out = poisoned(xp, shape, dtype)
    res = fa.flash_attn_with_kvcache(q, kc, kc, k=new, v=new, rotary_cos=cos, rotary_sin=sin,
                                     cache_seqlens=i32(xp, []), causal=True,
                                     return_softmax_lse=True, out=out)
    assert_empty(res, shape, dtype, lse_shape=lse_shape, out=out)
    # B = 0 against a paged pool.
    pool = rand(xp, rng, (3, 4, HK, D), dtype)
    before = to_np(pool).copy()
    res = fa.flash_attn_with_kvcache(q, pool, pool, k=new, v=new, cache_seqlens=i32(xp, []),
                                     block_table=dev(xp, np.zeros((0, 2), np.int32)),
                                     return_softmax_lse=True, out=poisoned(xp, shape, dtype))
    assert_empty(res, shape, dtype, lse_shape=lse_shape)
    np.testing.assert_array_equal(to_np(pool), before)


def check_kvcache_sq0_still_appends(xp, dtype):
    """Sq = 0 with new tokens: no query to attend, but the tokens are appended (the append is
    not attention work; only the attention is skipped)."""
    rng = np.random.default_rng(3)
    kc, vc = zeros(xp, (2, 6, HK, D), dtype), zeros(xp, (2, 6, HK, D), dtype)
    knew, vnew = rand(xp, rng, (2, 1, HK, D), dtype), rand(xp, rng, (2, 1, HK, D), dtype)
    out = poisoned(xp, (2, 0, H, D), dtype)
    res = fa.flash_attn_with_kvcache(zeros(xp, (2, 0, H, D), dtype), kc, vc, k=knew, v=vnew,
                                     cache_seqlens=i32(xp, [2, 3]), return_softmax_lse=True,
                                     out=out)
    assert_empty(res, (2, 0, H, D), dtype, lse_shape=(2, H, 0), out=out)
    kc, vc, knew, vnew = to_np(kc), to_np(vc), to_np(knew), to_np(vnew)
    np.testing.assert_array_equal(kc[0, 2], knew[0, 0])
    np.testing.assert_array_equal(kc[1, 3], knew[1, 0])
    np.testing.assert_array_equal(vc[1, 3], vnew[1, 0])
    written = np.zeros((2, 6), bool)
    written[0, 2] = written[1, 3] = True
    assert not kc[~written].any() and not vc[~written].any()


def check_paged_cache_without_sequences(xp, dtype):
    """A PagedKVCache with no sequence (new, or every sequence freed): both entry points give
    the empty result and the cache stays exactly as it was."""
    rng = np.random.default_rng(4)
    cache = fa.PagedKVCache(4, 4, HK, D, dtype, xp=xp)
    sid = cache.add_sequence()
    cache.append([sid], rand(xp, rng, (1, 3, HK, D), dtype), rand(xp, rng, (1, 3, HK, D), dtype))
    cache.free(sid)
    k_before, v_before = to_np(cache.k_pages).copy(), to_np(cache.v_pages).copy()
    q = rand(xp, rng, (0, 1, H, D), dtype)
    assert_empty(fa.flash_attn_with_kvcache(q, cache, None), (0, 1, H, D), dtype)
    new = rand(xp, rng, (0, 2, HK, D), dtype)
    out = poisoned(xp, (0, 1, H, D), dtype)
    res = fa.flash_attn_with_kvcache(q, cache, None, k=new, v=new, causal=True,
                                     return_softmax_lse=True, out=out)
    assert_empty(res, (0, 1, H, D), dtype, lse_shape=(0, H, 1), out=out)
    qv = rand(xp, rng, (0, H, D), dtype)
    out = poisoned(xp, (0, H, D), dtype)
    res = fa.flash_attn_varlen_func(qv, cache, None, i32(xp, [0]), None, 0, None,
                                    return_softmax_lse=True, out=out)
    assert_empty(res, (0, H, D), dtype, lse_shape=(H, 0), out=out)
    res = fa.flash_attn_varlen_func(qv, cache, None, i32(xp, [0]), None, 0, None, seq_ids=[])
    assert_empty(res, (0, H, D), dtype)
    assert cache.seq_ids == [] and cache.num_free_blocks == 4
    np.testing.assert_array_equal(to_np(cache.k_pages), k_before)
    np.testing.assert_array_equal(to_np(cache.v_pages), v_before)


MERGE_SHAPES = [  # (out shape, lse shape)
    ((0, H, D), (H, 0)), ((0, 3, H, D), (0, H, 3)), ((2, 0, H, D), (2, H, 0)),
]


def check_merge_empty(xp, dtype, out_shape, lse_shape):
    lse_dtype = F64 if dtype == F64 else F32
    oa, ob = poisoned(xp, out_shape, dtype), poisoned(xp, out_shape, dtype)
    la, lb = poisoned(xp, lse_shape, lse_dtype), poisoned(xp, lse_shape, lse_dtype)
    out, lse = fa.merge_attention_states(oa, la, ob, lb)
    assert tuple(out.shape) == out_shape and np.dtype(out.dtype) == dtype
    assert tuple(lse.shape) == lse_shape and np.dtype(lse.dtype) == lse_dtype
    assert type(out) is type(oa) and type(lse) is type(la)


# --------------------------------------------------------------------------------------------
# No key row anywhere: out = 0, LSE = +inf, no backend
# --------------------------------------------------------------------------------------------


def check_dense_no_keys(xp, dtype):
    rng = np.random.default_rng(5)
    B, Sq = 2, 3
    q = rand(xp, rng, (B, Sq, H, D), dtype)
    k = rand(xp, rng, (B, 0, HK, D), dtype)
    for kw in (dict(), dict(causal=True), dict(window_size=(1, 1), softcap=3.0),
               dict(alibi_slopes=dev(xp, np.full((B, H), 0.2, F32)))):
        out = poisoned(xp, (B, Sq, H, D), dtype)
        res, lse = fa.flash_attn_func(q, k, k, out=out, return_softmax_lse=True, **kw)
        assert res is out and tuple(lse.shape) == (B, H, Sq)
        assert_no_key(res, lse)
        # The reference agrees (it is the convention, not a special case of this code).
        ref, ref_lse = attention_ref(to_np(q), to_np(k), to_np(k), return_lse=True,
                                     **{n: to_np(a) if n == "alibi_slopes" else a
                                        for n, a in kw.items()})
        np.testing.assert_array_equal(to_np(res).astype(np.float64), ref)
        np.testing.assert_array_equal(to_np(lse).astype(np.float64), ref_lse)
    assert_no_key(fa.flash_attn_func(q, k, k))


def check_varlen_no_keys(xp, dtype):
    rng = np.random.default_rng(6)
    cu_q = i32(xp, [0, 2, 2, 5])
    q = rand(xp, rng, (5, H, D), dtype)
    k = rand(xp, rng, (0, HK, D), dtype)
    out = poisoned(xp, (5, H, D), dtype)
    res, lse = fa.flash_attn_varlen_func(q, k, k, cu_q, i32(xp, [0, 0, 0, 0]), 3, 0, causal=True,
                                         return_softmax_lse=True, out=out)
    assert res is out and tuple(lse.shape) == (H, 5)
    assert_no_key(res, lse)
    # A paged pool of 0 pages: no page id is valid, and no sequence has a key.
    pool = rand(xp, rng, (0, 4, HK, D), dtype)
    out = poisoned(xp, (5, H, D), dtype)
    res, lse = fa.flash_attn_varlen_func(q, pool, pool, cu_q, i32(xp, [0, 0, 0, 0]), 3, 0,
                                         block_table=dev(xp, np.zeros((3, 2), np.int32)),
                                         seqused_k=i32(xp, [0, 0, 0]), return_softmax_lse=True,
                                         out=out)
    assert_no_key(res, lse)


def check_kvcache_no_keys(xp, dtype):
    rng = np.random.default_rng(7)
    q = rand(xp, rng, (2, 1, H, D), dtype)
    shape = (2, 1, H, D)
    # A contiguous cache of 0 positions per row; lengths 0 as None (= full), an int, an array.
    kc = rand(xp, rng, (2, 0, HK, D), dtype)
    for lens in (None, 0, i32(xp, [0, 0])):
        out = poisoned(xp, shape, dtype)
        res, lse = fa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, causal=True,
                                              return_softmax_lse=True, out=out)
        assert res is out and tuple(lse.shape) == (2, H, 1)
        assert_no_key(res, lse)
    # ... with cache_batch_idx, and with new tokens of length 0 (nothing to append).
    empty_new = rand(xp, rng, (2, 0, HK, D), dtype)
    res, lse = fa.flash_attn_with_kvcache(q, kc, kc, k=empty_new, v=empty_new,
                                          cache_seqlens=i32(xp, [0, 0]),
                                          cache_batch_idx=i32(xp, [1, 0]),
                                          return_softmax_lse=True)
    assert_no_key(res, lse)
    # A paged pool of 0 pages.
    pool = rand(xp, rng, (0, 4, HK, D), dtype)
    res, lse = fa.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=i32(xp, [0, 0]),
                                          block_table=dev(xp, np.zeros((2, 3), np.int32)),
                                          return_softmax_lse=True)
    assert_no_key(res, lse)


# --------------------------------------------------------------------------------------------
# Empty sequences inside a batch: the backend runs, against the reference
# --------------------------------------------------------------------------------------------


def check_varlen_empty_sequences(xp, paged, causal):
    """cu_seqlens that repeat an offset: sequences with no query, no key, or neither, next to
    ordinary ones (out 0 / LSE +inf exactly for rows that see no key)."""
    dtype = F16
    rng = np.random.default_rng(8 + paged * 2 + causal)
    lens_q = [2, 0, 3, 0, 2, 1]
    lens_k = [0, 4, 0, 0, 5, 3]
    qs = [randn(rng, (n, H, D), dtype) for n in lens_q]
    ks = [randn(rng, (n, HK, D), dtype) for n in lens_k]
    vs = [randn(rng, (n, HK, D), dtype) for n in lens_k]
    q = np.concatenate(qs)
    out = poisoned(xp, q.shape, dtype)
    kw = dict(causal=causal, return_softmax_lse=True, out=out)
    if paged:
        k_pages, v_pages, table = scatter_into_pages(rng, ks, vs, 2, dtype, min_pages=1)
        res, lse = fa.flash_attn_varlen_func(
            dev(xp, q), dev(xp, k_pages), dev(xp, v_pages), i32(xp, cu(lens_q)),
            i32(xp, cu(lens_k)), max(lens_q), max(lens_k), block_table=dev(xp, table), **kw)
    else:
        k, v = np.concatenate(ks), np.concatenate(vs)
        res, lse = fa.flash_attn_varlen_func(dev(xp, q), dev(xp, k), dev(xp, v),
                                             i32(xp, cu(lens_q)), i32(xp, cu(lens_k)),
                                             max(lens_q), max(lens_k), **kw)
    assert res is out
    res, lse = to_np(res), to_np(lse)
    starts = cu(lens_q)
    for b, n in enumerate(lens_q):
        if n == 0:
            continue
        rows = slice(starts[b], starts[b] + n)
        if lens_k[b] == 0:
            assert_no_key(res[rows], lse[:, rows])
        else:
            assert_matches(res[rows], lse[:, rows], qs[b], ks[b], vs[b], dtype, causal=causal)


def check_kvcache_empty_cache_with_new_tokens(xp, layout):
    """cache_seqlens all 0 with new tokens: attention over the new tokens alone (the rest of the
    cache is junk that must not be read); without new tokens: 0 / +inf."""
    dtype = F16
    rng = np.random.default_rng(20 + len(layout))
    B, S_new = 3, 2
    q, knew, vnew = (randn(rng, (B, S_new, h, D), dtype) for h in (H, HK, HK))
    if layout == "cache":
        cache = fa.PagedKVCache(6, 4, HK, D, dtype, xp=xp)
        ids = [cache.add_sequence() for _ in range(B)]
        # Fresh sequences first: no key, no new token.
        res, lse = fa.flash_attn_with_kvcache(dev(xp, q), cache, None, return_softmax_lse=True,
                                              out=poisoned(xp, q.shape, dtype))
        assert_no_key(res, lse)
        args = (cache, None)
        extra = {}
    else:
        if layout == "paged":
            pool = randn(rng, (6, 4, HK, D), dtype)
            extra = dict(block_table=dev(xp, np.array([[4, 0], [1, 5], [2, 3]], np.int32)))
        else:
            pool = randn(rng, (B, 5, HK, D), dtype)
            extra = {}
        kc, vc = dev(xp, pool), dev(xp, pool.copy())
        args = (kc, vc)
        lens = i32(xp, [0] * B)
        res, lse = fa.flash_attn_with_kvcache(dev(xp, q), kc, vc, cache_seqlens=lens,
                                              return_softmax_lse=True,
                                              out=poisoned(xp, q.shape, dtype), **extra)
        assert_no_key(res, lse)
        extra["cache_seqlens"] = lens
    out = poisoned(xp, q.shape, dtype)
    res, lse = fa.flash_attn_with_kvcache(dev(xp, q), *args, k=dev(xp, knew), v=dev(xp, vnew),
                                          causal=True, return_softmax_lse=True, out=out, **extra)
    assert res is out
    assert_matches(to_np(res), to_np(lse), q, knew, vnew, dtype, causal=True)
    if layout == "cache":
        assert [int(n) for n in to_np(cache.seqlens(ids))] == [S_new] * B


# --------------------------------------------------------------------------------------------
# CPU tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("B,Sq,Sk", DENSE_NO_QUERIES)
def test_dense_no_queries(monkeypatch, dtype, B, Sq, Sk):
    forbid_backend(monkeypatch)
    check_dense_no_queries(np, dtype, B, Sq, Sk)


@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=str)
def test_varlen_no_queries(monkeypatch, dtype):
    forbid_backend(monkeypatch)
    check_varlen_no_queries(np, dtype)


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=str)
def test_kvcache_no_queries(monkeypatch, dtype):
    forbid_backend(monkeypatch)
    check_kvcache_no_queries(np, dtype)


def test_kvcache_sq0_still_appends(monkeypatch):
    forbid_backend(monkeypatch)
    check_kvcache_sq0_still_appends(np, F16)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_paged_cache_without_sequences(monkeypatch, dtype):
    forbid_backend(monkeypatch)
    check_paged_cache_without_sequences(np, dtype)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("out_shape,lse_shape", MERGE_SHAPES)
def test_merge_empty(dtype, out_shape, lse_shape):
    check_merge_empty(np, dtype, out_shape, lse_shape)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_dense_no_keys(monkeypatch, dtype):
    forbid_backend(monkeypatch)
    check_dense_no_keys(np, dtype)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_varlen_no_keys(monkeypatch, dtype):
    forbid_backend(monkeypatch)
    check_varlen_no_keys(np, dtype)


@pytest.mark.parametrize("dtype", [F16, F32], ids=str)
def test_kvcache_no_keys(monkeypatch, dtype):
    forbid_backend(monkeypatch)
    check_kvcache_no_keys(np, dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_varlen_empty_sequences(paged, causal):
    check_varlen_empty_sequences(np, paged, causal)


@pytest.mark.parametrize("layout", ["contiguous", "paged", "cache"])
def test_kvcache_empty_cache_with_new_tokens(layout):
    check_kvcache_empty_cache_with_new_tokens(np, layout)


def test_cpu_backend_zero_size_problems(monkeypatch):
    """The Numba backend itself, called directly: no query row returns before any conversion
    or kernel; k/v of no row (contiguous, or a bf16 pool of 0 pages) give 0 / +inf."""
    lse = np.full((H, 0), np.nan, F32)
    problem = AttentionProblem(
        q=np.zeros((0, H, D), BF16), k=np.zeros((0, HK, D), BF16), v=np.zeros((0, HK, D), BF16),
        out=np.zeros((0, H, D), BF16), softmax_lse=lse, batch_size=0, seqlen_q=0, seqlen_k=0,
        max_seqlen_q=0, max_seqlen_k=0, cu_seqlens_q=np.zeros(1, np.int32),
        cu_seqlens_k=np.zeros(1, np.int32))

    def kernel(*args):
        raise AssertionError("the Numba kernel ran for a problem without a query row")

    monkeypatch.setattr(_backend_cpu, "_flash_fwd_kernel", kernel)
    _backend_cpu.run_attention(problem)
    monkeypatch.undo()

    rng = np.random.default_rng(9)
    q = randn(rng, (5, H, D), BF16)
    for paged in (False, True):
        k = np.zeros((0, 4, HK, D) if paged else (0, HK, D), BF16)
        out, lse = np.full((5, H, D), np.nan, BF16), np.full((H, 5), np.nan, F32)
        extra = dict(block_table=np.zeros((2, 2), np.int32), page_block_size=4,
                     seqused_k=np.array([3, 2], np.int32)) if paged else {}
        _backend_cpu.run_attention(AttentionProblem(
            q=q, k=k, v=k, out=out, softmax_lse=lse, batch_size=2, seqlen_q=0, seqlen_k=0,
            max_seqlen_q=3, max_seqlen_k=0, cu_seqlens_q=np.array([0, 3, 5], np.int32),
            cu_seqlens_k=np.zeros(3, np.int32), **extra))
        assert_no_key(out, lse)


# -- genuinely bad zero extents stay typed errors ---------------------------------------------


def _typed(cls, *fragments):
    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            if not handled:
                return False  # another exception: let it through as it is
            message = str(self.info.value)
            assert isinstance(self.info.value, errors.FlashAttnError)
            for fragment in fragments + ("expected", "got", "Fix:"):
                assert fragment in message, f"{fragment!r} not in {message!r}"
            assert "contiguous" not in message  # never the meaningless stride complaint
            return handled

    return _Check()


def _entry_point(layout, q_heads, kv_heads, head_dim, xp=np, dtype=F16):
    """Call ``layout``'s entry point with an otherwise valid input of these extents."""
    qd, kd = (2, 3, q_heads, head_dim), (2, 5, kv_heads, head_dim)
    if layout == "dense":
        return fa.flash_attn_func(zeros(xp, qd, dtype), zeros(xp, kd, dtype), zeros(xp, kd, dtype))
    if layout == "varlen":
        cu_q, cu_k = i32(xp, [0, 3, 6]), i32(xp, [0, 5, 10])
        k = zeros(xp, (10, kv_heads, head_dim), dtype)
        return fa.flash_attn_varlen_func(zeros(xp, (6, q_heads, head_dim), dtype), k, k, cu_q, cu_k,
                                         3, 5)
    k = zeros(xp, kd, dtype)
    return fa.flash_attn_with_kvcache(zeros(xp, (2, 1, q_heads, head_dim), dtype), k, k,
                                      cache_seqlens=i32(xp, [1, 2]))


LAYOUTS = ["dense", "varlen", "kvcache"]


def check_bad_zero_extents(xp, layout):
    for kv_heads in (0, HK):  # H = 0 with Hk = 2 passed "H % Hk == 0" and reached a launch
        with _typed(errors.ShapeError, "q", "at least one query head", "H=0"):
            _entry_point(layout, 0, kv_heads, D, xp)
    with _typed(errors.ShapeError, "q", "head dimension must be at least 1"):
        _entry_point(layout, H, HK, 0, xp)
    with _typed(errors.ShapeError, "k", "at least one key/value head", "Hk=0"):
        _entry_point(layout, H, 0, D, xp)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_zero_extents_stay_typed(monkeypatch, layout):
    """nheads 0 (it used to blame k's heads), head_dim 0 and nheads_k 0, on every entry point."""
    forbid_backend(monkeypatch)
    check_bad_zero_extents(np, layout)


def check_bad_zero_paged_and_cu(xp):
    q = zeros(xp, (3, H, D), F16)
    no_rows = zeros(xp, (2, 0, HK, D), F16)  # pages of 0 rows: p // P would divide by 0
    table = dev(xp, np.zeros((1, 1), np.int32))
    with _typed(errors.ShapeError, "k", "pages must hold at least one row", "(2, 0, 2, 16)"):
        fa.flash_attn_varlen_func(q, no_rows, no_rows, i32(xp, [0, 3]), i32(xp, [0, 0]), 3, 0,
                                  block_table=table)
    with _typed(errors.ShapeError, "k_cache", "pages must hold at least one row"):
        fa.flash_attn_with_kvcache(zeros(xp, (1, 1, H, D), F16), no_rows, no_rows,
                                   cache_seqlens=i32(xp, [0]), block_table=table)
    with _typed(errors.SeqlenError, "cu_seqlens_q", "batch_size + 1", "length 0", "[0]"):
        k = zeros(xp, (0, HK, D), F16)
        fa.flash_attn_varlen_func(zeros(xp, (0, H, D), F16), k, k, i32(xp, []), i32(xp, [0]), 0, 0)
    # [0] is an empty batch: it cannot index rows (a shape fact, so a GPU call without
    # check=True refuses it too, instead of leaving the rows unwritten).
    with _typed(errors.SeqlenError, "cu_seqlens_q", "empty batch", "8 rows"):
        k = zeros(xp, (0, HK, D), F16)
        fa.flash_attn_varlen_func(zeros(xp, (8, H, D), F16), k, k, i32(xp, [0]), i32(xp, [0]),
                                  8, 0)
    with _typed(errors.SeqlenError, "cu_seqlens_k", "empty batch", "5 rows"):
        k = zeros(xp, (5, HK, D), F16)
        fa.flash_attn_varlen_func(zeros(xp, (0, H, D), F16), k, k, i32(xp, [0]), i32(xp, [0]),
                                  0, 5)
    # A block table needs a column even when every sequence is empty (documented rule).
    with _typed(errors.BlockTableError, "block_table", "at least one column"):
        pool = zeros(xp, (2, 4, HK, D), F16)
        fa.flash_attn_varlen_func(zeros(xp, (0, H, D), F16), pool, pool, i32(xp, [0]),
                                  i32(xp, [0]), 0, 0,
                                  block_table=dev(xp, np.zeros((0, 0), np.int32)))
    bad_merges = (((3, H, 0), (H, 3)), ((3, 0, D), (0, 3)), ((1, 3, 0, D), (1, 0, 3)))
    for out_shape, lse_shape in bad_merges:
        o, lse = zeros(xp, out_shape, F32), zeros(xp, lse_shape, F32)
        with _typed(errors.ShapeError, "out_a", "at least one head"):
            fa.merge_attention_states(o, lse, o, lse)


def test_bad_zero_pages_cu_seqlens_and_merge(monkeypatch):
    forbid_backend(monkeypatch)
    check_bad_zero_paged_and_cu(np)
