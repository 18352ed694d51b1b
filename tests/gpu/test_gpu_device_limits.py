"""A kernel this GPU cannot run is refused before anything is written (``_cuda/device_limits.py``).

The H200 allows every shipped tile, so these tests lower the device's recorded shared-memory
limit below the D=128 decode kernel's (as on a 99 KB sm_89 GPU) and check that
flash_attn_with_kvcache -- contiguous and paged cache, and a PagedKVCache step -- raises
UnsupportedError with the cache, its lengths and its pages exactly as they were; then, with the
real limit back, that the same call runs and matches the float64 reference.  The shapes are
this file's own (H=12, Hk=4, B=3), so no earlier test has cached a plan of their signature."""

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn._cuda import decode as dc
from cupy_flashattn._cuda import device_limits
from helpers import BF16, assert_within_bound, filled_paged_cache, randn, ref_and_naive

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

B, H, HK, D, CAP = 3, 12, 4, 128, 97


@pytest.fixture
def small_gpu(monkeypatch):
    """This device recorded as allowing less shared memory than the D=128 decode kernel needs."""
    dev = cp.cuda.runtime.getDevice()
    monkeypatch.setitem(device_limits._OPTIN, dev, dc.smem_bytes(128) - 1024)
    yield
    device_limits._OPTIN.pop(dev, None)


def _snapshot(*arrays):
    return [a.get().copy() for a in arrays]


def test_contiguous_cache_is_unchanged_when_the_decode_kernel_does_not_fit(small_gpu):
    rng = np.random.default_rng(31)
    kc, vc = (cp.asarray(randn(rng, (B, CAP, HK, D), BF16)) for _ in range(2))
    q = cp.asarray(randn(rng, (B, 1, H, D), BF16))
    kn, vn = (cp.asarray(randn(rng, (B, 1, HK, D), BF16)) for _ in range(2))
    lens = cp.asarray(np.array([5, 40, 90], np.int32))
    before = _snapshot(kc, vc, lens)
    with pytest.raises(fa.UnsupportedError, match=r"decode kernel for head_dim 128 .*head_dim <= 64"):
        fa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)
    for a, b in zip(_snapshot(kc, vc, lens), before):
        np.testing.assert_array_equal(a, b)


def test_paged_cache_and_its_pages_are_unchanged(small_gpu):
    rng = np.random.default_rng(32)
    P, pages = 16, 24
    kc, vc = (cp.asarray(randn(rng, (pages, P, HK, D), BF16)) for _ in range(2))
    table = cp.asarray(rng.permutation(pages)[: B * 8].reshape(B, 8).astype(np.int32))
    q = cp.asarray(randn(rng, (B, 1, H, D), BF16))
    kn, vn = (cp.asarray(randn(rng, (B, 1, HK, D), BF16)) for _ in range(2))
    lens = cp.asarray(np.array([16, 1, 100], np.int32))
    before = _snapshot(kc, vc, lens, table)
    with pytest.raises(fa.UnsupportedError, match="shared memory per block"):
        fa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table,
                                   causal=True)
    for a, b in zip(_snapshot(kc, vc, lens, table), before):
        np.testing.assert_array_equal(a, b)


def test_paged_kv_cache_step_keeps_lengths_and_pages_then_runs_with_the_real_limit(monkeypatch):
    rng = np.random.default_rng(33)
    # Full last pages: the step must reserve a new page for two of the sequences.
    cache, ids, ks, vs = filled_paged_cache(rng, [48, 3, 32], 32, 16, HK, D, BF16, cp)
    q = randn(rng, (B, 1, H, D), BF16)
    kn, vn = randn(rng, (B, 1, HK, D), BF16), randn(rng, (B, 1, HK, D), BF16)
    seqlens_before = cache.seqlens(ids).get().copy()
    free_before = cache.num_free_blocks
    pages_before = _snapshot(cache.k_pages, cache.v_pages)
    dev = cp.cuda.runtime.getDevice()
    monkeypatch.setitem(device_limits._OPTIN, dev, dc.smem_bytes(128) - 1024)
    with pytest.raises(fa.UnsupportedError, match="shared memory per block"):
        fa.flash_attn_with_kvcache(cp.asarray(q), cache, None, cp.asarray(kn), cp.asarray(vn),
                                   seq_ids=ids, causal=True)
    np.testing.assert_array_equal(cache.seqlens(ids).get(), seqlens_before)
    assert cache.num_free_blocks == free_before  # the reserved pages went back
    for a, b in zip(_snapshot(cache.k_pages, cache.v_pages), pages_before):
        np.testing.assert_array_equal(a, b)
    device_limits._OPTIN.pop(dev)  # the real limit: the same step now runs
    out = fa.flash_attn_with_kvcache(cp.asarray(q), cache, None, cp.asarray(kn), cp.asarray(vn),
                                     seq_ids=ids, causal=True).get()
    for j in range(B):
        kk, vv = np.concatenate([ks[j], kn[j]]), np.concatenate([vs[j], vn[j]])
        ref, _, naive = ref_and_naive(q[j], kk, vv, causal=True)
        assert_within_bound(out[j], ref, naive, BF16)
