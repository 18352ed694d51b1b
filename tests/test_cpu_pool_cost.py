"""Issue 10, defect 5: a CPU decode step costs what its sequences hold, not what the pool holds.

A bfloat16 / float16 ``PagedKVCache`` used to be converted to float32 whole on every call
(36.7 ms per step at 1024 pages, 127 ms at 4096).  Now only the pages a call reads are gathered
and converted (``_backend_cpu.paged_operands``).  The checks here are deterministic (what the
kernel is handed), plus one timing check with a wide margin (the old cost grew ~100x from 64 to
16384 pages).
"""

from __future__ import annotations

import inspect
import time

import ml_dtypes
import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import _backend_cpu
from cupy_flashattn.reference import attention_ref

from helpers import cu_seqlens

BF16 = np.dtype(ml_dtypes.bfloat16)
H, HK, D, P = 4, 2, 32, 16


def _cache(num_blocks, dtype=BF16, lengths=(40, 7, 100), seed=0, skip_pages=0):
    """A cache of ``num_blocks`` pages holding the same sequences whatever its size, and the
    host copies of their keys/values; the first ``skip_pages`` pages go to a filler sequence,
    so the sequences live at other page ids."""
    rng = np.random.default_rng(seed)
    cache = fa.PagedKVCache(num_blocks, P, HK, D, dtype)
    if skip_pages:
        filler = np.ones((1, skip_pages * P, HK, D), dtype)
        cache.append([cache.add_sequence()], filler, filler)
    ids = [cache.add_sequence() for _ in lengths]
    cu = cu_seqlens(lengths)
    k = rng.standard_normal((int(cu[-1]), HK, D)).astype(dtype)
    v = rng.standard_normal((int(cu[-1]), HK, D)).astype(dtype)
    cache.append(ids, k, v, cu_seqlens=cu)
    return cache, ids, k, v, cu


@pytest.fixture
def kernel_spy(monkeypatch):
    """Records the (k, v, block_table, num_pages) the Numba kernel is given, then runs it."""
    calls = []
    kernel = _backend_cpu._flash_fwd_kernel
    signature = inspect.signature(kernel.py_func)

    def spy(*args):
        calls.append(signature.bind(*args).arguments)
        return kernel(*args)

    monkeypatch.setattr(_backend_cpu, "_flash_fwd_kernel", spy)
    return calls


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
def test_decode_converts_only_the_pages_it_reads(kernel_spy, dtype):
    """The kernel gets the pages the sequences own, for a pool of 64 and of 16384 pages alike."""
    rng = np.random.default_rng(1)
    shapes = []
    for num_blocks in (64, 16384):
        cache, ids, *_ = _cache(num_blocks, dtype)
        q1 = rng.standard_normal((3, 1, H, D)).astype(dtype)
        k1 = rng.standard_normal((3, 1, HK, D)).astype(dtype)
        fa.flash_attn_with_kvcache(q1, cache, None, k=k1, v=k1, causal=True, seq_ids=ids)
        call = kernel_spy[-1]
        owned = sum(-(-int(n) // P) for n in cache.seqlens(ids))  # 3 + 1 + 7 = 11 pages
        assert call["num_pages"] == owned
        assert call["k"].shape == (owned * P, HK, D) and call["v"].shape == (owned * P, HK, D)
        assert call["k"].dtype == np.float32
        shapes.append(call["k"].shape)
    assert shapes[0] == shapes[1]  # independent of the pool size


def test_float32_pool_is_read_in_place(kernel_spy):
    """A float32 pool needs no conversion: the kernel reads it zero-copy."""
    cache, ids, *_ = _cache(256, np.float32)
    q = np.zeros((3, 1, H, D), np.float32)
    fa.flash_attn_with_kvcache(q, cache, None, seq_ids=ids)
    assert np.shares_memory(kernel_spy[-1]["k"], cache.k_pages)
    assert kernel_spy[-1]["num_pages"] == 256


def test_paged_operands_gathers_and_remaps():
    """Shared pages are gathered once, unread entries and ids outside the pool become -1, and
    every read key maps to the same values as in the pool."""
    rng = np.random.default_rng(2)
    pool_k = rng.standard_normal((1000, P, HK, D)).astype(BF16)
    pool_v = rng.standard_normal((1000, P, HK, D)).astype(BF16)
    # seq 0 uses 3 pages (33 keys), seq 1 shares page 7 (prefix) and uses 2; column 2 of seq 1
    # and everything after are not read; 5000 is outside the pool (absent).
    table = np.array([[7, 900, 3, 11], [7, 5000, 999, 12]], np.int32)
    len_k = np.array([33, 20], np.int64)
    k, v, remapped, n = _backend_cpu.paged_operands(pool_k, pool_v, table, len_k, P, np.float32)
    assert n == 3  # pages 3, 7, 900 (sorted); 5000 absent, 999/11/12 unread
    assert k.shape == (3 * P, HK, D) and k.dtype == np.float32 and k.flags.c_contiguous
    assert remapped.tolist() == [[1, 2, 0], [1, -1, -1]]
    for b, length in enumerate(len_k):
        for pos in range(int(length)):
            page, row = table[b, pos // P], pos % P
            new = remapped[b, pos // P]
            if new < 0:
                assert not 0 <= page < 1000
                continue
            np.testing.assert_array_equal(k[new * P + row], pool_k[page, row].astype(np.float32))
            np.testing.assert_array_equal(v[new * P + row], pool_v[page, row].astype(np.float32))


def test_paged_operands_no_keys():
    pool = np.zeros((50, P, HK, D), BF16)
    k, v, remapped, n = _backend_cpu.paged_operands(
        pool, pool, np.zeros((2, 50), np.int32), np.zeros(2, np.int64), P, np.float32)
    assert n == 0 and k.shape == (0, HK, D) and remapped.shape == (2, 1)


def test_same_result_whatever_the_pool_size():
    """Same sequences in a small and a huge pool (and pages at other ids): identical outputs,
    equal to the float64 reference."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 1, H, D)).astype(BF16)
    outs = []
    for num_blocks, skip in ((16, 0), (4096, 3000)):
        cache, ids, k, v, cu = _cache(num_blocks, skip_pages=skip)
        outs.append(fa.flash_attn_with_kvcache(q, cache, None, seq_ids=ids))
    np.testing.assert_array_equal(outs[0].astype(np.float32), outs[1].astype(np.float32))
    for b in range(3):
        ref = attention_ref(q[b:b + 1], k[None, cu[b]:cu[b + 1]], v[None, cu[b]:cu[b + 1]])
        assert np.abs(outs[0][b:b + 1].astype(np.float64) - ref).max() < 2e-2


def test_decode_time_does_not_grow_with_the_pool():
    """Wide margin: before the fix the 16384-page step took ~100x the 64-page one."""

    def step_time(num_blocks):
        cache, ids, *_ = _cache(num_blocks)
        q = np.zeros((3, 1, H, D), BF16)
        fa.flash_attn_with_kvcache(q, cache, None, seq_ids=ids)  # warm-up (compiles)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            fa.flash_attn_with_kvcache(q, cache, None, seq_ids=ids)
            times.append(time.perf_counter() - t0)
        return min(times)  # min: robust to a busy machine

    small, large = step_time(64), step_time(16384)
    assert large < 5 * small + 0.005, (small, large)
