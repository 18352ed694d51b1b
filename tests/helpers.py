"""Shared test helpers: random inputs, the flash-attn error bound, an independent rotary."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupy_flashattn.accuracy import EPS, error_bound  # noqa: F401  (one home with the CLI)
from cupy_flashattn.reference import attention_ref

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]


def require_nvrtc() -> None:
    """Skip the calling test module unless CuPy's NVRTC can compile (no GPU needed; CI installs
    cupy-cuda12x with its NVRTC wheel)."""
    pytest.importorskip("cupy", reason="cupy is not installed: cannot run NVRTC")
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"NVRTC is not usable ({exc!r}); install nvidia-cuda-nvrtc-cu12",
                    allow_module_level=True)


def cu_seqlens(lengths) -> np.ndarray:
    """int32 ``(B+1,)`` cumulative lengths from 0: flash-attn's ``cu_seqlens`` of ``lengths``."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def varlen_batch(rng, lens_q, lens_k, heads, heads_k, head_dim, dtype):
    """A varlen batch of fresh random values: packed q ``(total_q, H, D)``, each sequence's keys
    and values ``(n_b, Hk, D)``, and both cu_seqlens.  Returns (q, keys, values, cu_q, cu_k)."""
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = randn(rng, (int(cu_q[-1]), heads, head_dim), dtype)
    keys = [randn(rng, (n, heads_k, head_dim), dtype) for n in lens_k]
    values = [randn(rng, (n, heads_k, head_dim), dtype) for n in lens_k]
    return q, keys, values, cu_q, cu_k


def scatter_into_pages(rng, keys, values, P, dtype, spare_blocks=2, min_pages=0):
    """A paged pool holding sequence b's ``keys[b]`` / ``values[b]`` ((n_b, Hk, D) each) on pages
    in a random order, plus ``spare_blocks`` unused pages; everything not written (spare pages,
    the tail of each last page) is random junk the kernel must never read.  Sequences get at
    least ``min_pages`` table entries.  Returns (k_pages, v_pages, block_table)."""
    Hk, D = keys[0].shape[1:]
    pages = [max(min_pages, -(-len(k) // P)) for k in keys]
    perm = rng.permutation(sum(pages) + spare_blocks).astype(np.int32)
    k_pages = randn(rng, (len(perm), P, Hk, D), dtype)
    v_pages = randn(rng, (len(perm), P, Hk, D), dtype)
    table = np.zeros((len(keys), max(1, max(pages))), np.int32)
    nxt = 0
    for b, (k, v) in enumerate(zip(keys, values)):
        table[b, : pages[b]] = perm[nxt : nxt + pages[b]]
        nxt += pages[b]
        pos = np.arange(len(k))
        k_pages[table[b, pos // P], pos % P] = k
        v_pages[table[b, pos // P], pos % P] = v
    return k_pages, v_pages, table


def kv_layout(rng, keys, values, P, dtype, **pages):
    """Sequence b's ``keys[b]`` / ``values[b]`` as a varlen call takes them: concatenated rows
    (P = 0) or a scattered paged pool (``scatter_into_pages``, with ``pages``).  Returns
    (k, v, block_table), the table None without pages."""
    if P:
        return scatter_into_pages(rng, keys, values, P, dtype, **pages)
    return np.concatenate(keys), np.concatenate(values), None


def filled_paged_cache(rng, lens, num_blocks, P, Hk, D, dtype, xp):
    """A PagedKVCache (on ``xp``'s backend) holding one sequence of random keys/values per entry
    of ``lens``, appended in one call.  Returns (cache, seq_ids, keys, values), keys[b] and
    values[b] the NumPy (lens[b], Hk, D) rows of sequence b."""
    import cupy_flashattn as fa

    cache = fa.PagedKVCache(num_blocks, P, Hk, D, dtype, xp=xp)
    ids = [cache.add_sequence() for _ in lens]
    keys = [randn(rng, (n, Hk, D), dtype) for n in lens]
    values = [randn(rng, (n, Hk, D), dtype) for n in lens]
    cache.append(ids, xp.asarray(np.concatenate(keys)), xp.asarray(np.concatenate(values)),
                 cu_seqlens=cu_seqlens(lens))
    return cache, ids, keys, values


def absent_page_table(rng, table, lens_k, page, num_pages, all_absent=2):
    """A copy of ``table`` (a NumPy block table) with about a third of each sequence's used
    pages replaced by ids outside ``[0, num_pages)`` (-1, num_pages, num_pages + 12345,
    INT32_MIN, INT32_MAX: absent pages, whose keys are masked and never read), and every entry
    of sequence ``all_absent`` absent."""
    table = np.array(table, copy=True)
    bad = np.array([-1, num_pages, num_pages + 12345, np.iinfo(np.int32).min,
                    np.iinfo(np.int32).max], dtype=np.int64)  # fmt: skip
    for b, lk in enumerate(lens_k):
        if b == all_absent:
            table[b, :] = bad[rng.integers(0, len(bad), table.shape[1])]
        else:
            nblk = -(-lk // page)
            drop = rng.choice(nblk, size=max(1, nblk // 3), replace=False)
            table[b, drop] = bad[rng.integers(0, len(bad), drop.size)]
    return table.astype(np.int32)


def to_np(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def assert_within_bound(out, ref, naive, dtype, what="out"):
    """flash-attn's criterion: max|out - ref| <= 2 * max|naive_same_precision - ref| + eps."""
    out = to_np(out).astype(np.float64)
    assert not np.isnan(out).any(), f"{what} has NaN (an element was not written)"
    err = np.abs(out - ref).max(initial=0.0)
    naive_err = np.abs(to_np(naive).astype(np.float64) - ref).max(initial=0.0)
    bound = error_bound(naive_err, dtype)
    assert err <= bound, f"{what}: max error {err:.3g} > bound {bound:.3g} (naive {naive_err:.3g})"


def assert_lse_close(lse, ref_lse, rtol=1e-4, atol=1e-4):
    lse = to_np(lse).astype(np.float64)
    assert not np.isnan(lse).any(), "lse has NaN"
    inf_ref = np.isinf(ref_lse)
    np.testing.assert_array_equal(np.isinf(lse), inf_ref)
    np.testing.assert_allclose(lse[~inf_ref], ref_lse[~inf_ref], rtol=rtol, atol=atol)


def ref_and_naive(q, k, v, **kw):
    """float64 reference (out, lse) and the same-precision naive output."""
    ref, lse = attention_ref(q, k, v, return_lse=True, **kw)
    naive = attention_ref(q, k, v, upcast=False, **kw)
    return ref, lse, naive


def rotary_ref(x, cos, sin, positions, interleaved):
    """Independent float64 rotary: x (S, H, D), positions (S,)."""
    x = x.astype(np.float64)
    out = x.copy()
    rd = 2 * cos.shape[1]
    c = cos.astype(np.float64)[positions][:, None, :]  # (S, 1, rd/2)
    s = sin.astype(np.float64)[positions][:, None, :]
    if interleaved:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * c - x2 * s
        out[..., 1:rd:2] = x1 * s + x2 * c
    else:
        x1, x2 = x[..., : rd // 2], x[..., rd // 2 : rd]
        out[..., : rd // 2] = x1 * c - x2 * s
        out[..., rd // 2 : rd] = x1 * s + x2 * c
    return out


def raises_explained(cls, *fragments, absent=(), expected_and_got=False):
    """Context manager: raises ``cls``, a typed FlashAttnError that is also a ValueError or
    TypeError, whose message contains every fragment, none of ``absent``, and a fix (and, with
    ``expected_and_got``, the expected and the given values)."""
    from cupy_flashattn import errors

    class _Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            message = str(self.info.value)
            for fragment in fragments:
                assert fragment in message, f"{fragment!r} not in {message!r}"
            for fragment in absent:
                assert fragment not in message, f"{fragment!r} in {message!r}"
            assert "Fix:" in message, message
            if expected_and_got:
                assert "expected" in message and "got" in message, message
            assert isinstance(self.info.value, errors.FlashAttnError)
            assert isinstance(self.info.value, (ValueError, TypeError))
            return handled

    return _Ctx()


def prefix_ranges(spans_per_seq, max_ranges=3):
    """An int32 ``(B, max_ranges, 2)`` mm_prefix_ranges array from per-sequence lists of
    (start, end) spans; unused entries are (0, 0)."""
    r = np.zeros((len(spans_per_seq), max_ranges, 2), np.int32)
    for b, spans in enumerate(spans_per_seq):
        if spans:
            r[b, : len(spans)] = spans
    return r


def scaled_float32_case(q_mag, k_mag, v_mag, causal):
    """float32 q, k, v (B 2, Sq 97, Sk 1025, H 6 / Hk 2, D 80) far from unit magnitude: Q rows
    2^-20 .. 2^2 apart times q_mag, K rows 2^-16 .. 1 apart times k_mag, V times v_mag; and the
    softmax scale that gives logits of O(1) .. O(10).  The Hopper float32 path's magnitude test
    and tools/f32_error_probe.py share it."""
    rng = np.random.default_rng(int(np.log10(q_mag)) + 50 + causal)
    B, Sq, Sk, H, Hk, D = 2, 97, 1025, 6, 2, 80
    f32 = np.float32
    q_rows = np.exp2(rng.integers(-20, 3, (B, Sq, H, 1)))
    k_rows = np.exp2(rng.integers(-16, 1, (B, Sk, Hk, 1)))
    q = (randn(rng, (B, Sq, H, D), f32) * q_rows * q_mag).astype(f32)
    k = (randn(rng, (B, Sk, Hk, D), f32) * k_rows * k_mag).astype(f32)
    v = (randn(rng, (B, Sk, Hk, D), f32) * v_mag).astype(f32)
    return q, k, v, 2.0 / np.sqrt(D) / (q_mag * k_mag)
