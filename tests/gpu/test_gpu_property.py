"""Hypothesis property test of the CUDA kernels through the public API (issue 10, "Also"), the GPU
twin of tests/test_cpu_backend.py::test_random_small_problems.

Each example draws a layout (dense, varlen, paged varlen, KV cache contiguous or paged, with or
without appending new tokens, with or without rotary), a dtype (float16, bfloat16), a head dim
(40, 59, 64, 80, 128: the 64 / 96 / 128 buckets, the padded D % 8 != 0 path, both decode
buckets), a GQA ratio, a page size (1, 16, 48, 256), a mask (causal, local windows), softcap,
ALiBi, a softmax scale, a split count, and batch/sequence lengths that route it to the prefill
kernel, the decode kernel (short queries) or both (mixed varlen batches).  The output (poisoned
with NaN through ``out=``) must be within flash-attn's bound of the float64 reference
(``max|out - ref| <= 2 * max|naive same-precision - ref| + eps``), the LSE within 2e-3, and a
KV cache after an append must equal -- bit for bit, whole cache -- the cache with the new rows
(rotated by the NumPy rotary, the kernel's bit-exact twin) written where they belong.

Bounded in time: ``FA_GPU_PROPERTY_EXAMPLES`` examples (default 40), sizes kept small (<= 3
sequences, <= 128 queries, <= 300 keys, <= 16 heads), no deadline per example (the first use of a
kernel compiles it, ~1 s).  About 1 minute on an H200 with a cold kernel cache (~30 kernels),
well under one warm.  ``FA_GPU_PROPERTY_DERANDOMIZE=1`` makes the examples the same every run.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cupy_flashattn as fa  # noqa: E402
from cupy_flashattn.rotary import apply_rotary  # noqa: E402
from helpers import (  # noqa: E402
    BF16, assert_lse_close, assert_within_bound, randn, ref_and_naive, scatter_into_pages,
    varlen_batch,
)

pytestmark = pytest.mark.gpu

F16 = np.dtype(np.float16)
MAX_EXAMPLES = int(os.environ.get("FA_GPU_PROPERTY_EXAMPLES", "40"))
DERANDOMIZE = os.environ.get("FA_GPU_PROPERTY_DERANDOMIZE", "0") not in ("", "0")
LAYOUTS = ("dense", "varlen", "paged", "kvcache", "kvcache_paged")
LSE_TOL = dict(rtol=2e-3, atol=2e-3)


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    from cupy_flashattn import _cuda

    if not _cuda.is_available():
        pytest.skip("no sm_80+ GPU")


# -- drawing a case ---------------------------------------------------------------------------


@st.composite
def cases(draw):
    """A dict describing one call (host-side parameters only; arrays are built from ``seed``)."""
    c = dict(
        layout=draw(st.sampled_from(LAYOUTS)),
        dtype=draw(st.sampled_from([F16, BF16])),
        D=draw(st.sampled_from([40, 59, 64, 80, 128])),
        Hk=draw(st.sampled_from([1, 2])),
        seed=draw(st.integers(0, 2**32 - 1)),
        causal=draw(st.booleans()),
        left=draw(st.sampled_from([-1, -1, 0, 5, 40])),
        softcap=draw(st.sampled_from([0.0, 0.0, 0.0, 3.0, 30.0])),
        alibi=draw(st.sampled_from([False, False, True])),
        scale_factor=draw(st.sampled_from([1.0, 1.0, 0.5, 2.0])),
        B=draw(st.integers(1, 3)),
    )
    c["H"] = c["Hk"] * draw(st.sampled_from([1, 2, 3, 4, 8]))
    c["right"] = 0 if c["causal"] else draw(st.sampled_from([-1, -1, 0, 7, 50]))
    # Short queries (decode kernel) as often as long ones (prefill kernel).
    len_q = st.one_of(st.integers(1, 4), st.integers(1, 128))
    B = c["B"]
    if c["layout"] == "dense":
        c["Sq"], c["Sk"] = draw(len_q), draw(st.integers(1, 300))
    elif c["layout"] in ("varlen", "paged"):
        c["lens_q"] = draw(st.lists(st.one_of(st.just(0), len_q), min_size=B, max_size=B))
        c["lens_k"] = draw(st.lists(st.integers(0, 300), min_size=B, max_size=B))
        if sum(c["lens_q"]) == 0:
            c["lens_q"][0] = 1
        if sum(c["lens_k"]) == 0:
            c["lens_k"][0] = 1
        c["P"] = draw(st.sampled_from([1, 16, 48, 256])) if c["layout"] == "paged" else 0
    else:
        c["S_new"] = draw(st.sampled_from([0, 1, 1, 2, 4]))
        c["Sq"] = c["S_new"] if c["S_new"] else draw(st.integers(1, 8))
        c["capacity"] = draw(st.integers(max(1, c["S_new"]), 300))
        c["lens"] = draw(st.lists(st.integers(0, c["capacity"] - c["S_new"]), min_size=B,
                                  max_size=B))
        c["num_splits"] = draw(st.sampled_from([0, 1, 3]))
        c["rotary"] = c["S_new"] > 0 and draw(st.booleans())
        if c["rotary"]:
            c["rot_half"] = max(1, int(c["D"] * draw(st.sampled_from([0.5, 1.0]))) // 2)
            c["interleaved"] = draw(st.booleans())
        if c["layout"] == "kvcache_paged":
            c["P"] = draw(st.sampled_from([1, 16, 48, 256]))
        else:
            c["extra_rows"] = draw(st.integers(0, 2))  # cache rows beyond B, via cache_batch_idx
            c["batch_idx"] = draw(st.booleans())
    return c


# -- running and checking ---------------------------------------------------------------------


def _mask_kwargs(c):
    kw = dict(causal=c["causal"], window_size=(c["left"], c["right"]), softcap=c["softcap"],
              softmax_scale=c["scale_factor"] / np.sqrt(c["D"]))
    return kw


def _poisoned(shape, dtype):
    return cp.full(shape, np.nan, dtype=dtype)


def _check(out, lse, q, k, v, slopes, c, what):
    """One sequence: out (Sq, H, D), lse (H, Sq) against the float64 reference."""
    ref, ref_lse, naive = ref_and_naive(q, k, v, alibi_slopes=slopes, **_mask_kwargs(c))
    assert_within_bound(out, ref, naive, c["dtype"], what=what)
    assert_lse_close(lse, ref_lse, **LSE_TOL)


def _run_dense(c, rng, slopes):
    B, H, Hk, D, dt = c["B"], c["H"], c["Hk"], c["D"], c["dtype"]
    q = randn(rng, (B, c["Sq"], H, D), dt)
    k, v = randn(rng, (B, c["Sk"], Hk, D), dt), randn(rng, (B, c["Sk"], Hk, D), dt)
    out = _poisoned(q.shape, dt)
    res, lse = fa.flash_attn_func(cp.asarray(q), cp.asarray(k), cp.asarray(v), out=out,
                                  alibi_slopes=None if slopes is None else cp.asarray(slopes),
                                  return_softmax_lse=True, **_mask_kwargs(c))
    assert res is out
    out_h, lse_h = out.get(), lse.get()
    for b in range(B):
        _check(out_h[b], lse_h[b], q[b], k[b], v[b], None if slopes is None else slopes[b], c,
               f"dense batch {b}")


def _run_varlen(c, rng, slopes):
    H, Hk, D, dt = c["H"], c["Hk"], c["D"], c["dtype"]
    lens_q, lens_k = c["lens_q"], c["lens_k"]
    q, keys, values, cu_q, cu_k = varlen_batch(rng, lens_q, lens_k, H, Hk, D, dt)
    kw = {}
    if c["layout"] == "paged":
        k_pages, v_pages, table = scatter_into_pages(rng, keys, values, c["P"], dt, spare_blocks=2,
                                                     min_pages=1)
        k_dev, v_dev = cp.asarray(k_pages), cp.asarray(v_pages)
        kw["block_table"] = cp.asarray(table)
    else:
        k_dev, v_dev = cp.asarray(np.concatenate(keys)), cp.asarray(np.concatenate(values))
    out = _poisoned(q.shape, dt)
    _, lse = fa.flash_attn_varlen_func(
        cp.asarray(q), k_dev, v_dev, cp.asarray(cu_q), cp.asarray(cu_k), max(lens_q),
        max(lens_k), out=out, return_softmax_lse=True, check=True,
        alibi_slopes=None if slopes is None else cp.asarray(slopes), **kw, **_mask_kwargs(c),
    )
    out_h, lse_h = out.get(), lse.get()
    for b in range(c["B"]):
        s, e = int(cu_q[b]), int(cu_q[b + 1])
        if e > s:
            _check(out_h[s:e], lse_h[:, s:e], q[s:e], keys[b], values[b],
                   None if slopes is None else slopes[b], c, f"{c['layout']} seq {b}")


def _rotate(x, cos, sin, positions, interleaved):
    """NumPy rotary of x (S, H, D) at ``positions`` (S,): the CUDA kernel's bit-exact twin."""
    return apply_rotary(x[None], cos, sin, np.asarray(positions)[None], interleaved)[0]


def _run_kvcache(c, rng, slopes):
    B, H, Hk, D, dt = c["B"], c["H"], c["Hk"], c["D"], c["dtype"]
    Sq, S_new, cap = c["Sq"], c["S_new"], c["capacity"]
    lens = np.array(c["lens"], dtype=np.int32)
    paged = c["layout"] == "kvcache_paged"
    q = randn(rng, (B, Sq, H, D), dt)
    kw = {}
    if paged:
        P = c["P"]
        width = -(-cap // P)
        n_pages = B * width + 2
        table = rng.permutation(n_pages)[: B * width].reshape(B, width).astype(np.int32)
        k_cache = randn(rng, (n_pages, P, Hk, D), dt)
        v_cache = randn(rng, (n_pages, P, Hk, D), dt)
        kw["block_table"] = cp.asarray(table)

        def where(b, pos):  # index of positions ``pos`` of sequence b into the cache
            return table[b, pos // P], pos % P
    else:
        rows = B + c["extra_rows"]
        idx = rng.permutation(rows)[:B].astype(np.int32) if c["batch_idx"] else np.arange(B)
        k_cache, v_cache = randn(rng, (rows, cap, Hk, D), dt), randn(rng, (rows, cap, Hk, D), dt)
        if c["batch_idx"]:
            kw["cache_batch_idx"] = cp.asarray(idx.astype(np.int32))
        elif rows != B:  # without cache_batch_idx the cache has one row per sequence
            k_cache, v_cache = k_cache[:B].copy(), v_cache[:B].copy()

        def where(b, pos):
            return idx[b], pos
    k_exp, v_exp = k_cache.copy(), v_cache.copy()
    q_exp = q
    if S_new:
        k_new, v_new = randn(rng, (B, S_new, Hk, D), dt), randn(rng, (B, S_new, Hk, D), dt)
        kw.update(k=cp.asarray(k_new), v=cp.asarray(v_new))
        q_exp = q.copy()
        if c["rotary"]:
            # A row per position of the cache (flash-attn's rule): the paged table's whole width.
            ro_rows = -(-cap // c["P"]) * c["P"] if paged else cap
            ang = rng.uniform(0, 2 * np.pi, (ro_rows, c["rot_half"]))
            cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
            kw.update(rotary_cos=cp.asarray(cos), rotary_sin=cp.asarray(sin),
                      rotary_interleaved=c["interleaved"])
            per_token = c["causal"] or c["left"] >= 0 or c["right"] >= 0
        for b in range(B):
            pos = int(lens[b]) + np.arange(S_new)
            kn = k_new[b]
            if c["rotary"]:
                kn = _rotate(k_new[b], cos, sin, pos, c["interleaved"])
                q_pos = int(lens[b]) + (np.arange(Sq) if per_token else np.zeros(Sq, np.int64))
                q_exp[b] = _rotate(q[b], cos, sin, q_pos, c["interleaved"])
            k_exp[where(b, pos)] = kn
            v_exp[where(b, pos)] = v_new[b]
    kc, vc = cp.asarray(k_cache), cp.asarray(v_cache)
    out = _poisoned(q.shape, dt)
    _, lse = fa.flash_attn_with_kvcache(
        cp.asarray(q), kc, vc, cache_seqlens=cp.asarray(lens), num_splits=c["num_splits"],
        alibi_slopes=None if slopes is None else cp.asarray(slopes), out=out,
        return_softmax_lse=True, check=True, **kw, **_mask_kwargs(c),
    )
    # The whole cache after the append, bit for bit (new rows in place, nothing else touched).
    for name, got, exp in (("k_cache", kc, k_exp), ("v_cache", vc, v_exp)):
        g, e = got.get().view(np.uint16), exp.view(np.uint16)
        bad = np.argwhere(g != e)
        assert bad.size == 0, f"{name}: {len(bad)} elements differ from the expected append, " \
                              f"first at {tuple(bad[0])}"
    out_h, lse_h = out.get(), lse.get()
    for b in range(B):
        pos = np.arange(int(lens[b]) + S_new)
        kb, vb = k_exp[where(b, pos)], v_exp[where(b, pos)]
        _check(out_h[b], lse_h[b], q_exp[b], kb, vb, None if slopes is None else slopes[b], c,
               f"{c['layout']} batch {b}")


@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
          print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(c=cases())
def test_random_problems_on_gpu(c):
    rng = np.random.default_rng(c["seed"])
    slopes = rng.uniform(0.01, 0.5, (c["B"], c["H"])).astype(np.float32) if c["alibi"] else None
    if c["layout"] == "dense":
        _run_dense(c, rng, slopes)
    elif c["layout"] in ("varlen", "paged"):
        _run_varlen(c, rng, slopes)
    else:
        _run_kvcache(c, rng, slopes)
