"""Every validation check: the error type, the argument it names, and that the message shows the
expected and given values and a fix.  One test (or one parametrized case) per check; the list
in README.md's "Errors" table points here."""

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import errors
from helpers import cu_seqlens, raises_explained

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def dense(B=2, Sq=5, Sk=7, H=4, Hk=2, D=16, dtype=np.float32):
    return rand(B, Sq, H, D, dtype=dtype), rand(B, Sk, Hk, D, dtype=dtype), rand(B, Sk, Hk, D, dtype=dtype)


def paged(num_blocks=6, P=4, Hk=2, D=16, B=2, lens=(5, 7), H=4):
    k = rand(num_blocks, P, Hk, D)
    v = rand(num_blocks, P, Hk, D)
    table = np.array([[0, 1, 5], [2, 3, 4]], dtype=np.int32)[:B]
    total_q = 3 * B
    q = rand(total_q, H, D)
    cu_q = np.arange(0, total_q + 1, 3, dtype=np.int32)
    cu_k = cu_seqlens(lens)
    return q, k, v, cu_q, cu_k, table


def raises(cls, *fragments):
    """Raises ``cls`` and its message contains every fragment and a fix (helpers.py)."""
    return raises_explained(cls, *fragments)


# -- the seed: page size drift -----------------------------------------------------------------


def test_seed_page_block_size_mismatch_configured_object():
    """Configured page_block_size=16, cache allocated with 32: typed error, both values, the fix."""
    attn = fa.FlashAttention(causal=True, page_block_size=16)
    k = rand(4, 32, 2, 16)
    v = rand(4, 32, 2, 16)
    q = rand(3, 4, 16)
    cu_q = np.array([0, 3], np.int32)
    cu_k = np.array([0, 40], np.int32)
    table = np.array([[2, 0]], np.int32)
    with raises(errors.PageSizeMismatchError, "page_block_size 16 does not match k shape",
                "(blocks=4, 32, 2, 16)", "expected page_block_size == k.shape[1] == 32, got 16",
                "page_block_size=16", "page_block_size=k.shape[1]", "PagedKVCache") as info:
        attn.varlen(q, k, v, cu_q, cu_k, 3, 40, block_table=table)
    assert isinstance(info.value, ValueError)


def test_page_block_size_mismatch_functions():
    q, k, v, cu_q, cu_k, table = paged(P=4)
    with raises(errors.PageSizeMismatchError, "page_block_size 8 does not match k shape", "4"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=table, page_block_size=8)
    kc = rand(2, 9, 2, 16)
    with raises(errors.PageSizeMismatchError, "page_block_size 2 does not match"):
        fa.flash_attn_with_kvcache(q.reshape(2, 3, 4, 16), k, v, cache_seqlens=1,
                                   block_table=table, page_block_size=2)
    del kc


def test_page_block_size_must_be_positive_int():
    with raises(errors.ArgumentError, "page_block_size", ">= 1"):
        fa.FlashAttention(page_block_size=0)
    q, k, v, cu_q, cu_k, table = paged()
    with raises(errors.ArgumentError, "page_block_size", "1.5"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=table, page_block_size=1.5)


def test_page_block_size_without_block_table():
    q = rand(6, 4, 16)
    k = rand(12, 2, 16)
    cu = np.array([0, 3, 6], np.int32)
    cu_k = np.array([0, 5, 12], np.int32)
    with raises(errors.ArgumentError, "page_block_size", "block_table"):
        fa.flash_attn_varlen_func(q, k, k, cu, cu_k, 3, 7, page_block_size=16)


# -- arrays, dtypes, layouts -------------------------------------------------------------------


def test_not_an_array():
    q, k, v = dense()
    with raises(errors.DTypeError, "q:", "unsupported array type", "list"):
        fa.flash_attn_func(q.tolist(), k, v)


def test_unsupported_dtype():
    q, k, v = dense()
    with raises(errors.DTypeError, "q:", "int32", "float16"):
        fa.flash_attn_func(q.astype(np.int32), k.astype(np.int32), v.astype(np.int32))


def test_dtype_mismatch():
    q, k, v = dense()
    with raises(errors.DTypeError, "k:", "same dtype", "float16", "float32"):
        fa.flash_attn_func(q.astype(np.float16), k, v.astype(np.float16))


def test_last_dim_not_contiguous():
    q, k, v = dense(D=16)
    with raises(errors.LayoutError, "k:", "contiguous last dimension", "ascontiguousarray"):
        fa.flash_attn_func(q, rand(2, 7, 2, 32)[..., ::2], v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_dense_rank(which):
    q, k, v = dense()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which][0]
    with raises(errors.ShapeError, f"{which}:", "rank 4", "rank 3"):
        fa.flash_attn_func(args["q"], args["k"], args["v"])


def test_varlen_rank():
    q, k, v = dense()
    cu = np.array([0, 5], np.int32)
    with raises(errors.ShapeError, "q:", "varlen", "rank 4"):
        fa.flash_attn_varlen_func(q, k[0], v[0], cu, np.array([0, 7], np.int32), 5, 7)


def test_head_dim_mismatch():
    q, k, v = dense(D=16)
    with raises(errors.ShapeError, "k:", "head dim", "16", "8"):
        fa.flash_attn_func(q, k[..., :8].copy(), v)


def test_head_dim_too_large():
    q, k, v = dense(D=520, B=1, Sq=1, Sk=1)
    with raises(errors.UnsupportedError, "head dimension at most 512", "520"):
        fa.flash_attn_func(q, k, v)


def test_heads_must_divide():
    q, k, v = dense(H=6, Hk=4)
    with raises(errors.ShapeError, "Number of heads in key/value must divide number of heads in query",
                "H=6", "Hk=4", "1, 2, 3, 6"):
        fa.flash_attn_func(q, k, v)


def test_k_v_shapes():
    q, k, v = dense()
    with raises(errors.ShapeError, "v:", "same shape as k", "(2, 7, 2, 16)", "(2, 6, 2, 16)"):
        fa.flash_attn_func(q, k, v[:, :6].copy())


def test_dense_batch_mismatch():
    q, k, v = dense()
    with raises(errors.ShapeError, "k:", "batch size", "shape[0] == 2"):
        fa.flash_attn_func(q, k[:1].copy(), v[:1].copy())


def test_out_shape():
    q, k, v = dense()
    with raises(errors.ShapeError, "out:", "q's shape"):
        fa.flash_attn_func(q, k, v, out=np.empty((2, 5, 4, 8), np.float32))


# -- scalar options ----------------------------------------------------------------------------


def test_dropout_unsupported():
    q, k, v = dense()
    with raises(errors.UnsupportedError, "dropout_p", "not supported", "0.1"):
        fa.flash_attn_func(q, k, v, dropout_p=0.1)


def test_softmax_scale_finite():
    q, k, v = dense()
    with raises(errors.ArgumentError, "softmax_scale", "finite", "nan"):
        fa.flash_attn_func(q, k, v, softmax_scale=float("nan"))


@pytest.mark.parametrize("window", [(-2, 0), (1,), (1.5, 2), "ab"])
def test_window_size(window):
    q, k, v = dense()
    with raises(errors.ArgumentError, "window_size", "(left, right)"):
        fa.flash_attn_func(q, k, v, window_size=window)


def test_softcap_non_negative():
    q, k, v = dense()
    with raises(errors.ArgumentError, "softcap", ">= 0", "-1.0"):
        fa.flash_attn_func(q, k, v, softcap=-1.0)


def test_num_splits():
    q, k, v = dense()
    with raises(errors.ArgumentError, "num_splits", "-1"):
        fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=3, num_splits=-1)


def test_alibi_dtype():
    q, k, v = dense()
    with raises(errors.DTypeError, "alibi_slopes", "float32", "float64"):
        fa.flash_attn_func(q, k, v, alibi_slopes=np.ones(4))


def test_alibi_shape():
    q, k, v = dense()
    with raises(errors.ShapeError, "alibi_slopes", "(4,) or (2, 4)", "(3,)"):
        fa.flash_attn_func(q, k, v, alibi_slopes=np.ones(3, np.float32))


# -- varlen ------------------------------------------------------------------------------------


def _varlen():
    q = rand(8, 4, 16)
    k = rand(10, 2, 16)
    cu_q = np.array([0, 3, 8], np.int32)
    cu_k = np.array([0, 4, 10], np.int32)
    return q, k, k.copy(), cu_q, cu_k


def test_cu_seqlens_dtype():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.DTypeError, "cu_seqlens_q", "int32", "int64"):
        fa.flash_attn_varlen_func(q, k, v, cu_q.astype(np.int64), cu_k, 5, 6)


def test_cu_seqlens_rank():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.ShapeError, "cu_seqlens_k", "rank 1"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k[None], 5, 6)


def test_cu_seqlens_too_short():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.SeqlenError, "cu_seqlens_q", "batch_size + 1"):
        fa.flash_attn_varlen_func(q, k, v, cu_q[:1].copy(), cu_k, 5, 6)


def test_cu_seqlens_start_at_zero():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.SeqlenError, "cu_seqlens_q", "start at 0", "got 1"):
        fa.flash_attn_varlen_func(q, k, v, np.array([1, 3, 8], np.int32), cu_k, 5, 6)


def test_cu_seqlens_non_decreasing():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.SeqlenError, "cu_seqlens_k", "non-decreasing"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, np.array([0, 6, 4], np.int32), 5, 6)


def test_cu_seqlens_end_at_total():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.SeqlenError, "cu_seqlens_q", "total number of tokens", "expected 8, got 7"):
        fa.flash_attn_varlen_func(q, k, v, np.array([0, 3, 7], np.int32), cu_k, 5, 6)


def test_cu_seqlens_batch_agree():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.ShapeError, "cu_seqlens_k", "shape[0] == 3"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, np.array([0, 10], np.int32), 5, 10)


def test_max_seqlen_q_covers():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.SeqlenError, "max_seqlen_q", "longest", ">= 5", "got 4"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 6)


def test_max_seqlen_is_int():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.SeqlenError, "max_seqlen_k", "host int"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, np.array([6]))


def test_seqused_k_within():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.SeqlenError, "seqused_k", "sequence 0", "<= 4"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, seqused_k=np.array([5, 6], np.int32))


def test_seqused_k_length():
    q, k, v, cu_q, cu_k = _varlen()
    with raises(errors.ShapeError, "seqused_k", "shape[0] == 2"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, seqused_k=np.array([1], np.int32))


# -- paged -------------------------------------------------------------------------------------


def test_paged_rank():
    q, k, v, cu_q, cu_k, table = paged()
    with raises(errors.ShapeError, "k:", "paged (num_blocks, page_block_size, Hk, D)"):
        fa.flash_attn_varlen_func(q, k.reshape(24, 2, 16), v, cu_q, cu_k, 3, 7, block_table=table)


def test_block_table_rank():
    q, k, v, cu_q, cu_k, table = paged()
    with raises(errors.ShapeError, "block_table", "rank 2"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=table.ravel())


def test_block_table_dtype():
    q, k, v, cu_q, cu_k, table = paged()
    with raises(errors.DTypeError, "block_table", "int32", "int64"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=table.astype(np.int64))


def test_block_table_contiguous():
    q, k, v, cu_q, cu_k, table = paged()
    wide = np.repeat(table, 2, axis=1)[:, ::2]
    with raises(errors.LayoutError, "block_table", "contiguous last dimension"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=wide)


def test_block_table_batch():
    q, k, v, cu_q, cu_k, table = paged()
    with raises(errors.ShapeError, "block_table", "shape[0] == 2"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=table[:1].copy())


@pytest.mark.parametrize("bad", [6, -1, 100])
def test_block_ids_in_range(bad):
    q, k, v, cu_q, cu_k, table = paged()
    table = table.copy()
    table[1, 1] = bad
    with raises(errors.BlockTableError, "block_table", "entry [1, 1]", "[0, 6)", f"got {bad}"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=table)


def test_unused_block_table_entries_may_be_padding():
    """Entries past a sequence's last page are never read, so vLLM-style -1 padding is fine."""
    q, k, v, cu_q, cu_k, table = paged(lens=(5, 7))
    table = table.copy()
    table[0, 2] = -1  # sequence 0 has 5 keys = 2 pages of 4
    out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 7, block_table=table)
    assert np.isfinite(out).all()


def test_lengths_within_block_table():
    q, k, v, cu_q, cu_k, table = paged()
    cu_k = np.array([0, 5, 18], np.int32)
    with raises(errors.SeqlenError, "cu_seqlens_k", "sequence 1", "3 * 4", "<= 12", "got 13"):
        fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 13, block_table=table)


# -- KV cache ----------------------------------------------------------------------------------


def _kvcache(B=2, S=10, Hk=2, D=16, Sq=1, H=4):
    return rand(B, Sq, H, D), rand(B, S, Hk, D), rand(B, S, Hk, D)


def test_cache_overflow_after_append():
    q, kc, vc = _kvcache()
    k_new = rand(2, 2, 2, 16)
    with raises(errors.SeqlenError, "cache_seqlens", "more than the cache's 10 positions", "got 11"):
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, k_new.copy(),
                                   cache_seqlens=np.array([3, 9], np.int32))


def test_cache_seqlens_int_out_of_range():
    q, kc, vc = _kvcache()
    with raises(errors.SeqlenError, "cache_seqlens", "0 <= cache_seqlens <= 10", "got 11"):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=11)


def test_cache_seqlens_dtype():
    q, kc, vc = _kvcache()
    with raises(errors.DTypeError, "cache_seqlens", "int32"):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([1, 2]))


def test_cache_batch_idx_range():
    q, kc, vc = _kvcache()
    with raises(errors.SeqlenError, "cache_batch_idx", "entry 1", "0 <= cache_batch_idx[1] < 2", "got 2"):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, cache_batch_idx=np.array([0, 2], np.int32))
    with raises(errors.SeqlenError, "cache_batch_idx", "entry 0", "got -1"):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, cache_batch_idx=np.array([-1, 0], np.int32))


def test_cache_batch_without_idx():
    q, kc, vc = _kvcache()
    with raises(errors.ShapeError, "k_cache", "batch size"):
        fa.flash_attn_with_kvcache(q, kc[:1].copy(), vc[:1].copy(), cache_seqlens=3)


def test_cache_leftpad_beyond_seqlens():
    q, kc, vc = _kvcache()
    with raises(errors.SeqlenError, "cache_leftpad", "sequence 1", "cache_seqlens[1] = 4", "got 5"):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([3, 4], np.int32),
                                   cache_leftpad=np.array([1, 5], np.int32))
    with raises(errors.SeqlenError, "cache_leftpad", "sequence 0", "got -2"):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([3, 4], np.int32),
                                   cache_leftpad=np.array([-2, 0], np.int32))


@pytest.mark.parametrize("name", ["cache_leftpad", "cache_batch_idx"])
def test_paged_rejects_leftpad_and_batch_idx(name):
    q, k, v, cu_q, cu_k, table = paged()
    q4 = rand(2, 1, 4, 16)
    with raises(errors.UnsupportedError, name, "paged"):
        fa.flash_attn_with_kvcache(q4, k, v, cache_seqlens=2, block_table=table,
                                   **{name: np.zeros(2, np.int32)})


def test_paged_cache_block_ids_checked():
    q, k, v, cu_q, cu_k, table = paged()
    table = table.copy()
    table[0, 0] = 9
    with raises(errors.BlockTableError, "block_table", "entry [0, 0]"):
        fa.flash_attn_with_kvcache(rand(2, 1, 4, 16), k, v, cache_seqlens=2, block_table=table)


def test_new_k_without_v():
    q, kc, vc = _kvcache()
    with raises(errors.ArgumentError, "v:", "together"):
        fa.flash_attn_with_kvcache(q, kc, vc, k=rand(2, 1, 2, 16), cache_seqlens=1)


def test_new_k_heads():
    q, kc, vc = _kvcache()
    k_new = rand(2, 1, 1, 16)
    with raises(errors.ShapeError, "k:", "(2, 16)", "(1, 16)"):
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, k_new.copy(), cache_seqlens=1)


def test_rotary_needs_new_k():
    q, kc, vc = _kvcache()
    cos = rand(10, 8)
    with raises(errors.ArgumentError, "rotary_cos", "new keys"):
        fa.flash_attn_with_kvcache(q, kc, vc, rotary_cos=cos, rotary_sin=cos, cache_seqlens=1)


def test_rotary_pair():
    q, kc, vc = _kvcache()
    k_new = rand(2, 1, 2, 16)
    with raises(errors.ArgumentError, "rotary_sin", "together"):
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, rotary_cos=rand(10, 8), cache_seqlens=1)


def test_rotary_shapes():
    q, kc, vc = _kvcache()
    k_new = rand(2, 1, 2, 16)
    with raises(errors.ShapeError, "rotary_sin", "same shape as rotary_cos"):
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, rotary_cos=rand(10, 8),
                                   rotary_sin=rand(10, 4), cache_seqlens=1)
    with raises(errors.ShapeError, "rotary_cos", "rotary_dim", "shape[1] <= 8"):
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, rotary_cos=rand(10, 9),
                                   rotary_sin=rand(10, 9), cache_seqlens=1)
    # flash-attn's rule: a row for every position of the cache (here 10), not only the new ones.
    with raises(errors.ShapeError, "rotary_cos", "seqlen_ro >= 10", "seqlen of KV cache"):
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, rotary_cos=rand(1, 8),
                                   rotary_sin=rand(1, 8), cache_seqlens=1)


def test_cache_object_arguments_come_from_cache():
    cache = fa.PagedKVCache(num_blocks=4, page_block_size=4, num_heads_k=2, head_dim=16, dtype=np.float32)
    sid = cache.add_sequence()
    cache.append([sid], rand(1, 3, 2, 16), rand(1, 3, 2, 16))
    q = rand(1, 1, 4, 16)
    with raises(errors.ArgumentError, "cache_seqlens", "read from the PagedKVCache"):
        fa.flash_attn_with_kvcache(q, cache, None, cache_seqlens=np.array([3], np.int32))
    with raises(errors.PageSizeMismatchError, "page_block_size 16 does not match"):
        fa.FlashAttention(page_block_size=16).with_kvcache(q, cache)
