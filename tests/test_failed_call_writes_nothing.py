"""Issue 10, defect 1: a ``flash_attn_with_kvcache`` call that raises leaves every input and every
cache bit-identical -- for each argument that can be wrong, on both backends, with a contiguous
cache, a paged cache (arrays + block table) and a ``PagedKVCache``.

Before the fix, a bad ``alibi_slopes`` or a wrong-shaped ``out=`` was detected only after the
new k/v rows had been appended (contiguous cache: rows written; PagedKVCache: length 3 -> 4),
so retrying after fixing the argument appended the token twice.

Each case starts from a valid decode step with new tokens and rotary tables, breaks one
argument, expects a typed ``FlashAttnError``, then compares every array the call could write
(caches / pools, q, k, v, out) and the PagedKVCache bookkeeping with a snapshot.  A last check
makes the same call with the argument repaired and verifies that it appends exactly once.
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_flashattn as fa

B, SQ, H, HK, D, P = 2, 1, 4, 2, 32, 16
CAP = 64  # contiguous cache capacity; the paged ones hold 4 pages of 16 per sequence
LENS = (5, 17)


def _xp(name):
    if name == "numpy":
        return np
    return pytest.importorskip("cupy")


XPS = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


def _rand(xp, rng, shape, dtype=np.float16):
    return xp.asarray(rng.standard_normal(shape).astype(dtype))


def _to_host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _valid_call(xp, layout, rng):
    """(kwargs for flash_attn_with_kvcache, the arrays it may write, the PagedKVCache or None)."""
    q = _rand(xp, rng, (B, SQ, H, D))
    k, v = _rand(xp, rng, (B, 1, HK, D)), _rand(xp, rng, (B, 1, HK, D))
    angles = rng.uniform(0, 6, (CAP + 8, D // 4))
    cos, sin = xp.asarray(np.cos(angles).astype(np.float16)), xp.asarray(np.sin(angles).astype(np.float16))
    kw = dict(q=q, k=k, v=v, rotary_cos=cos, rotary_sin=sin, causal=True,
              alibi_slopes=xp.asarray(rng.uniform(0.1, 1, H).astype(np.float32)),
              out=xp.asarray(np.full((B, SQ, H, D), np.nan, dtype=np.float16)))
    cache = None
    if layout == "contiguous":
        kw["k_cache"] = _rand(xp, rng, (B, CAP, HK, D))
        kw["v_cache"] = _rand(xp, rng, (B, CAP, HK, D))
        kw["cache_seqlens"] = xp.asarray(np.array(LENS, dtype=np.int32))
    elif layout == "paged":
        kw["k_cache"] = _rand(xp, rng, (8, P, HK, D))
        kw["v_cache"] = _rand(xp, rng, (8, P, HK, D))
        kw["cache_seqlens"] = xp.asarray(np.array(LENS, dtype=np.int32))
        kw["block_table"] = xp.asarray(rng.permutation(8).astype(np.int32).reshape(B, 4))
    else:
        cache = fa.PagedKVCache(num_blocks=8, page_block_size=P, num_heads_k=HK, head_dim=D,
                                dtype=np.float16, max_blocks_per_seq=4, xp=xp)
        for n in LENS:
            sid = cache.add_sequence()
            cache.append([sid], _rand(xp, rng, (1, n, HK, D)), _rand(xp, rng, (1, n, HK, D)))
        kw["k_cache"], kw["v_cache"] = cache, None
    return kw, cache


def _snapshot(kw, cache):
    arrays = {name: _to_host(a).copy() for name, a in kw.items()
              if name in ("q", "k", "v", "out", "k_cache", "v_cache") and a is not None
              and not isinstance(a, fa.PagedKVCache)}
    if cache is not None:
        arrays["pool.k"] = _to_host(cache.k_pages).copy()
        arrays["pool.v"] = _to_host(cache.v_pages).copy()
        arrays["seqlens"] = _to_host(cache.seqlens()).copy()
        arrays["table"] = _to_host(cache.block_table()).copy()
        arrays["free"] = np.array(cache.num_free_blocks)
    return arrays


def _assert_same(before, after):
    assert before.keys() == after.keys()
    for name in before:
        # Bit patterns: NaN (the poisoned out) compares equal to itself this way.
        assert before[name].tobytes() == after[name].tobytes(), f"{name} changed by a failed call"


def _bad(xp, kw, layout):
    """name -> a function turning the valid kwargs into ones with that argument wrong."""
    f32, i64 = np.float32, np.int64
    cases = {
        "alibi_slopes shape": lambda: kw.update(alibi_slopes=xp.ones((H + 1,), dtype=f32)),
        "alibi_slopes dtype": lambda: kw.update(alibi_slopes=kw["alibi_slopes"].astype(np.float16)),
        "out shape": lambda: kw.update(out=xp.zeros((B, SQ, H, D + 8), dtype=np.float16)),
        "out dtype": lambda: kw.update(out=xp.zeros((B, SQ, H, D), dtype=f32)),
        "q dtype": lambda: kw.update(q=kw["q"].astype(f32)),
        "q heads": lambda: kw.update(q=xp.zeros((B, SQ, H + 1, D), dtype=np.float16)),
        "k head dim": lambda: kw.update(k=xp.zeros((B, 1, HK, D + 8), dtype=np.float16)),
        "v shape": lambda: kw.update(v=xp.zeros((B, 2, HK, D), dtype=np.float16)),
        "k dtype": lambda: kw.update(k=kw["k"].astype(f32)),
        "v without k": lambda: kw.update(k=None),
        "rotary_sin shape": lambda: kw.update(rotary_sin=kw["rotary_sin"][:, :2]),
        "rotary_cos too short": lambda: kw.update(rotary_cos=kw["rotary_cos"][:3],
                                                  rotary_sin=kw["rotary_sin"][:3]),
        "window_size": lambda: kw.update(window_size=(True, 0)),
        "softcap": lambda: kw.update(softcap=-1.0),
        "softmax_scale": lambda: kw.update(softmax_scale="0.1"),
        "num_splits": lambda: kw.update(num_splits=-2),
    }
    if layout != "paged_kv_cache":
        cases.update({
            "cache_seqlens dtype": lambda: kw.update(cache_seqlens=kw["cache_seqlens"].astype(i64)),
            "cache_seqlens length": lambda: kw.update(cache_seqlens=kw["cache_seqlens"][:1]),
            "v_cache shape": lambda: kw.update(v_cache=kw["v_cache"][:, :, :1]),
            "page_block_size": lambda: kw.update(page_block_size=P + 1 if layout == "paged"
                                                 else 7),
        })
    if layout == "paged":
        cases["block_table dtype"] = lambda: kw.update(block_table=kw["block_table"].astype(i64))
        cases["cache_batch_idx with pages"] = lambda: kw.update(
            cache_batch_idx=xp.asarray(np.array([1, 0], dtype=np.int32)))
    if layout == "contiguous":
        cases["cache_batch_idx length"] = lambda: kw.update(
            cache_batch_idx=xp.asarray(np.array([0], dtype=np.int32)))
    if layout == "paged_kv_cache":
        cases.update({
            "cache_seqlens given": lambda: kw.update(cache_seqlens=xp.asarray(
                np.array(LENS, dtype=np.int32))),
            "seq_ids length": lambda: kw.update(seq_ids=[0]),
            "seq_ids unknown": lambda: kw.update(seq_ids=[0, 99]),
        })
    if xp is np:
        def read_only_out():
            kw["out"].flags.writeable = False
        cases["out read-only"] = read_only_out
    return cases


LAYOUTS = ["contiguous", "paged", "paged_kv_cache"]
_NAMES = {layout: sorted(_bad(np, _valid_call(np, layout, np.random.default_rng(0))[0], layout))
          for layout in LAYOUTS}
CASES = [(layout, name) for layout in LAYOUTS for name in _NAMES[layout]]


@pytest.mark.parametrize("xp_name", XPS)
@pytest.mark.parametrize("layout,name", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_failed_call_changes_nothing(xp_name, layout, name):
    xp = _xp(xp_name)
    kw, cache = _valid_call(xp, layout, np.random.default_rng(1))
    cases = _bad(xp, kw, layout)
    if name not in cases:
        pytest.skip(f"{name}: a NumPy-only case")
    cases[name]()
    before = _snapshot(kw, cache)
    with pytest.raises(fa.FlashAttnError):
        fa.flash_attn_with_kvcache(**kw)
    _assert_same(before, _snapshot(kw, cache))


@pytest.mark.parametrize("xp_name", XPS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_retry_after_a_failed_call_appends_once(xp_name, layout):
    """The scenario of the issue: a bad alibi_slopes, then the same call repaired."""
    xp = _xp(xp_name)
    kw, cache = _valid_call(xp, layout, np.random.default_rng(2))
    good_alibi = kw["alibi_slopes"]
    kw["alibi_slopes"] = xp.ones((H + 1,), dtype=np.float32)
    with pytest.raises(fa.FlashAttnError):
        fa.flash_attn_with_kvcache(**kw)
    kw["alibi_slopes"] = good_alibi
    fa.flash_attn_with_kvcache(**kw)
    if cache is not None:
        assert _to_host(cache.seqlens()).tolist() == [n + 1 for n in LENS]
    else:
        # The new token sits at position LENS[b] of sequence b (rotated, so compare v).
        v_cache = _to_host(kw["v_cache"])
        v_new = _to_host(kw["v"])
        for b, n in enumerate(LENS):
            if layout == "paged":
                table = _to_host(kw["block_table"])
                row = v_cache[table[b, n // P], n % P]
            else:
                row = v_cache[b, n]
            assert row.tobytes() == v_new[b, 0].tobytes()
