"""Float8 K/V through the public API on the GPU (issue 16): PagedKVCache(dtype="fp8"), uint8
CuPy arrays of float8 bytes with kv_cache_dtype and k_scale / v_scale (CuPy has no float8
dtype), and the quantizing append kernel (cuda_src/kv_cache.cu).

Oracles: the append must store exactly the bytes of the host's ``fp8.quantize`` (itself checked
against ml_dtypes in tests/test_fp8_cache.py); attention must be within flash-attn's bound of
the float64 attention of the cache as stored, dequantized here (``float(x8) * scale``), and
for the rotary append the GPU must store the same bytes as the CPU backend.  Outputs are
poisoned with NaN; sizes are awkward (page sizes 1 / 16 / 48 / 256, partial last pages, pages
scattered by interleaved appends, lengths 1 / 97 / 1025, MHA / GQA / MQA).
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")

import cupy_flashattn as fa  # noqa: E402
from cupy_flashattn import fp8  # noqa: E402
from cupy_flashattn.reference import attention_ref  # noqa: E402
from cupy_flashattn.rotary import append_kv_paged  # noqa: E402

from helpers import BF16, assert_lse_close, assert_within_bound, cu_seqlens, randn  # noqa: E402

pytestmark = pytest.mark.gpu

FORMATS = {"fp8": np.dtype(ml_dtypes.float8_e4m3fn), "fp8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}


@pytest.fixture(scope="module", autouse=True)
def cuda():
    from cupy_flashattn._cuda import is_available

    if not is_available():
        pytest.skip("no CUDA device")


def dequant(x8, scale, fmt=None):
    """float(x8) * scale per kv head (axis -2), float64, on the host: the oracle's cache
    (``fmt``: the float8 format of uint8 bytes)."""
    x8 = x8.get() if hasattr(x8, "get") else x8
    if fmt is not None:
        x8 = x8.view(fmt)
    return x8.astype(np.float64) * np.asarray(scale, np.float64).reshape(-1)[:, None]


def ref_naive(q, kd, vd, **kw):
    """float64 attention of q on the dequantized k / v, and the same naively in q's dtype."""
    q = q.get() if hasattr(q, "get") else q
    ref, lse = attention_ref(q.astype(np.float64), kd, vd, return_lse=True, **kw)
    naive = attention_ref(q, kd.astype(q.dtype), vd.astype(q.dtype), upcast=False, **kw)
    return ref, lse, naive


def wide_values(rng, shape, scale):
    """Values that exercise every branch of the quantization: normal ones, ones past the
    format's largest value (saturation), subnormal ones, signed zeros."""
    x = rng.standard_normal(shape).astype(np.float32)
    pick = rng.uniform(size=shape)
    x = np.where(pick < 0.1, x * 1e5, x)                    # saturates (|x / scale| > max)
    x = np.where((pick >= 0.1) & (pick < 0.25), x * 1e-5, x)  # subnormal or flushed to 0
    x = np.where((pick >= 0.25) & (pick < 0.28), np.copysign(0.0, x), x)
    return x * np.asarray(scale, np.float32).reshape(-1)[:, None]


# -- the quantizing append ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("src", ["bf16", "f16", "f32", "f64"])
def test_append_stores_the_hosts_quantization_bit_for_bit(fmt, src):
    rng = np.random.default_rng(len(fmt) * 7 + len(src))
    dtype = {"bf16": BF16, "f16": np.float16, "f32": np.float32, "f64": np.float64}[src]
    dt8 = FORMATS[fmt]
    B, S_new, Hk, D, P, blocks = 3, 5, 4, 64, 16, 8
    k_scale = rng.uniform(0.01, 0.5, Hk).astype(np.float32)
    v_scale = rng.uniform(0.01, 0.5, Hk).astype(np.float32)
    k_new = wide_values(rng, (B, S_new, Hk, D), k_scale).astype(dtype)
    v_new = wide_values(rng, (B, S_new, Hk, D), v_scale).astype(dtype)
    k_new[0, 0, 0, :3] = [np.inf, -np.inf, np.nan]  # saturate, saturate, NaN
    table = rng.permutation(blocks).astype(np.int32).reshape(B + 1, -1)[:B]
    lens = np.array([0, 13, 27], np.int32)  # page-crossing appends
    junk = rng.integers(0, 256, (blocks, P, Hk, D), dtype=np.uint8)
    k_pages = cupy.asarray(junk)
    v_pages = cupy.asarray(junk[::-1].copy())
    before_k = k_pages.get()
    append_kv_paged(k_pages, v_pages, cupy.asarray(table), cupy.asarray(k_new),
                    cupy.asarray(v_new), cupy.asarray(lens), k_scale=cupy.asarray(k_scale),
                    v_scale=cupy.asarray(v_scale), kv_cache_dtype=fmt)
    got_k, got_v = k_pages.get(), v_pages.get()
    expect_k = before_k.copy()
    for b in range(B):
        pos = lens[b] + np.arange(S_new)
        page, row = table[b, pos // P], pos % P
        for name, new, scale, got in (("k", k_new, k_scale, got_k), ("v", v_new, v_scale, got_v)):
            want = fp8.quantize(new[b], scale, dt8).view(np.uint8)
            stored = got[page, row]
            nan = np.isnan(fp8.quantize(new[b], scale, dt8).astype(np.float32))
            assert np.array_equal(np.isnan(stored.view(dt8).astype(np.float32)), nan), name
            np.testing.assert_array_equal(stored[~nan], want[~nan], err_msg=f"{name}, seq {b}")
        expect_k[page, row] = got_k[page, row]
    np.testing.assert_array_equal(got_k, expect_k)  # no other byte of the pool moved


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_rotary_append_stores_what_the_cpu_backend_stores(fmt):
    """flash_attn_with_kvcache with rotary tables on a contiguous float8 cache: the GPU's fused
    rotate + quantize kernel stores the CPU backend's bytes, and both attend within the bound."""
    rng = np.random.default_rng(11)
    dt8 = FORMATS[fmt]
    B, S_cache, S_new, H, Hk, D, rot = 2, 64, 3, 8, 2, 128, 64
    k_scale = rng.uniform(0.02, 0.2, Hk).astype(np.float32)
    v_scale = np.float32(0.07)
    k_cache = fp8.quantize(randn(rng, (B, S_cache, Hk, D), np.float32), k_scale, dt8)
    v_cache = fp8.quantize(randn(rng, (B, S_cache, Hk, D), np.float32), np.full(Hk, v_scale), dt8)
    q = randn(rng, (B, S_new, H, D), BF16)
    k_new, v_new = randn(rng, (B, S_new, Hk, D), BF16), randn(rng, (B, S_new, Hk, D), BF16)
    angles = rng.uniform(0, 2 * np.pi, (S_cache, rot // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    lens = np.array([40, 7], np.int32)
    kw = dict(causal=True, k_scale=k_scale, v_scale=float(v_scale), rotary_interleaved=False)
    cpu_k, cpu_v = k_cache.copy(), v_cache.copy()
    cpu_out = fa.flash_attn_with_kvcache(q, cpu_k, cpu_v, k=k_new, v=v_new, rotary_cos=cos,
                                         rotary_sin=sin, cache_seqlens=lens, **kw)
    g = cupy.asarray
    gk, gv = g(k_cache.view(np.uint8)), g(v_cache.view(np.uint8))
    out = cupy.full(q.shape, np.nan, BF16)
    res = fa.flash_attn_with_kvcache(g(q), gk, gv, k=g(k_new), v=g(v_new), rotary_cos=g(cos),
                                     rotary_sin=g(sin), cache_seqlens=g(lens), out=out,
                                     kv_cache_dtype=fmt, **{**kw, "k_scale": g(k_scale)})
    np.testing.assert_array_equal(gk.get(), cpu_k.view(np.uint8))
    np.testing.assert_array_equal(gv.get(), cpu_v.view(np.uint8))
    assert res is out
    # The oracle: the rotated queries (the CPU backend's rotation is checked in test_rotary.py)
    # against the dequantized cache, per sequence.
    from cupy_flashattn.rotary import apply_rotary

    pos = lens[:, None] + np.arange(S_new)[None, :]
    q_rot = apply_rotary(q, cos, sin, pos, False)
    for b in range(B):
        n = int(lens[b]) + S_new
        kd, vd = dequant(cpu_k[b, :n], k_scale), dequant(cpu_v[b, :n], np.full(Hk, v_scale))
        ref, _, naive = ref_naive(q_rot[b:b + 1], kd[None], vd[None], causal=True)
        assert_within_bound(out[b:b + 1], ref, naive, BF16)
        assert_within_bound(cpu_out[b:b + 1], ref, naive, BF16)


# -- attention over float8 pages ----------------------------------------------------------


def _interleaved_cache(rng, fmt, P, Hk, D, lens, k_scale, v_scale, chunk=5):
    """A GPU PagedKVCache filled by round-robin appends of ``chunk`` tokens per sequence (its
    pages interleave across sequences); returns (cache, ids)."""
    cache = fa.PagedKVCache(sum(-(-n // P) for n in lens) + 3, P, Hk, D, fmt, xp=cupy,
                            k_scale=k_scale, v_scale=v_scale)
    ids = [cache.add_sequence() for _ in lens]
    left = list(lens)
    while any(left):
        seqs = [i for i, n in zip(ids, left) if n]
        counts = [min(chunk, n) for n in left if n]
        k = randn(rng, (sum(counts), Hk, D), BF16) * 3
        v = randn(rng, (sum(counts), Hk, D), BF16)
        cache.append(seqs, cupy.asarray(k), cupy.asarray(v), cu_seqlens=cu_seqlens(counts))
        left = [n - min(chunk, n) for n in left]
    return cache, ids


def _stored(cache, ids):
    """Each sequence's dequantized keys and values as the cache holds them (host, float64)."""
    table, lens = cache.block_table(ids), cache.seqlens(ids)
    table, lens = (a.get() if hasattr(a, "get") else np.asarray(a) for a in (table, lens))
    P = cache.page_block_size
    kp, vp = cache.k_pages.get().view(cache.dtype), cache.v_pages.get().view(cache.dtype)
    ks, vs = (s.get() for s in (cache.k_scale, cache.v_scale))
    out = []
    for b, n in enumerate(lens):
        pos = np.arange(int(n))
        out.append((dequant(kp[table[b, pos // P], pos % P], ks),
                    dequant(vp[table[b, pos // P], pos % P], vs)))
    return out


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("P,H,Hk,D", [
    (16, 8, 2, 128),   # GQA 4, vLLM's page
    (1, 4, 4, 64),     # MHA, one token per page
    (48, 8, 1, 64),    # MQA, an odd page size
    (256, 16, 2, 256),  # flash-attn's page, GQA 8, the largest float8 head dim
])
def test_paged_cache_decode_and_prefill(fmt, P, H, Hk, D):
    rng = np.random.default_rng(P + D + H)
    k_scale = rng.uniform(0.005, 0.05, Hk).astype(np.float32)
    lens = [97, 1, 1025]
    cache, ids = _interleaved_cache(rng, fmt, P, Hk, D, lens, k_scale, 0.02)
    assert cache.dtype == FORMATS[fmt] and cache.k_pages.dtype == np.uint8  # float8 bytes

    # A decode step: bfloat16 new tokens quantized on append, then attention.
    q = cupy.asarray(randn(rng, (len(lens), 1, H, D), BF16))
    k_new = cupy.asarray(randn(rng, (len(lens), 1, Hk, D), BF16))
    v_new = cupy.asarray(randn(rng, (len(lens), 1, Hk, D), BF16))
    out = cupy.full(q.shape, np.nan, BF16)
    _, lse = fa.flash_attn_with_kvcache(q, cache, None, k=k_new, v=v_new, causal=True,
                                        seq_ids=ids, out=out, return_softmax_lse=True)
    stored = _stored(cache, ids)
    table, pool = cache.block_table(ids).get(), cache.k_pages.get()
    for b, (kd, vd) in enumerate(stored):
        assert len(kd) == lens[b] + 1
        np.testing.assert_array_equal(  # the appended row is the host's quantization
            pool[table[b, lens[b] // P], lens[b] % P],
            fp8.quantize(k_new[b, 0].get(), k_scale, FORMATS[fmt]).view(np.uint8))
        ref, ref_lse, naive = ref_naive(q[b:b + 1], kd[None], vd[None], causal=True)
        assert_within_bound(out[b:b + 1], ref, naive, BF16)
        assert_lse_close(lse[b:b + 1], ref_lse, rtol=1e-3, atol=1e-3)

    # Prefill through the cache (varlen, causal: queries are each sequence's last positions).
    lens_q = [5, 1, 33]
    qv = cupy.asarray(randn(rng, (sum(lens_q), H, D), BF16))
    outv = cupy.full(qv.shape, np.nan, BF16)
    fa.flash_attn_varlen_func(qv, cache, None, cupy.asarray(cu_seqlens(lens_q)), None,
                              max(lens_q), None, causal=True, seq_ids=ids, out=outv)
    cq = cu_seqlens(lens_q)
    for b, (kd, vd) in enumerate(stored):
        ref, _, naive = ref_naive(qv[cq[b]:cq[b + 1]][None], kd[None], vd[None], causal=True)
        assert_within_bound(outv[cq[b]:cq[b + 1]][None], ref, naive, BF16)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_float8_arrays_with_every_form_of_scale(dtype):
    """Dense float8 CuPy k / v at a prefill length (Sq = 97, causal; float8 always runs the
    decode kernel) with scales as floats, (Hk,) CuPy arrays and a () CuPy array; a CuPy scale
    is read per call, so a cached call sees a new value written in place."""
    rng = np.random.default_rng(5)
    B, Sq, Sk, H, Hk, D = 2, 97, 300, 8, 2, 64
    dt8 = FORMATS["fp8"]
    k_scale = rng.uniform(0.01, 0.05, Hk).astype(np.float32)
    k8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), k_scale, dt8)
    v8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), np.full(Hk, 0.5, np.float32), dt8)
    q = randn(rng, (B, Sq, H, D), dtype)
    gq, gk, gv = cupy.asarray(q), cupy.asarray(k8.view(np.uint8)), cupy.asarray(v8.view(np.uint8))
    vd = dequant(v8, np.full(Hk, 0.5))

    def check(out, ks):
        ref, _, naive = ref_naive(q, dequant(k8, ks), vd, causal=True)
        assert_within_bound(out, ref, naive, dtype)

    kw = dict(causal=True, kv_cache_dtype="fp8")
    check(fa.flash_attn_func(gq, gk, gv, k_scale=k_scale, v_scale=0.5, **kw), k_scale)
    ks_dev, vs_dev = cupy.asarray(k_scale), cupy.asarray(np.float32(0.5))  # (Hk,) and ()
    out = fa.flash_attn_func(gq, gk, gv, k_scale=ks_dev, v_scale=vs_dev, **kw)
    check(out, k_scale)
    ks_dev *= 2  # in place: the next (cached) call reads the new values on the device
    out2 = fa.flash_attn_func(gq, gk, gv, k_scale=ks_dev, v_scale=vs_dev, **kw)
    check(out2, 2 * k_scale)
    assert float(abs(out2.astype(np.float32) - out.astype(np.float32)).max()) > 1e-2


def test_nan_in_a_float8_cache_comes_out_as_nan():
    """A NaN key element must poison the rows that see it (not be flushed to 0)."""
    rng = np.random.default_rng(9)
    B, Sk, H, Hk, D = 1, 40, 4, 2, 64
    dt8 = FORMATS["fp8"]
    k8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), np.ones(Hk, np.float32), dt8)
    k8[0, 10, 1, 3] = np.nan  # kv head 1 -> query heads 2 and 3
    q = cupy.asarray(randn(rng, (B, 1, H, D), BF16))
    k_bytes = cupy.asarray(k8.view(np.uint8))
    out = fa.flash_attn_func(q, k_bytes, k_bytes, causal=True, kv_cache_dtype="fp8").get()
    assert np.isnan(out[0, 0, 2:].astype(np.float32)).all()
    assert not np.isnan(out[0, 0, :2].astype(np.float32)).any()


def test_float8_cache_refuses_what_its_kernels_cannot_read():
    from cupy_flashattn import errors

    cache = fa.PagedKVCache(8, 16, 2, 64, "fp8", xp=cupy)
    seq = cache.add_sequence()
    q32 = cupy.zeros((1, 1, 4, 64), np.float32)
    with pytest.raises(errors.UnsupportedError, match="16-bit"):
        fa.flash_attn_with_kvcache(q32, cache, None, k=cupy.zeros((1, 1, 2, 64), np.float32),
                                   v=cupy.zeros((1, 1, 2, 64), np.float32), seq_ids=[seq])
    assert int(cache.seqlens([seq])[0]) == 0  # the refused call appended nothing


@pytest.mark.parametrize("magnitude", [2.0 ** 20, 2.0 ** -24])
def test_bfloat16_queries_outside_float16s_range(magnitude):
    """The float8 kernels multiply in float16 (which holds every float8 value exactly); bfloat16
    queries are rescaled to float16 per row by a power of two.  Queries far above float16's
    largest value (65504) or below its smallest normal (2^-14) must come out as accurately as
    ordinary ones (softmax_scale brings the logits back to the usual range)."""
    rng = np.random.default_rng(13)
    B, Sq, Sk, H, Hk, D = 2, 3, 200, 8, 2, 128
    dt8 = FORMATS["fp8"]
    scale = np.full(Hk, 1.0 / 64, np.float32)
    k8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), scale, dt8)
    v8 = fp8.quantize(randn(rng, (B, Sk, Hk, D), np.float32), scale, dt8)
    q = (randn(rng, (B, Sq, H, D), np.float32) * magnitude).astype(BF16)
    softmax_scale = 1.0 / (magnitude * np.sqrt(D))
    out = fa.flash_attn_func(cupy.asarray(q), cupy.asarray(k8.view(np.uint8)),
                             cupy.asarray(v8.view(np.uint8)), softmax_scale=softmax_scale,
                             causal=True, k_scale=1.0 / 64, v_scale=1.0 / 64, kv_cache_dtype="fp8")
    ref, _, naive = ref_naive(q, dequant(k8, scale), dequant(v8, scale), causal=True,
                              softmax_scale=softmax_scale)
    assert_within_bound(out, ref, naive, BF16)
