"""PagedKVCache: page allocation, exact write-back through the block table, exhaustion, errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupy_flashattn.errors import (
    ArgumentError,
    CacheExhaustedError,
    DeviceError,
    DTypeError,
    SeqlenError,
    ShapeError,
)
from cupy_flashattn.kvcache import PagedKVCache

from helpers import cu_seqlens

HK, D = 2, 8


def _tokens(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _read_back(cache, seq_id):
    """K and V of one sequence, gathered through the block table the kernels use."""
    table = cache.block_table([seq_id])[0]
    length = int(cache.seqlens([seq_id])[0])
    pos = np.arange(length)
    P = cache.page_block_size
    pages = table[pos // P]
    return cache.k_pages[pages, pos % P], cache.v_pages[pages, pos % P]


def _assert_contents(cache, expected):
    """expected: {seq_id: (k (L, Hk, D), v (L, Hk, D))}; compares bit for bit."""
    for seq_id, (k, v) in expected.items():
        got_k, got_v = _read_back(cache, seq_id)
        np.testing.assert_array_equal(got_k.view(np.uint8), k.view(np.uint8))
        np.testing.assert_array_equal(got_v.view(np.uint8), v.view(np.uint8))


def _pages_in_use(cache):
    return cache.num_blocks - cache.num_free_blocks


def _snapshot(cache):
    return (
        cache.k_pages.copy(),
        cache.v_pages.copy(),
        cache.block_table(),
        cache.seqlens(),
        cache.num_free_blocks,
        cache.seq_ids,
    )


def _assert_unchanged(cache, snap):
    k, v, table, lens, free, ids = snap
    np.testing.assert_array_equal(cache.k_pages, k)
    np.testing.assert_array_equal(cache.v_pages, v)
    np.testing.assert_array_equal(cache.block_table(), table)
    np.testing.assert_array_equal(cache.seqlens(), lens)
    assert cache.num_free_blocks == free
    assert cache.seq_ids == ids


# -- growth and exact contents ----------------------------------------------------------------


@pytest.mark.parametrize("P", [1, 16, 48, 256])
def test_growth_across_page_boundaries(P):
    rng = np.random.default_rng(P)
    cache = PagedKVCache(64, P, HK, D, np.float32, max_blocks_per_seq=64)
    ids = [cache.add_sequence() for _ in range(3)]
    expected = {i: (np.zeros((0, HK, D), np.float32),) * 2 for i in ids}
    # Chunk sizes chosen to land exactly on, just before and just after page boundaries.
    for step in [1, P - 1, 1, P, P + 1, 2, 3 * P // 2 + 1]:
        step = max(step, 0)
        k = _tokens(rng, 3, step, HK, D)
        v = _tokens(rng, 3, step, HK, D)
        cache.append(ids, k, v)
        for b, i in enumerate(ids):
            old_k, old_v = expected[i]
            expected[i] = (np.concatenate([old_k, k[b]]), np.concatenate([old_v, v[b]]))
        _assert_contents(cache, expected)
        lengths = [len(expected[i][0]) for i in ids]
        np.testing.assert_array_equal(cache.seqlens(ids), lengths)
        assert _pages_in_use(cache) == sum(-(-n // P) for n in lengths)


def test_block_table_layout():
    cache = PagedKVCache(10, 4, HK, D, np.float16, max_blocks_per_seq=5)
    a, b = cache.add_sequence(), cache.add_sequence()
    rng = np.random.default_rng(0)
    k = _tokens(rng, 2, 5, HK, D, dtype=np.float16)
    cache.append([a, b], k, -k)
    table = cache.block_table([b, a])
    assert table.dtype == np.int32 and table.shape == (2, 5)
    # Each sequence owns ceil(5 / 4) = 2 distinct pages; unused entries are 0.
    assert np.all(table[:, 2:] == 0)
    assert len({*table[0, :2], *table[1, :2]}) == 4
    lens = cache.seqlens([b, a])
    assert lens.dtype == np.int32 and lens.tolist() == [5, 5]
    assert cache.seq_ids == [a, b]
    np.testing.assert_array_equal(cache.block_table(), cache.block_table([a, b]))


def test_properties():
    cache = PagedKVCache(7, 3, 4, 16, ml_dtypes.bfloat16)
    dims = (cache.num_blocks, cache.page_block_size, cache.num_heads_k, cache.head_dim)
    assert dims == (7, 3, 4, 16)
    assert cache.dtype == np.dtype(ml_dtypes.bfloat16)
    assert cache.max_blocks_per_seq == 7
    assert cache.num_free_blocks == 7
    assert cache.xp is np
    assert cache.seq_ids == []
    assert cache.k_pages.shape == cache.v_pages.shape == (7, 3, 4, 16)
    assert cache.k_pages.dtype == np.dtype(ml_dtypes.bfloat16)
    assert "PagedKVCache(" in repr(cache)
    assert PagedKVCache(1, 1, 1, 1, "bfloat16").dtype == np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_exact_round_trip_every_dtype(dtype):
    rng = np.random.default_rng(1)
    cache = PagedKVCache(8, 5, HK, D, dtype)
    s = cache.add_sequence()
    k, v = _tokens(rng, 1, 13, HK, D, dtype=dtype), _tokens(rng, 1, 13, HK, D, dtype=dtype)
    cache.append(s, k, v)
    _assert_contents(cache, {s: (k[0], v[0])})


def test_varlen_append():
    rng = np.random.default_rng(2)
    P = 4
    cache = PagedKVCache(16, P, HK, D, np.float32)
    ids = [cache.add_sequence() for _ in range(4)]
    expected = {i: [np.zeros((0, HK, D), np.float32)] * 2 for i in ids}
    for counts in ([3, 0, 9, 4], [1, 1, 0, 5], [0, 0, 0, 0], [4, 7, 2, 1]):
        cu = cu_seqlens(counts)
        k, v = _tokens(rng, int(cu[-1]), HK, D), _tokens(rng, int(cu[-1]), HK, D)
        # Alternate a list and an int32 array for cu_seqlens: both are host sequences.
        cache.append(ids, k, v, cu_seqlens=cu if counts[0] % 2 else cu.tolist())
        for b, i in enumerate(ids):
            rows = slice(cu[b], cu[b + 1])
            old_k, old_v = expected[i]
            expected[i] = [np.concatenate([old_k, k[rows]]), np.concatenate([old_v, v[rows]])]
        _assert_contents(cache, expected)
    assert cache.seqlens(ids).tolist() == [8, 8, 11, 10]
    assert _pages_in_use(cache) == 2 + 2 + 3 + 3


def test_append_subset_and_single_int_id():
    rng = np.random.default_rng(3)
    cache = PagedKVCache(8, 2, HK, D, np.float32)
    a, b = cache.add_sequence(), cache.add_sequence()
    ka = _tokens(rng, 1, 3, HK, D)
    cache.append(a, ka, ka + 1)
    kb = _tokens(rng, 1, 1, HK, D)
    cache.append([b], kb, kb + 1)
    _assert_contents(cache, {a: (ka[0], ka[0] + 1), b: (kb[0], kb[0] + 1)})
    assert cache.seqlens().tolist() == [3, 1]


def test_empty_append_is_a_no_op():
    cache = PagedKVCache(2, 4, HK, D, np.float32)
    s = cache.add_sequence()
    cache.append([s], np.zeros((1, 0, HK, D), np.float32), np.zeros((1, 0, HK, D), np.float32))
    assert cache.seqlens([s]).tolist() == [0] and cache.num_free_blocks == 2
    cache.append([], np.zeros((0, 3, HK, D), np.float32), np.zeros((0, 3, HK, D), np.float32))
    assert cache.block_table([]).shape == (0, 2)


# -- free and reuse ---------------------------------------------------------------------------


def test_pages_are_reused_after_free():
    rng = np.random.default_rng(4)
    P = 16
    cache = PagedKVCache(6, P, HK, D, np.float32)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append([a, b], _tokens(rng, 2, 3 * P, HK, D), _tokens(rng, 2, 3 * P, HK, D))
    assert cache.num_free_blocks == 0
    pages_a = set(cache.block_table([a])[0, :3].tolist())
    cache.free(a)
    assert cache.num_free_blocks == 3 and cache.seq_ids == [b]
    c = cache.add_sequence()
    assert c not in (a, b)  # ids are never reused
    k, v = _tokens(rng, 1, 2 * P + 1, HK, D), _tokens(rng, 1, 2 * P + 1, HK, D)
    cache.append([c], k, v)
    assert set(cache.block_table([c])[0, :3].tolist()) == pages_a
    _assert_contents(cache, {c: (k[0], v[0])})
    cache.free(b)
    cache.free(c)
    assert cache.num_free_blocks == 6 and cache.seq_ids == []


# -- exhaustion leaves everything unchanged ----------------------------------------------------


def test_exhaustion_leaves_cache_unchanged():
    rng = np.random.default_rng(5)
    cache = PagedKVCache(5, 4, HK, D, np.float32)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append([a, b], _tokens(rng, 2, 6, HK, D), _tokens(rng, 2, 6, HK, D))  # 2 + 2 pages
    snap = _snapshot(cache)
    # a: 6 + 3 tokens need 1 more page (fits alone); b: 6 + 7 need 2 more; 3 > 1 free.
    # Nothing may be allocated for a either.
    with pytest.raises(CacheExhaustedError) as info:
        k = _tokens(rng, 10, HK, D)
        cache.append([a, b], k, -k, cu_seqlens=[0, 3, 10])
    _assert_unchanged(cache, snap)
    msg = str(info.value)
    assert "<= 1 new pages (the free ones, of 5)" in msg and "got 3 new pages needed" in msg
    assert "free() finished sequences" in msg and "num_blocks >= 7" in msg
    # Dense: 2 * (6 + 6) tokens need 2 more pages.
    with pytest.raises(CacheExhaustedError):
        cache.append([a, b], _tokens(rng, 2, 6, HK, D), _tokens(rng, 2, 6, HK, D))
    _assert_unchanged(cache, snap)
    # One page is still free, and a can use it.
    cache.append([a], _tokens(rng, 1, 3, HK, D), _tokens(rng, 1, 3, HK, D))
    assert cache.num_free_blocks == 0


def test_max_blocks_per_seq_exhaustion():
    rng = np.random.default_rng(6)
    cache = PagedKVCache(10, 2, HK, D, np.float32, max_blocks_per_seq=3)
    s = cache.add_sequence()
    cache.append([s], _tokens(rng, 1, 5, HK, D), _tokens(rng, 1, 5, HK, D))
    snap = _snapshot(cache)
    with pytest.raises(CacheExhaustedError) as info:
        cache.append([s], _tokens(rng, 1, 2, HK, D), _tokens(rng, 1, 2, HK, D))  # 7 tokens: 4 pages
    _assert_unchanged(cache, snap)
    assert "max_blocks_per_seq=3" in str(info.value) and "4 pages" in str(info.value)
    cache.append([s], _tokens(rng, 1, 1, HK, D), _tokens(rng, 1, 1, HK, D))  # 6 tokens fit exactly
    assert cache.seqlens([s]).tolist() == [6]


def test_failed_write_rolls_back_allocation(monkeypatch):
    """Even a failure inside the scatter itself leaves no page allocated."""
    cache = PagedKVCache(4, 2, HK, D, np.float32)
    s = cache.add_sequence()
    snap = _snapshot(cache)

    def boom(*args):
        raise MemoryError("simulated")

    monkeypatch.setattr(cache, "_scatter", boom)
    with pytest.raises(MemoryError):
        cache.append([s], np.ones((1, 3, HK, D), np.float32), np.ones((1, 3, HK, D), np.float32))
    _assert_unchanged(cache, snap)
    assert cache.block_table([s]).tolist() == [[0, 0, 0, 0]]


# -- a random model check ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    P=st.sampled_from([1, 2, 3, 5, 8]),
    num_blocks=st.integers(1, 12),
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "append", "free"]), st.integers(0, 7), st.integers(0, 9)),
        max_size=25,
    ),
)
def test_matches_a_dict_model(P, num_blocks, ops):
    """Any sequence of add/append/free behaves like a dict of growing arrays, and the pool never
    leaks pages: used pages == sum(ceil(len / P))."""
    rng = np.random.default_rng(0)
    cache = PagedKVCache(num_blocks, P, 1, 2, np.float32)
    model = {}
    for op, pick, n in ops:
        ids = list(model)
        if op == "add" or not ids:
            model[cache.add_sequence()] = np.zeros((0, 1, 2), np.float32)
            continue
        sid = ids[pick % len(ids)]
        if op == "free":
            cache.free(sid)
            del model[sid]
            continue
        k = _tokens(rng, 1, n, 1, 2)
        pages_after = -(-(len(model[sid]) + n) // P)
        pages_used = sum(-(-len(m) // P) for m in model.values())
        fits = pages_used - -(-len(model[sid]) // P) + pages_after <= num_blocks
        if fits:
            cache.append([sid], k, -k)
            model[sid] = np.concatenate([model[sid], k[0]])
        else:
            snap = _snapshot(cache)
            with pytest.raises(CacheExhaustedError):
                cache.append([sid], k, -k)
            _assert_unchanged(cache, snap)
        assert _pages_in_use(cache) == sum(-(-len(m) // P) for m in model.values())
    _assert_contents(cache, {i: (m, -m) for i, m in model.items()})
    assert cache.seq_ids == list(model)


# -- errors -----------------------------------------------------------------------------------


def _assert_explained(info, *parts):
    msg = str(info.value)
    assert "expected" in msg and "got" in msg and "Fix:" in msg, msg
    for part in parts:
        assert part in msg, msg


@pytest.mark.parametrize(
    "kwargs, error, part",
    [
        ({"num_blocks": 0}, ArgumentError, "num_blocks"),
        ({"page_block_size": -3}, ArgumentError, "page_block_size"),
        ({"num_heads_k": 2.0}, DTypeError, "num_heads_k"),
        ({"head_dim": True}, DTypeError, "head_dim"),
        ({"max_blocks_per_seq": 0}, ArgumentError, "max_blocks_per_seq"),
        ({"dtype": np.int32}, DTypeError, "dtype"),
        ({"dtype": "float8"}, DTypeError, "dtype"),
        ({"dtype": None}, DTypeError, "dtype"),
        ({"xp": "torch"}, DeviceError, "xp"),
    ],
)
def test_constructor_errors(kwargs, error, part):
    args = {"num_blocks": 4, "page_block_size": 16, "num_heads_k": 2, "head_dim": 8,
            "dtype": np.float16, "max_blocks_per_seq": None, "xp": None}
    args.update(kwargs)
    with pytest.raises(error) as info:
        PagedKVCache(**args)
    _assert_explained(info, part)


def test_unknown_and_duplicate_ids():
    cache = PagedKVCache(4, 2, HK, D, np.float32)
    s = cache.add_sequence()
    k = np.zeros((1, 1, HK, D), np.float32)
    with pytest.raises(ArgumentError) as info:
        cache.append([s + 1], k, k)
    _assert_explained(info, "unknown sequence id", "add_sequence()")
    with pytest.raises(ArgumentError):
        cache.block_table([s, 42])
    with pytest.raises(ArgumentError):
        cache.seqlens([42])
    with pytest.raises(ArgumentError):
        cache.append(["0"], k, k)
    with pytest.raises(ArgumentError) as info:
        two = np.zeros((2, 1, HK, D), np.float32)
        cache.append([s, s], two, two)
    _assert_explained(info, "more than once")
    cache.free(s)
    with pytest.raises(ArgumentError) as info:
        cache.free(s)  # double free
    _assert_explained(info, "seq_id", "none are active")
    assert cache.num_free_blocks == 4


@pytest.mark.parametrize(
    "k_shape, v_shape, dtype, cu, error, part",
    [
        ((2, 3, HK, D), (2, 3, HK, D), np.float16, None, DTypeError, "dtype"),
        ((2, 3, HK + 1, D), (2, 3, HK + 1, D), np.float32, None, ShapeError, "dense append"),
        ((2, 3, HK, D), (2, 4, HK, D), np.float32, None, ShapeError, "same shape as k_new"),
        ((3, 3, HK, D), (3, 3, HK, D), np.float32, None, ShapeError, "len(seq_ids)"),
        ((6, HK, D), (6, HK, D), np.float32, None, ShapeError, "dense append"),
        ((2, 3, HK, D), (2, 3, HK, D), np.float32, [0, 3, 6], ShapeError, "varlen append"),
        ((6, HK, D), (6, HK, D), np.float32, [1, 3, 6], SeqlenError, "start at 0"),
        ((6, HK, D), (6, HK, D), np.float32, [0, 4, 3], SeqlenError, "non-decreasing"),
        ((6, HK, D), (6, HK, D), np.float32, [0, 3, 5], SeqlenError, "end at"),
        ((6, HK, D), (6, HK, D), np.float32, [0, 6], SeqlenError, "len(seq_ids) + 1"),
        ((6, HK, D), (6, HK, D), np.float32, [0.0, 3.0, 6.0], DTypeError, "integers"),
    ],
)
def test_append_errors_leave_cache_unchanged(k_shape, v_shape, dtype, cu, error, part):
    cache = PagedKVCache(8, 2, HK, D, np.float32)
    ids = [cache.add_sequence(), cache.add_sequence()]
    snap = _snapshot(cache)
    with pytest.raises(error) as info:
        cache.append(ids, np.ones(k_shape, dtype), np.ones(v_shape, dtype), cu_seqlens=cu)
    _assert_explained(info, part)
    _assert_unchanged(cache, snap)


def test_non_array_input_is_typed():
    cache = PagedKVCache(2, 2, 1, 2, np.float32)
    s = cache.add_sequence()
    with pytest.raises(DTypeError) as info:
        cache.append([s], [[[[1.0, 2.0]]]], np.ones((1, 1, 1, 2), np.float32))
    _assert_explained(info, "k_new", "numpy.asarray")


# -- CuPy pools (skipped without a GPU) -------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_cupy_pool_matches_numpy_pool(dtype):
    """The same operations on a CuPy and a NumPy cache give the same pools, tables and lengths;
    tables and lengths come back as CuPy arrays."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(20)
    gpu = PagedKVCache(20, 3, HK, D, dtype, max_blocks_per_seq=8, xp=cp)
    cpu = PagedKVCache(20, 3, HK, D, dtype, max_blocks_per_seq=8)
    assert gpu.xp is cp and isinstance(gpu.k_pages, cp.ndarray)

    def both(method, *args, **kwargs):
        host = getattr(cpu, method)(*args, **kwargs)
        dev_args = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        dev = getattr(gpu, method)(*dev_args, **kwargs)
        return host, dev

    ids = [both("add_sequence")[0] for _ in range(3)]
    k = _tokens(rng, 3, 4, HK, D, dtype=dtype)
    both("append", ids, k, -k)
    k = _tokens(rng, 9, HK, D, dtype=dtype)
    cu = np.array([0, 2, 2, 9], np.int32)
    both("append", ids, k, -k, cu_seqlens=cu)  # host cu_seqlens with CuPy storage
    cpu.append(ids[::-1], k, -k, cu_seqlens=cu)
    gpu.append(ids[::-1], cp.asarray(k), -cp.asarray(k), cu_seqlens=cp.asarray(cu))  # on device
    both("free", ids[1])
    k = _tokens(rng, 2, 5, HK, D, dtype=dtype)
    both("append", [ids[2], ids[0]], k, -k)
    for host, dev in [both("block_table"), both("seqlens")]:
        assert isinstance(dev, cp.ndarray) and dev.dtype == np.int32
        np.testing.assert_array_equal(cp.asnumpy(dev), host)
    for dev_pool, host_pool in ((gpu.k_pages, cpu.k_pages), (gpu.v_pages, cpu.v_pages)):
        assert np.array_equal(cp.asnumpy(dev_pool).view(np.uint16), host_pool.view(np.uint16))
    assert gpu.num_free_blocks == cpu.num_free_blocks

    before = cp.asnumpy(gpu.k_pages), gpu.num_free_blocks
    big = cp.zeros((2, 30, HK, D), dtype=dtype)
    with pytest.raises(CacheExhaustedError):
        gpu.append([ids[0], ids[2]], big, big)
    assert np.array_equal(cp.asnumpy(gpu.k_pages).view(np.uint16), before[0].view(np.uint16))
    assert gpu.num_free_blocks == before[1]
    with pytest.raises(DeviceError):
        gpu.append([ids[0]], k[:1], k[:1])  # NumPy tokens into a CuPy pool
