"""Rotary embedding and the KV-cache append helpers of flash_attn_with_kvcache."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupy_flashattn.errors import BlockTableError, DTypeError, SeqlenError, ShapeError
from cupy_flashattn.rotary import append_kv_contiguous, append_kv_paged, apply_rotary


def _tables(seqlen_ro, rotary_dim, base=10000.0):
    """Standard RoPE tables (seqlen_ro, rotary_dim / 2), float64."""
    inv_freq = 1.0 / base ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.outer(np.arange(seqlen_ro), inv_freq)
    return np.cos(angles), np.sin(angles)


def _rotary_loops(x, cos, sin, positions, interleaved):
    """Independent float64 statement: rotate each pair (a, b) of dims by the angle of the
    token's position, a' = a cos - b sin, b' = b cos + a sin."""
    x = x.astype(np.float64)
    out = x.copy()
    half = cos.shape[1]
    B, S = x.shape[:2]
    for b in range(B):
        for s in range(S):
            p = positions[b, s]
            for j in range(half):
                da, db = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
                c, sn = float(cos[p, j]), float(sin[p, j])
                a, bb = x[b, s, :, da].copy(), x[b, s, :, db].copy()
                out[b, s, :, da] = a * c - bb * sn
                out[b, s, :, db] = bb * c + a * sn
    return out


# -- apply_rotary -----------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_frac", [1, 2])  # rotary_dim = D and D / 2
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rotary_matches_formula(interleaved, rotary_frac, dtype):
    rng = np.random.default_rng(0)
    B, S, H, D = 2, 5, 3, 16
    rotary_dim = D // rotary_frac
    cos, sin = _tables(40, rotary_dim)
    x = rng.standard_normal((B, S, H, D)).astype(dtype)
    positions = rng.integers(0, 40, (B, S)).astype(np.int32)
    out = apply_rotary(x, cos, sin, positions, interleaved)
    ref = _rotary_loops(x, cos, sin, positions, interleaved)
    assert out.dtype == x.dtype and out.shape == x.shape
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
    # Dims past rotary_dim are copied bit for bit; x itself is untouched.
    np.testing.assert_array_equal(out[..., rotary_dim:], x[..., rotary_dim:])
    assert not np.shares_memory(out, x)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_rotary_half_precision_rounds_once(dtype):
    """float16/bf16: computed in float32 and rounded once, like flash-attn's kernel, so it equals
    the float64 formula (on the same rounded inputs) rounded to dtype, up to one ulp."""
    rng = np.random.default_rng(1)
    B, S, H, D = 2, 4, 2, 32
    cos, sin = _tables(16, D)
    cos_t, sin_t = cos.astype(dtype), sin.astype(dtype)
    x = rng.standard_normal((B, S, H, D)).astype(dtype)
    positions = np.tile(np.arange(S, dtype=np.int32) + 3, (B, 1))
    for interleaved in (False, True):
        out = apply_rotary(x, cos_t, sin_t, positions, interleaved)
        ref = _rotary_loops(x, cos_t.astype(np.float64), sin_t.astype(np.float64), positions,
                            interleaved)
        # One ulp of dtype at each reference value: eps * 2**exponent.
        eps = float(ml_dtypes.finfo(dtype).eps)
        ulp = eps * 2.0 ** np.floor(np.log2(np.maximum(np.abs(ref), 1e-30)))
        assert out.dtype == np.dtype(dtype)
        assert np.all(np.abs(out.astype(np.float64) - ref) <= ulp + 1e-7)


def test_rotary_position_zero_is_identity_and_norm_preserved():
    rng = np.random.default_rng(2)
    cos, sin = _tables(8, 8)
    x = rng.standard_normal((1, 3, 2, 8))
    out = apply_rotary(x, cos, sin, np.zeros((1, 3), np.int64), False)
    np.testing.assert_array_equal(out, x)
    out = apply_rotary(x, cos, sin, np.array([[1, 5, 7]]), True)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)


def test_rotary_errors():
    cos, sin = _tables(8, 8)
    x = np.zeros((1, 2, 1, 8), np.float32)
    pos = np.zeros((1, 2), np.int32)
    with pytest.raises(SeqlenError) as info:
        apply_rotary(x, cos, sin, np.array([[0, 8]], np.int32), False)
    _assert_explained(info, "positions", "seqlen_ro", "got 8")
    with pytest.raises(SeqlenError):
        apply_rotary(x, cos, sin, np.array([[-1, 0]], np.int32), False)
    with pytest.raises(ShapeError) as info:
        apply_rotary(x, *_tables(8, 10), pos, False)  # rotary_dim 10 > D = 8
    _assert_explained(info, "cos", "rotary_dim")
    with pytest.raises(ShapeError) as info:
        apply_rotary(x, cos[:0], sin[:0], pos, False)
    _assert_explained(info, "cos", "seqlen_ro >= 1")
    with pytest.raises(ShapeError) as info:
        apply_rotary(x, cos, sin[:, :2], pos, False)
    _assert_explained(info, "sin", "same shape as cos")
    with pytest.raises(ShapeError) as info:
        apply_rotary(x, cos, sin, np.zeros((2, 1), np.int32), False)
    _assert_explained(info, "positions", "(B, S)")
    with pytest.raises(ShapeError) as info:
        apply_rotary(x[0], cos, sin, pos, False)
    _assert_explained(info, "x", "rank 4")
    with pytest.raises(DTypeError) as info:
        apply_rotary(x, cos, sin, pos.astype(np.float32), False)
    _assert_explained(info, "positions", "int32")
    with pytest.raises(DTypeError) as info:
        apply_rotary(x.astype(np.int16), cos, sin, pos, False)
    _assert_explained(info, "x", "unsupported dtype")


# -- append_kv_contiguous ---------------------------------------------------------------------


def _assert_explained(info, *parts):
    msg = str(info.value)
    assert "expected" in msg and "got" in msg and "Fix:" in msg, msg
    for part in parts:
        assert part in msg, msg


def _filled(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("with_batch_idx", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_append_contiguous_writes_exactly_the_new_slots(with_batch_idx, dtype):
    rng = np.random.default_rng(3)
    B_cache, S_cache, Hk, D, B, S_new = 5, 12, 2, 8, 3, 4
    k_cache = _filled(rng, (B_cache, S_cache, Hk, D), dtype)
    v_cache = _filled(rng, (B_cache, S_cache, Hk, D), dtype)
    k_new, v_new = _filled(rng, (B, S_new, Hk, D), dtype), _filled(rng, (B, S_new, Hk, D), dtype)
    seqlens = np.array([0, 5, S_cache - S_new], np.int32)  # empty, middle, exactly full
    batch_idx = np.array([4, 0, 2], np.int32) if with_batch_idx else None
    expected_k, expected_v = k_cache.copy(), v_cache.copy()
    for b in range(B):
        row = batch_idx[b] if with_batch_idx else b
        for i in range(S_new):
            expected_k[row, seqlens[b] + i] = k_new[b, i]
            expected_v[row, seqlens[b] + i] = v_new[b, i]
    append_kv_contiguous(k_cache, v_cache, k_new, v_new, seqlens, batch_idx)
    np.testing.assert_array_equal(k_cache.view(np.uint8), expected_k.view(np.uint8))
    np.testing.assert_array_equal(v_cache.view(np.uint8), expected_v.view(np.uint8))


def test_append_contiguous_into_strided_cache():
    """A cache that is a view (e.g. one layer of a bigger buffer) is written in place."""
    rng = np.random.default_rng(4)
    buffer = _filled(rng, (2, 3, 10, 2, 4))  # (layers, B_cache, S_cache, Hk, D)
    k_cache, v_cache = buffer[0], buffer[1]
    before = buffer.copy()
    k_new, v_new = _filled(rng, (1, 2, 2, 4)), _filled(rng, (1, 2, 2, 4))
    seqlens, batch_idx = np.array([7], np.int32), np.array([1], np.int32)
    append_kv_contiguous(k_cache, v_cache, k_new, v_new, seqlens, batch_idx)
    before[0, 1, 7:9] = k_new[0]
    before[1, 1, 7:9] = v_new[0]
    np.testing.assert_array_equal(buffer, before)


def test_append_contiguous_errors_leave_cache_unchanged():
    rng = np.random.default_rng(5)
    k_cache, v_cache = _filled(rng, (2, 6, 1, 4)), _filled(rng, (2, 6, 1, 4))
    snapshot = k_cache.copy(), v_cache.copy()
    k_new = _filled(rng, (2, 3, 1, 4))

    def check(error, *parts, seqlens=(0, 0), batch_idx=None, k=k_new, v=k_new):
        with pytest.raises(error) as info:
            append_kv_contiguous(k_cache, v_cache, k, v, np.array(seqlens, np.int32), batch_idx)
        _assert_explained(info, *parts)
        np.testing.assert_array_equal(k_cache, snapshot[0])
        np.testing.assert_array_equal(v_cache, snapshot[1])

    check(SeqlenError, "cache_seqlens", "4 + 3 = 7", "<= S_cache", seqlens=(0, 4))
    check(SeqlenError, "negative length", seqlens=(-1, 0))
    check(ShapeError, "cache_batch_idx", "B_cache", batch_idx=np.array([0, 2], np.int32))
    check(ShapeError, "cache_batch_idx", batch_idx=np.array([0], np.int32))
    check(ShapeError, "cache_seqlens", seqlens=(0, 0, 0))
    check(DTypeError, "k_new", k=k_new.astype(np.float16))
    check(ShapeError, "v_new", v=k_new[:, :2])
    check(ShapeError, "k_new", k=k_new[..., :2], v=k_new[..., :2])
    with pytest.raises(DTypeError) as info:
        append_kv_contiguous(k_cache, v_cache, k_new, k_new, np.zeros(2, np.float32))
    _assert_explained(info, "cache_seqlens", "integers")


# -- append_kv_paged --------------------------------------------------------------------------


@pytest.mark.parametrize("P", [1, 3, 16])
def test_append_paged_writes_exactly_the_new_slots(P):
    rng = np.random.default_rng(P)
    B, S_new, Hk, D, width = 3, 5, 2, 8, 6
    num_blocks = B * width + 2
    k_pages, v_pages = _filled(rng, (num_blocks, P, Hk, D)), _filled(rng, (num_blocks, P, Hk, D))
    k_new, v_new = _filled(rng, (B, S_new, Hk, D)), _filled(rng, (B, S_new, Hk, D))
    table = rng.permutation(num_blocks)[: B * width].reshape(B, width).astype(np.int32)
    capacity = width * P
    seqlens = np.array([0, min(P + 1, capacity - S_new), capacity - S_new], np.int32)
    seqlens = np.maximum(seqlens, 0)
    # Entries past each sequence's last used page may hold anything: only used ones are read.
    used = -(-(seqlens + S_new) // P)
    for b in range(B):
        table[b, used[b]:] = -7
    expected_k, expected_v = k_pages.copy(), v_pages.copy()
    for b in range(B):
        for i in range(S_new):
            p = seqlens[b] + i
            expected_k[table[b, p // P], p % P] = k_new[b, i]
            expected_v[table[b, p // P], p % P] = v_new[b, i]
    append_kv_paged(k_pages, v_pages, table, k_new, v_new, seqlens)
    np.testing.assert_array_equal(k_pages, expected_k)
    np.testing.assert_array_equal(v_pages, expected_v)


def test_append_paged_matches_pagedkvcache_layout():
    """Appending through the helper and through PagedKVCache gives the same pools."""
    from cupy_flashattn.kvcache import PagedKVCache

    rng = np.random.default_rng(6)
    cache = PagedKVCache(12, 4, 2, 8, np.float32, max_blocks_per_seq=4)
    ids = [cache.add_sequence(), cache.add_sequence()]
    cache.append(ids, _filled(rng, (2, 6, 2, 8)), _filled(rng, (2, 6, 2, 8)))
    k_pages, v_pages = cache.k_pages.copy(), cache.v_pages.copy()
    # Reserve room for 5 more tokens per sequence in the cache, then compare both writers.
    k_new, v_new = _filled(rng, (2, 5, 2, 8)), _filled(rng, (2, 5, 2, 8))
    seqlens = cache.seqlens(ids)
    cache.append(ids, k_new, v_new)
    append_kv_paged(k_pages, v_pages, cache.block_table(ids), k_new, v_new, seqlens)
    np.testing.assert_array_equal(k_pages, cache.k_pages)
    np.testing.assert_array_equal(v_pages, cache.v_pages)


def test_append_paged_errors_leave_pool_unchanged():
    rng = np.random.default_rng(7)
    P = 4
    k_pages, v_pages = _filled(rng, (5, P, 1, 4)), _filled(rng, (5, P, 1, 4))
    snapshot = k_pages.copy(), v_pages.copy()
    k_new = _filled(rng, (2, 3, 1, 4))
    good_table = np.array([[0, 1], [2, 3]], np.int32)

    def check(error, *parts, seqlens=(0, 0), table=good_table, k=k_new):
        with pytest.raises(error) as info:
            append_kv_paged(k_pages, v_pages, table, k, k, np.array(seqlens, np.int32))
        _assert_explained(info, *parts)
        np.testing.assert_array_equal(k_pages, snapshot[0])
        np.testing.assert_array_equal(v_pages, snapshot[1])

    check(SeqlenError, "cache_seqlens", "max_blocks_per_seq * page_block_size", seqlens=(0, 6))
    check(SeqlenError, "negative length", seqlens=(0, -2))
    bad = np.array([[0, 1], [2, 5]], np.int32)
    check(BlockTableError, "entry [1, 1]", "[0, 5)", seqlens=(0, 3), table=bad)
    check(BlockTableError, "entry [0, 0]", table=np.array([[-1, 1], [2, 3]], np.int32))
    check(BlockTableError, "block_table", table=good_table[:1])
    check(ShapeError, "block_table", table=good_table[0])
    check(DTypeError, "block_table", table=good_table.astype(np.float32))
    check(ShapeError, "k_new", "rank 4", k=k_new[0])


# -- CuPy (skipped without a GPU): same results, and out-of-range writes are dropped ----------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_cupy_rotary_matches_numpy_and_leaves_unknown_positions(dtype):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(40)
    cos, sin = (t.astype(np.float32) for t in _tables(16, 8))
    x = rng.standard_normal((2, 3, 2, 16)).astype(dtype)
    positions = np.array([[0, 5, 15], [3, 16, -1]], np.int32)  # last two are outside the tables
    for interleaved in (False, True):
        ok = np.where((positions >= 0) & (positions < 16), positions, 0)
        host = apply_rotary(x, cos, sin, ok, interleaved)
        host[1, 1:] = x[1, 1:]  # unrotated, as flash-attn's Triton kernel leaves them
        dev = apply_rotary(*(cp.asarray(a) for a in (x, cos, sin, positions)), interleaved)
        assert isinstance(dev, cp.ndarray) and dev.dtype == np.dtype(dtype)
        np.testing.assert_allclose(cp.asnumpy(dev).astype(np.float64), host.astype(np.float64),
                                   rtol=1e-2 if dtype != np.float32 else 1e-6, atol=1e-6)


def _expected_drop(cache, new, rows, positions, valid):
    out = cache.copy()
    for b, i in zip(*np.nonzero(valid)):
        out[rows[b, i], positions[b, i]] = new[b, i]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_cupy_append_contiguous_drops_out_of_range(dtype):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(41)
    buffer = _filled(rng, (2, 4, 6, 2, 8), dtype)  # strided caches: (k|v, B_cache, S_cache, Hk, D)
    k_new, v_new = _filled(rng, (4, 3, 2, 8), dtype), _filled(rng, (4, 3, 2, 8), dtype)
    seqlens = np.array([0, 4, -1, 2], np.int32)  # fits, overflows by 1, starts below 0, fits
    batch_idx = np.array([3, 1, 0, 7], np.int32)  # the last row does not exist
    pos = seqlens[:, None] + np.arange(3)
    rows = np.broadcast_to(batch_idx[:, None], pos.shape)
    valid = (pos >= 0) & (pos < 6) & (rows < 4)
    expected_k = _expected_drop(buffer[0], k_new, rows, pos, valid)
    expected_v = _expected_drop(buffer[1], v_new, rows, pos, valid)
    dev = cp.asarray(buffer)
    append_kv_contiguous(dev[0], dev[1], cp.asarray(k_new), cp.asarray(v_new),
                         cp.asarray(seqlens), cp.asarray(batch_idx))
    got = cp.asnumpy(dev)
    np.testing.assert_array_equal(got[0].view(np.uint8), expected_k.view(np.uint8))
    np.testing.assert_array_equal(got[1].view(np.uint8), expected_v.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 4])
def test_cupy_append_paged_drops_out_of_range(P):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(42 + P)
    num_blocks, width, S_new = 12, 3, 2
    k_pages, v_pages = _filled(rng, (num_blocks, P, 1, 4)), _filled(rng, (num_blocks, P, 1, 4))
    k_new, v_new = _filled(rng, (4, S_new, 1, 4)), _filled(rng, (4, S_new, 1, 4))
    table = np.array([[0, 1, 2], [3, 4, 5], [6, 99, -3], [9, 10, 11]], np.int32)
    seqlens = np.array([0, width * P - 1, 0, -1], np.int32)
    pos = seqlens[:, None] + np.arange(S_new)
    col = pos // P
    pages = np.take_along_axis(table, np.clip(col, 0, width - 1), axis=1)
    valid = (pos >= 0) & (col < width) & (pages >= 0) & (pages < num_blocks)
    expected_k = _expected_drop(k_pages, k_new, pages, pos % P, valid)
    expected_v = _expected_drop(v_pages, v_new, pages, pos % P, valid)
    dk, dv = cp.asarray(k_pages), cp.asarray(v_pages)
    dev_args = (cp.asarray(a) for a in (table, k_new, v_new, seqlens))
    append_kv_paged(dk, dv, *dev_args)
    np.testing.assert_array_equal(cp.asnumpy(dk), expected_k)
    np.testing.assert_array_equal(cp.asnumpy(dv), expected_v)
