"""Issue 10, defect 6: inputs that gave an untyped or misleading error now give a typed
``FlashAttnError`` before any work, whose message names the argument, the expected and given
values and the fix.

"Before any work" is checked by replacing the CPU backend's entry point with one that fails the
test if it is reached, and by checking that caches are left bit-identical.

The checks api.py makes through ``validate.writable`` / ``validate.out_dtype`` (read-only
``out``, read-only cache with new k/v, ``out`` dtype) are tested both directly and end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import _backend_cpu, errors, validate
from helpers import raises_explained

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def dense(B=1, Sq=3, Sk=5, H=4, Hk=2, D=16):
    return rand(B, Sq, H, D), rand(B, Sk, Hk, D), rand(B, Sk, Hk, D)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the CPU backend is reached (the error must come before any work)."""

    def reached(problem):
        raise AssertionError("the backend ran: the error was raised after the computation")

    monkeypatch.setattr(_backend_cpu, "run_attention", reached)


def typed(cls, *fragments, absent=()):
    """pytest.raises(cls) whose message has every fragment, none of ``absent``, a fix, and the
    expected and given values (helpers.py)."""
    return raises_explained(cls, *fragments, absent=absent, expected_and_got=True)


# -- window_size ----------------------------------------------------------------------------


@pytest.mark.parametrize("window, fragments", [
    ((2**63, 0), ("left", "2147483647", "9223372036854775808", "-1 for no limit")),
    ((0, 2**31), ("right", "2147483648")),
    ((-(2**63), 0), ("left", "-9223372036854775808")),
    ((2**64, 2**64), ("left",)),
])
def test_window_size_out_of_range(no_work, window, fragments):
    """(2**63, 0) was an OverflowError / TypingError from Numba (or silently wrong)."""
    q, k, v = dense()
    with typed(errors.ArgumentError, "window_size", *fragments):
        fa.flash_attn_func(q, k, v, window_size=window)


@pytest.mark.parametrize("window", [(True, False), (np.True_, 0), (0, False)])
def test_window_size_bools(no_work, window):
    """Bools are ints to Python; window_size=(True, False) is a mistake, not (1, 0)."""
    q, k, v = dense()
    with typed(errors.ArgumentError, "window_size", "bool", "causal=True"):
        fa.flash_attn_func(q, k, v, window_size=window)


def test_window_size_checked_before_the_cache_is_written(no_work):
    q = rand(1, 1, 4, 16)
    k_cache, v_cache = np.zeros((1, 8, 2, 16), np.float32), np.zeros((1, 8, 2, 16), np.float32)
    with typed(errors.ArgumentError, "window_size"):
        fa.flash_attn_with_kvcache(q, k_cache, v_cache, k=rand(1, 1, 2, 16), v=rand(1, 1, 2, 16),
                                   cache_seqlens=np.array([3], np.int32), window_size=(2**63, 0))
    assert not k_cache.any() and not v_cache.any()
    with typed(errors.ArgumentError, "window_size"):
        fa.FlashAttention(window_size=(False, 2**40))


def test_window_size_largest_side_works():
    """2**31 - 1 is accepted, and means the same as unlimited for real sequences."""
    q, k, v = dense()
    wide = fa.flash_attn_func(q, k, v, window_size=(2**31 - 1, np.int64(2**31 - 1)))
    np.testing.assert_array_equal(wide, fa.flash_attn_func(q, k, v))


# -- head dims and heads --------------------------------------------------------------------


def test_head_dim_zero(no_work):
    """head_dim=0 said "supports head dimension at most 256"."""
    q, k, v = (np.zeros((1, 3, 4, 0), np.float32), np.zeros((1, 5, 2, 0), np.float32),
               np.zeros((1, 5, 2, 0), np.float32))
    with typed(errors.ShapeError, "q", "at least 1", "head_dim 0", absent=("at most",)):
        fa.flash_attn_func(q, k, v)


def test_head_dim_above_512_still_says_at_most(no_work):
    q, k, v = (np.zeros((1, 3, 4, 600), np.float32), np.zeros((1, 5, 2, 600), np.float32),
               np.zeros((1, 5, 2, 600), np.float32))
    with typed(errors.UnsupportedError, "at most 512", "600"):
        fa.flash_attn_func(q, k, v)


@pytest.mark.parametrize("layout", ["dense", "varlen", "kvcache"])
def test_zero_kv_heads(no_work, layout):
    """Hk=0 was a LayoutError about the (meaningless) strides of the empty k."""
    with typed(errors.ShapeError, "k", "at least one key/value head", "Hk=0",
               absent=("contiguous",)):
        if layout == "dense":
            fa.flash_attn_func(rand(1, 3, 4, 16), rand(1, 5, 0, 16), rand(1, 5, 0, 16))
        elif layout == "varlen":
            cu = np.array([0, 3], np.int32)
            fa.flash_attn_varlen_func(rand(3, 4, 16), rand(3, 0, 16), rand(3, 0, 16), cu, cu, 3, 3)
        else:
            fa.flash_attn_with_kvcache(rand(1, 1, 4, 16), rand(1, 8, 0, 16), rand(1, 8, 0, 16),
                                       cache_seqlens=np.array([3], np.int32))


# -- softmax_scale --------------------------------------------------------------------------


@pytest.mark.parametrize("scale, fragments", [
    ("0.5", ("str '0.5'", "float('0.5')")),
    (np.array(0.5), ("0-d numpy.ndarray", "float64", "float(scale)")),
    (np.array([0.5], np.float32), ("1-d numpy.ndarray",)),
    (True, ("bool",)),
])
def test_softmax_scale_not_a_number(no_work, scale, fragments):
    """A string or a 0-d array read "got 0.5": the message now says what was given."""
    q, k, v = dense()
    with typed(errors.ArgumentError, "softmax_scale", "real number", *fragments):
        fa.flash_attn_func(q, k, v, softmax_scale=scale)


def test_softmax_scale_numpy_scalar_accepted():
    q, k, v = dense()
    np.testing.assert_array_equal(fa.flash_attn_func(q, k, v, softmax_scale=np.float32(0.25)),
                                  fa.flash_attn_func(q, k, v, softmax_scale=0.25))


# -- seqused_k ------------------------------------------------------------------------------


def test_negative_seqused_k_contiguous(no_work):
    """It was reported as "uses more keys than cu_seqlens_k gives it"."""
    cu_q, cu_k = np.array([0, 3, 6], np.int32), np.array([0, 5, 9], np.int32)
    with typed(errors.SeqlenError, "seqused_k", "sequence 1", "negative", "-2",
               absent=("more keys",)):
        fa.flash_attn_varlen_func(rand(6, 4, 16), rand(9, 2, 16), rand(9, 2, 16), cu_q, cu_k, 3, 5,
                                  seqused_k=np.array([5, -2], np.int32))


def test_negative_seqused_k_paged(no_work):
    cu_q, cu_k = np.array([0, 3], np.int32), np.array([0, 5], np.int32)
    pages = rand(4, 4, 2, 16)
    with typed(errors.SeqlenError, "seqused_k", "negative", "-1", absent=("more keys",)):
        fa.flash_attn_varlen_func(rand(3, 4, 16), pages, pages, cu_q, cu_k, 3, 5,
                                  block_table=np.array([[0, 1]], np.int32),
                                  seqused_k=np.array([-1], np.int32))


def test_seqused_within_unit():
    validate.seqused_within(np.array([0, 5]), np.array([3, 5]))
    with typed(errors.SeqlenError, "seqused_k", "negative"):
        validate.seqused_within(np.array([-1, 5]), np.array([3, 5]))
    with typed(errors.SeqlenError, "seqused_k", "more keys"):
        validate.seqused_within(np.array([0, 6]), np.array([3, 5]))


# -- PagedKVCache head_dim ------------------------------------------------------------------


@pytest.mark.parametrize("head_dim", [513, 1024])
def test_paged_kv_cache_head_dim_above_512(head_dim):
    """PagedKVCache(head_dim=1024) is refused at construction, not at attention time."""
    with typed(errors.UnsupportedError, "head_dim", "not supported", "512", str(head_dim)):
        fa.PagedKVCache(4, 16, 2, head_dim, np.float32)


def test_paged_kv_cache_head_dim_256_accepted():
    cache = fa.PagedKVCache(2, 4, 1, 256, np.float32)
    ids = [cache.add_sequence()]
    cache.append(ids, rand(1, 3, 1, 256), rand(1, 3, 1, 256))
    out = fa.flash_attn_with_kvcache(rand(1, 1, 2, 256), cache, None, seq_ids=ids)
    assert out.shape == (1, 1, 2, 256) and np.isfinite(out).all()


def test_paged_kv_cache_head_dim_zero_still_an_argument_error():
    with typed(errors.ArgumentError, "head_dim", ">= 1"):
        fa.PagedKVCache(4, 16, 2, 0, np.float32)


# -- out dtype ------------------------------------------------------------------------------


def test_out_wrong_dtype(no_work):
    """It was reported as "query and key/value must have the same dtype"."""
    q, k, v = dense()
    with typed(errors.DTypeError, "out", "output buffer", "float32", "float16",
               absent=("query and key/value",)):
        fa.flash_attn_func(q, k, v, out=np.empty(q.shape, np.float16))


def test_out_dtype_unit():
    q = np.zeros((2, 3), np.float32)
    validate.out_dtype(None, q)
    validate.out_dtype(np.zeros((2, 3), np.float32), q)
    with typed(errors.DTypeError, "out", "q's dtype", "bfloat16"):
        from cupy_flashattn._arrays import BFLOAT16

        validate.out_dtype(np.zeros((2, 3), BFLOAT16), q)


# -- read-only arrays that a call writes ----------------------------------------------------


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def test_writable_unit():
    validate.writable("out", None, "fix")
    validate.writable("out", np.zeros(3), "fix")
    with typed(errors.ReadOnlyError, "out", "read-only", "writeable", "pass a writeable out"):
        validate.writable("out", _read_only(np.zeros(3)), "pass a writeable out")
    with typed(errors.ReadOnlyError, "k_cache"):
        validate.writable("k_cache", np.broadcast_to(np.zeros(3), (2, 3)), "copy it")
    assert issubclass(errors.ReadOnlyError, errors.LayoutError)
    assert issubclass(errors.ReadOnlyError, ValueError)  # numpy's own error is a ValueError


def test_paged_kv_cache_read_only_pool():
    """Appending into a read-only pool: typed, and nothing allocated or written."""
    cache = fa.PagedKVCache(4, 4, 2, 16, np.float32)
    ids = [cache.add_sequence()]
    cache.k_pages.flags.writeable = False
    free = cache.num_free_blocks
    with typed(errors.ReadOnlyError, "cache.k_pages", "flags.writeable"):
        cache.append(ids, rand(1, 3, 2, 16), rand(1, 3, 2, 16))
    assert cache.num_free_blocks == free and int(cache.seqlens(ids)[0]) == 0
    with typed(errors.ReadOnlyError, "read-only"):  # names k_cache or cache.k_pages
        fa.flash_attn_with_kvcache(rand(1, 1, 4, 16), cache, None, k=rand(1, 1, 2, 16),
                                   v=rand(1, 1, 2, 16), seq_ids=ids)
    assert int(cache.seqlens(ids)[0]) == 0 and not cache.v_pages.any()


# api.py calls validate.writable for `out` and for a cache that receives new k/v, and
# validate.out_dtype for `out`, before any work.


def test_read_only_out(no_work):
    """It raised numpy's ValueError "assignment destination is read-only" after computing."""
    q, k, v = dense()
    with typed(errors.ReadOnlyError, "out", "read-only"):
        fa.flash_attn_func(q, k, v, out=_read_only(np.empty_like(q)))


@pytest.mark.parametrize("which", ["k_cache", "v_cache"])
def test_read_only_cache_with_new_kv(no_work, which):
    """It raised a ValueError from deep inside rotary's append."""
    caches = {"k_cache": np.zeros((1, 8, 2, 16), np.float32),
              "v_cache": np.zeros((1, 8, 2, 16), np.float32)}
    caches[which] = _read_only(caches[which])
    with typed(errors.ReadOnlyError, which, "read-only"):
        fa.flash_attn_with_kvcache(rand(1, 1, 4, 16), caches["k_cache"], caches["v_cache"],
                                   k=rand(1, 1, 2, 16), v=rand(1, 1, 2, 16),
                                   cache_seqlens=np.array([3], np.int32))
    assert not caches["k_cache"].any() and not caches["v_cache"].any()


def test_read_only_cache_without_new_kv_is_fine():
    """Attending to a read-only cache (no append) is legal."""
    kc, vc = _read_only(rand(1, 8, 2, 16)), _read_only(rand(1, 8, 2, 16))
    out = fa.flash_attn_with_kvcache(rand(1, 1, 4, 16), kc, vc,
                                     cache_seqlens=np.array([5], np.int32))
    assert np.isfinite(out).all()


@pytest.mark.parametrize("paged", [False, True])
def test_missing_cu_seqlens_k(no_work, paged):
    """cu_seqlens_k=None reached ``None.ndim`` (an AttributeError) before this check."""
    cu_q = np.array([0, 3], np.int32)
    kv = rand(4, 4, 2, 16) if paged else rand(5, 2, 16)
    kw = dict(block_table=np.array([[0, 1]], np.int32), seqused_k=np.array([5], np.int32)) if paged else {}
    with typed(errors.ArgumentError, "cu_seqlens_k", "is required", "None"):
        fa.flash_attn_varlen_func(rand(3, 4, 16), kv, kv, cu_q, None, 3, 5, **kw)
