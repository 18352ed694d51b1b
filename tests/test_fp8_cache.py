"""FP8 K/V caches (vLLM's ``kv_cache_dtype="fp8"``): float8 e4m3fn / e5m2 pages with per-tensor
or per-head scales, quantized with saturation on append, dequantized as attention reads them.
CPU backend here (the GPU's float8 path: tests/gpu/test_gpu_fp8_api.py); the GPU's rules
(head dims, 16-bit queries) are typed errors.  The oracle is the float64
reference on K/V dequantized here, independently of the library (``float(x8) * scale``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import errors, fp8
from cupy_flashattn.reference import attention_ref
from cupy_flashattn.rotary import append_kv_contiguous

from helpers import BF16, assert_within_bound, cu_seqlens, raises_explained, randn

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)


def _dequant(x8, scale):
    """The oracle's dequantization: float64 of the stored float8 times the per-head scale."""
    return x8.astype(np.float64) * np.asarray(scale, np.float64)[:, None]


def _ref_and_naive(q, k, v, dtype, **kw):
    ref, lse = attention_ref(q.astype(np.float64), k, v, return_lse=True, **kw)
    naive = attention_ref(q.astype(dtype), k.astype(dtype), v.astype(dtype), upcast=False, **kw)
    return ref, lse, naive


@pytest.mark.parametrize("fmt", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("P,H,Hk,D,scale_kind", [
    (16, 8, 2, 64, "per-head"),   # GQA, pages of 16
    (7, 4, 4, 80, "tensor"),      # MHA, odd page size, D = 80
    (48, 6, 1, 40, "per-head"),   # MQA, D = 40
])
def test_paged_fp8_cache_prefill_and_decode_match_the_dequantized_reference(fmt, P, H, Hk, D, scale_kind):
    rng = np.random.default_rng(P * 100 + D)
    dt = np.float32
    if scale_kind == "per-head":
        k_scale = rng.uniform(0.02, 0.2, Hk).astype(np.float32)
        v_scale = rng.uniform(0.02, 0.2, Hk).astype(np.float32)
    else:
        k_scale, v_scale = 0.05, 0.08
    cache = fa.PagedKVCache(64, P, Hk, D, fmt, k_scale=k_scale, v_scale=v_scale)
    assert cache.dtype == (E4M3 if fmt == "fp8" else E5M2)
    lens = [97, 1, 33]
    seqs = [cache.add_sequence() for _ in lens]
    keys = [randn(rng, (n, Hk, D), dt) for n in lens]
    values = [randn(rng, (n, Hk, D), dt) for n in lens]
    cu = cu_seqlens(lens)
    cache.append(seqs, np.concatenate(keys), np.concatenate(values), cu_seqlens=cu)

    # What the cache holds, read back through its block table and dequantized by the oracle.
    table = cache.block_table(seqs)
    ks = np.broadcast_to(np.asarray(k_scale, np.float32), (Hk,))
    vs = np.broadcast_to(np.asarray(v_scale, np.float32), (Hk,))

    def stored(pool, b, n, scale):
        pos = np.arange(n)
        return _dequant(pool[table[b, pos // P], pos % P], scale)

    # The stored values are the saturating quantization of what was appended.
    for b, n in enumerate(lens):
        expect = np.clip(keys[b] / ks[:, None], -fp8.fp8_max(cache.dtype), fp8.fp8_max(cache.dtype))
        np.testing.assert_array_equal(cache.k_pages[table[b, np.arange(n) // P], np.arange(n) % P],
                                      expect.astype(cache.dtype))

    # Prefill through the cache (causal, queries = the last len_q positions).
    lens_q = [5, 1, 33]
    q = randn(rng, (sum(lens_q), H, D), dt)
    out = np.full(q.shape, np.nan, dt)
    res = fa.flash_attn_varlen_func(q, cache, None, cu_seqlens(lens_q), None, max(lens_q), None,
                                    causal=True, seq_ids=seqs, out=out)
    cq = cu_seqlens(lens_q)
    for b, n in enumerate(lens):
        kd, vd = stored(cache.k_pages, b, n, ks), stored(cache.v_pages, b, n, vs)
        qb = q[cq[b]:cq[b + 1]][None]
        ref, _, naive = _ref_and_naive(qb, kd[None], vd[None], dt, causal=True)
        assert_within_bound(res[cq[b]:cq[b + 1]][None], ref, naive, dt)
        # The test could fail: attending to the unquantized keys gives another answer.
        exact = attention_ref(qb, keys[b][None], values[b][None], causal=True)
        if n > 1:
            assert np.abs(exact - ref).max() > 1e-3

    # One decode step through the cache: new tokens quantized on append, then attention.
    qd = randn(rng, (len(lens), 1, H, D), dt)
    k_new, v_new = randn(rng, (len(lens), 1, Hk, D), dt), randn(rng, (len(lens), 1, Hk, D), dt)
    res, lse = fa.flash_attn_with_kvcache(qd, cache, None, k=k_new, v=v_new, causal=True,
                                         seq_ids=seqs, return_softmax_lse=True)
    table = cache.block_table(seqs)
    for b, n in enumerate(lens):
        kd, vd = stored(cache.k_pages, b, n + 1, ks), stored(cache.v_pages, b, n + 1, vs)
        np.testing.assert_allclose(kd[-1], fp8.quantize(k_new[b, 0], ks, cache.dtype).astype(np.float64) * ks[:, None])
        ref, ref_lse, naive = _ref_and_naive(qd[b:b + 1], kd[None], vd[None], dt, causal=True)
        assert_within_bound(res[b:b + 1], ref, naive, dt)
        np.testing.assert_allclose(lse[b], ref_lse[0], rtol=1e-4, atol=1e-4)


def test_fp8_arrays_with_explicit_scales_dense_and_with_kvcache():
    """The array forms: float8 k / v with k_scale / v_scale, bfloat16 queries."""
    rng = np.random.default_rng(7)
    B, Sq, Sk, H, Hk, D = 2, 17, 129, 8, 4, 64
    q = randn(rng, (B, Sq, H, D), BF16)
    k_scale = rng.uniform(0.01, 0.1, Hk).astype(np.float32)
    v_scale = np.float32(0.05)
    k8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), k_scale, E4M3)
    v8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), np.full(Hk, v_scale), E4M3)
    kd = k8.astype(np.float64) * k_scale[:, None]
    vd = v8.astype(np.float64) * np.float64(v_scale)
    out = fa.flash_attn_func(q, k8, v8, causal=True, k_scale=k_scale, v_scale=float(v_scale))
    ref, _, naive = _ref_and_naive(q, kd, vd, BF16, causal=True)
    assert_within_bound(out, ref, naive, BF16)
    attn = fa.FlashAttention(causal=True)  # the configured object passes the scales per call
    np.testing.assert_array_equal(attn(q, k8, v8, k_scale=k_scale, v_scale=float(v_scale)), out)

    # A contiguous FP8 cache with an append of bfloat16 tokens at cache_seqlens.
    k_cache, v_cache = k8.copy(), v8.copy()
    lens = np.array([100, 50], np.int32)
    k_new, v_new = randn(rng, (B, 3, Hk, D), BF16), randn(rng, (B, 3, Hk, D), BF16)
    qd = randn(rng, (B, 3, H, D), BF16)
    res = fa.flash_attn_with_kvcache(qd, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens,
                                     causal=True, k_scale=k_scale, v_scale=float(v_scale))
    for b in range(B):
        n = int(lens[b]) + 3
        np.testing.assert_array_equal(k_cache[b, lens[b]:n], fp8.quantize(k_new[b], k_scale, E4M3))
        kdb = k_cache[b, :n].astype(np.float64) * k_scale[:, None]
        vdb = v_cache[b, :n].astype(np.float64) * np.float64(v_scale)
        ref, _, naive = _ref_and_naive(qd[b:b + 1], kdb[None], vdb[None], BF16, causal=True)
        assert_within_bound(res[b:b + 1], ref, naive, BF16)


def test_quantization_saturates_and_keeps_nan():
    x = np.array([[1e6, -1e6, np.inf, -np.inf, np.nan, 0.3]], np.float32)  # (Hk=1, D=6)
    for dtype in (E4M3, E5M2):
        q8 = fp8.quantize(x, np.ones(1, np.float32), dtype)
        top = fp8.fp8_max(dtype)
        assert q8.dtype == dtype
        np.testing.assert_array_equal(q8.astype(np.float64)[0, :4], [top, -top, top, -top])
        assert np.isnan(q8.astype(np.float64)[0, 4])
    assert fp8.fp8_max(E4M3) == 448.0 and fp8.fp8_max(E5M2) == 57344.0


def test_fp8_mistakes_get_typed_errors():
    rng = np.random.default_rng(3)
    q = randn(rng, (1, 4, 2, 64), np.float32)
    k8 = randn(rng, (1, 8, 2, 64), np.float32).astype(E4M3)
    v16 = randn(rng, (1, 8, 2, 64), np.float32).astype(BF16)
    with raises_explained(errors.DTypeError, "v", "float8"):
        fa.flash_attn_func(q, k8, v16)
    with raises_explained(errors.ArgumentError, "k_scale", "float8"):
        fa.flash_attn_func(q.astype(BF16), v16, v16, k_scale=0.5)
    with raises_explained(errors.ArgumentError, "k_scale", "positive"):
        fa.flash_attn_func(q, k8, k8, k_scale=-1.0)
    with raises_explained(errors.ShapeError, "v_scale", "per kv head"):
        fa.flash_attn_func(q, k8, k8, v_scale=np.ones(3, np.float32))
    with raises_explained(errors.DTypeError, "k_scale", "float32"):
        fa.flash_attn_func(q, k8, k8, k_scale=np.ones(2, np.float64))
    with raises_explained(errors.ArgumentError, "k_scale", "FP8 caches only"):
        fa.PagedKVCache(4, 16, 2, 64, np.float16, k_scale=0.1)
    cache = fa.PagedKVCache(4, 16, 2, 64, "fp8")
    with raises_explained(errors.ArgumentError, "k_scale", "PagedKVCache"):
        fa.flash_attn_with_kvcache(q, cache, None, seq_ids=[], k_scale=0.1)
    with raises_explained(errors.DTypeError, "k_new", "float8"):
        seq = cache.add_sequence()
        cache.append(seq, np.zeros((1, 1, 2, 64), np.int32), np.zeros((1, 1, 2, 64), np.int32))


def test_fp8_gpu_cache_rules_are_checked_before_anything_is_allocated():
    """The GPU's float8 kernels read whole 16-byte chunks up to head dim 256: a CuPy FP8 cache
    of another head dim is refused at construction, before the pools are allocated (so the
    check needs no GPU)."""
    cupy = pytest.importorskip("cupy")
    for d in (40, 59, 272):
        with raises_explained(errors.UnsupportedError, "head_dim", "multiple of 16"):
            fa.PagedKVCache(4, 16, 2, d, "fp8", xp=cupy)


def test_fp8_gpu_rules_name_the_argument_and_the_fix():
    with raises_explained(errors.UnsupportedError, "k", "multiple of 16"):
        fp8.gpu_rules("k", 80 + 8, np.float16)
    with raises_explained(errors.UnsupportedError, "q", "16-bit"):
        fp8.gpu_rules("k", 128, np.float32)
    fp8.gpu_rules("k", 128, BF16)  # allowed: no error


@pytest.mark.gpu
def test_fp8_cupy_arrays_outside_the_kernels_rules_are_refused():
    cupy = pytest.importorskip("cupy")
    q = cupy.zeros((1, 4, 2, 64), np.float32)
    try:
        k8 = cupy.zeros((1, 8, 2, 64), E4M3)
    except (ValueError, TypeError) as e:  # CuPy 13 has no float8 dtype: no such array exists
        pytest.skip(f"this CuPy cannot hold float8 arrays ({e})")
    with raises_explained(errors.UnsupportedError, "q", "16-bit"):
        fa.flash_attn_func(q, k8, k8)
    q40 = cupy.zeros((1, 4, 2, 40), np.float16)
    k40 = cupy.zeros((1, 8, 2, 40), E4M3)
    with raises_explained(errors.UnsupportedError, "k", "multiple of 16"):
        fa.flash_attn_func(q40, k40, k40)


def test_uint8_bytes_with_kv_cache_dtype_are_the_same_cache():
    """vLLM's form (and the GPU's only one, CuPy having no float8 dtype): uint8 K/V holding
    float8 bytes, with kv_cache_dtype naming the format -- the same answer as float8 arrays,
    and the same bytes appended."""
    rng = np.random.default_rng(21)
    B, Sq, Sk, H, Hk, D = 2, 3, 50, 4, 2, 32
    q = randn(rng, (B, Sq, H, D), BF16)
    for name, dt in (("fp8", E4M3), ("fp8_e5m2", E5M2)):
        ks = rng.uniform(0.01, 0.1, Hk).astype(np.float32)
        k8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), ks, dt)
        v8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), ks, dt)
        want = fa.flash_attn_func(q, k8, v8, causal=True, k_scale=ks, v_scale=ks)
        got = fa.flash_attn_func(q, k8.view(np.uint8), v8.view(np.uint8), causal=True,
                                 k_scale=ks, v_scale=ks, kv_cache_dtype=name)
        np.testing.assert_array_equal(got, want)
        attn = fa.FlashAttention(causal=True)  # the configured object takes the format per call
        np.testing.assert_array_equal(attn(q, k8.view(np.uint8), v8.view(np.uint8), k_scale=ks,
                                           v_scale=ks, kv_cache_dtype=name), want)

        # Appends into byte pools store the bytes of the float8 pools' append.
        k_new, v_new = randn(rng, (B, 2, Hk, D), BF16), randn(rng, (B, 2, Hk, D), BF16)
        lens = np.array([10, 48], np.int32)
        pools = [(k8.copy(), v8.copy()), (k8.view(np.uint8).copy(), v8.view(np.uint8).copy())]
        append_kv_contiguous(*pools[0], k_new, v_new, lens, k_scale=ks, v_scale=ks)
        append_kv_contiguous(*pools[1], k_new, v_new, lens, k_scale=ks, v_scale=ks,
                                kv_cache_dtype=name)
        np.testing.assert_array_equal(pools[1][0], pools[0][0].view(np.uint8))
        np.testing.assert_array_equal(pools[1][1], pools[0][1].view(np.uint8))


def test_kv_cache_dtype_mistakes_get_typed_errors():
    rng = np.random.default_rng(4)
    q = randn(rng, (1, 4, 2, 64), BF16)
    k8 = randn(rng, (1, 8, 2, 64), np.float32).astype(E4M3).view(np.uint8)
    with raises_explained(errors.DTypeError, "k", "kv_cache_dtype"):
        fa.flash_attn_func(q, k8, k8)  # bytes without their format
    with raises_explained(errors.ArgumentError, "kv_cache_dtype", "fp8_e5m2"):
        fa.flash_attn_func(q, k8, k8, kv_cache_dtype="fp16")
    kb = randn(rng, (1, 8, 2, 64), BF16)
    with raises_explained(errors.DTypeError, "k", "uint8"):
        fa.flash_attn_func(q, kb, kb, kv_cache_dtype="fp8")  # a format for 16-bit K/V


def test_kv_cache_format_names_vllms_values():
    assert fp8.kv_cache_format(None) is None and fp8.kv_cache_format("auto") is None
    assert fp8.kv_cache_format("fp8") == E4M3 and fp8.kv_cache_format("fp8_e4m3") == E4M3
    assert fp8.kv_cache_format("fp8_e5m2") == E5M2
    assert fp8.kv_cache_format(ml_dtypes.float8_e5m2) == E5M2
    for bad in ("fp16", "e4m3", np.float16, 8):
        with raises_explained(errors.ArgumentError, "kv_cache_dtype", "fp8"):
            fp8.kv_cache_format(bad)


def test_scale_binding_on_numpy_fixes_per_head_arrays_once():
    """On the CPU backend every scale is fixed at validation: a float, None (= 1), a (1,) or
    (Hk,) float32 array all become float32 (Hk,) arrays with the given values."""
    b = fp8.ScaleBinding(0.5, None, 3, np)
    got = b.arrays(None, None)
    np.testing.assert_array_equal(got["k_scale"], np.full(3, 0.5, np.float32))
    np.testing.assert_array_equal(got["v_scale"], np.ones(3, np.float32))
    per_head = np.array([0.1, 0.2, 0.3], np.float32)
    b = fp8.ScaleBinding(per_head, np.array([2.0], np.float32), 3, np)
    got = b.arrays(None, None)
    np.testing.assert_array_equal(got["k_scale"], per_head)
    np.testing.assert_array_equal(got["v_scale"], np.full(3, 2.0, np.float32))
    assert got["k_scale"].dtype == np.float32
    with raises_explained(errors.ShapeError, "k_scale", "per kv head"):
        fp8.ScaleBinding(np.ones(2, np.float32), None, 3, np)
