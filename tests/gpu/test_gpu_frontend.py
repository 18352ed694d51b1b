"""The front end on the GPU (issue 15): a repeated call (served from the per-signature call cache,
``_signature.py``) gives what a fresh call gives; the default path never synchronises with the
device (checked under CUDA stream capture, inside which CuPy and the driver refuse every
synchronising operation); a decode step captured once in a CUDA graph replays with new
``cache_seqlens`` / block-table / token contents and matches eager calls."""

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn._signature import CALLS
from helpers import BF16, assert_within_bound, randn, ref_and_naive

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

H, HK, D, P = 8, 2, 64, 16


def _rnd(rng, shape, dt=BF16):
    return cp.asarray(randn(rng, shape, dt))


def _cases(rng):
    """name -> (fn(inputs) -> outputs, make_inputs()) for every cached entry point."""
    B, S = 2, 40
    cases = {}

    def dense_inputs():
        return [_rnd(rng, (B, S, H, D)), _rnd(rng, (B, S, HK, D)), _rnd(rng, (B, S, HK, D))]
    cases["dense"] = (lambda x: fa.flash_attn_func(*x, causal=True, return_softmax_lse=True),
                      dense_inputs)
    alibi = cp.asarray(rng.uniform(0.1, 1, H).astype(np.float32))
    cases["dense_alibi_softcap"] = (
        lambda x: fa.flash_attn_func(*x, alibi_slopes=alibi, softcap=5.0), dense_inputs)
    attn = fa.FlashAttention(causal=True, window_size=(16, 0))
    cases["object"] = (lambda x: attn(*x), dense_inputs)
    cu = cp.asarray([0, 17, 40], dtype=cp.int32)

    def varlen_inputs():
        return [_rnd(rng, (40, H, D)), _rnd(rng, (40, HK, D)), _rnd(rng, (40, HK, D))]
    cases["varlen"] = (lambda x: fa.flash_attn_varlen_func(*x, cu, cu, 23, 23, causal=True),
                       varlen_inputs)
    table = cp.asarray(rng.permutation(12).astype(np.int32).reshape(2, 6))
    cu_k = cp.asarray([0, 90, 150], dtype=cp.int32)

    def paged_inputs():
        return [_rnd(rng, (40, H, D)), _rnd(rng, (12, P, HK, D)), _rnd(rng, (12, P, HK, D))]
    cases["varlen_paged"] = (
        lambda x: fa.flash_attn_varlen_func(*x, cu, cu_k, 23, 90, causal=True, block_table=table),
        paged_inputs)
    lens = cp.asarray([30, 61], dtype=cp.int32)
    cos = cp.asarray(np.cos(rng.uniform(0, 6, (128, D // 4))).astype(BF16))
    sin = cp.asarray(np.sin(rng.uniform(0, 6, (128, D // 4))).astype(BF16))

    def kv_inputs(paged):
        def make():
            cache = (12, P, HK, D) if paged else (B, 96, HK, D)
            return [_rnd(rng, (B, 1, H, D)), _rnd(rng, cache), _rnd(rng, cache),
                    _rnd(rng, (B, 1, HK, D)), _rnd(rng, (B, 1, HK, D))]
        return make
    cases["kvcache_paged_rotary_append"] = (
        lambda x: fa.flash_attn_with_kvcache(x[0], x[1], x[2], k=x[3], v=x[4], rotary_cos=cos,
                                             rotary_sin=sin, cache_seqlens=lens, block_table=table,
                                             causal=True, return_softmax_lse=True),
        kv_inputs(True))
    cases["kvcache_contiguous_append_split"] = (
        lambda x: fa.flash_attn_with_kvcache(x[0], x[1], x[2], k=x[3], v=x[4], cache_seqlens=lens,
                                             causal=True, num_splits=3),
        kv_inputs(False))
    cases["kvcache_int_seqlens"] = (
        lambda x: fa.flash_attn_with_kvcache(x[0], x[1], x[2], cache_seqlens=50),
        kv_inputs(False))
    return cases


CASE_NAMES = ["dense", "dense_alibi_softcap", "object", "varlen", "varlen_paged",
              "kvcache_paged_rotary_append", "kvcache_contiguous_append_split",
              "kvcache_int_seqlens"]  # static: collection must not touch the GPU


def test_case_names_match_cases():
    assert sorted(_cases(np.random.default_rng(0))) == sorted(CASE_NAMES)


def _flat(result):
    items = result if isinstance(result, tuple) else (result,)
    return [np.asarray(a.get()).astype(np.float64) for a in items if a is not None]


def _run_fresh(fn, inputs):
    """The call with an empty call cache (full validation and a new launch plan)."""
    CALLS.clear()
    return fn([a.copy() for a in inputs])


@pytest.mark.parametrize("name", CASE_NAMES)
def test_cached_call_equals_fresh_call(name):
    rng = np.random.default_rng(1)
    fn, make = _cases(rng)[name]
    CALLS.clear()
    fn(make())  # fills the cache for this signature
    inputs = make()  # new arrays, new values, same signature
    hits = CALLS.hits
    cached = fn([a.copy() for a in inputs])
    assert CALLS.hits == hits + 1, "the second call of one signature must be served from the cache"
    fresh = _run_fresh(fn, inputs)
    for a, b in zip(_flat(cached), _flat(fresh)):
        np.testing.assert_array_equal(a, b)


def test_cache_misses_on_a_new_signature_and_still_validates():
    rng = np.random.default_rng(2)
    q, k = _rnd(rng, (1, 8, H, D)), _rnd(rng, (1, 8, HK, D))
    CALLS.clear()
    fa.flash_attn_func(q, k, k)
    # Same shapes but a bad value where only validation catches it: never served from cache.
    with pytest.raises(fa.FlashAttnError):
        fa.flash_attn_func(q, k, k, window_size=(True, 0))
    with pytest.raises(fa.FlashAttnError):
        fa.flash_attn_func(q, k[:, :, :1].copy()[:, :, :, :32], k)
    out = fa.flash_attn_func(q[:, :5].copy(), k, k)  # another shape: a new entry, right result
    ref, _, naive = ref_and_naive(q[:, :5].get(), k.get(), k.get())
    assert_within_bound(out, ref, naive, BF16)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_default_path_never_synchronises(name):
    """Inside a stream capture every synchronising CUDA call (a device-to-host copy, a stream or
    device synchronize, a pageable host-to-device copy) fails: the call must go through."""
    rng = np.random.default_rng(3)
    fn, make = _cases(rng)[name]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        inputs = make()
        fn(inputs)  # compile, validate and plan outside the capture; warms the memory pool
        fn(inputs)
        stream.synchronize()
        stream.begin_capture()
        try:
            fn(inputs)
        finally:
            graph = stream.end_capture()
    assert graph is not None


@pytest.mark.parametrize("paged", [False, True])
def test_decode_step_graph_replay_matches_eager(paged):
    """Capture one decode step (rotary + append + attention) and replay it with new token
    values and new cache_seqlens: same results as eager calls on a copy of the cache."""
    rng = np.random.default_rng(4 + paged)
    B = 3
    cache_shape = (16, P, HK, D) if paged else (B, 96, HK, D)
    kc, vc = _rnd(rng, cache_shape), _rnd(rng, cache_shape)
    table = cp.asarray(rng.permutation(16)[:15].astype(np.int32).reshape(B, 5)) if paged else None
    lens = cp.asarray([5, 40, 17], dtype=cp.int32)
    cos = cp.asarray(np.cos(rng.uniform(0, 6, (128, D // 2))).astype(np.float32))
    sin = cp.asarray(np.sin(rng.uniform(0, 6, (128, D // 2))).astype(np.float32))
    q, k1, v1 = _rnd(rng, (B, 1, H, D)), _rnd(rng, (B, 1, HK, D)), _rnd(rng, (B, 1, HK, D))

    def step(kc, vc):
        return fa.flash_attn_with_kvcache(q, kc, vc, k=k1, v=v1, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=lens, block_table=table, causal=True)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        kc_eager, vc_eager = kc.copy(), vc.copy()
        step(kc.copy(), vc.copy())  # warm-up: compile, plan, memory pool
        stream.synchronize()
        stream.begin_capture()
        out_graph = step(kc, vc)
        graph = stream.end_capture()
        for it in range(3):
            q[...] = _rnd(rng, q.shape)
            k1[...] = _rnd(rng, k1.shape)
            v1[...] = _rnd(rng, v1.shape)
            graph.launch(stream)
            expected = step(kc_eager, vc_eager)
            stream.synchronize()
            np.testing.assert_array_equal(out_graph.get().astype(np.float64),
                                          expected.get().astype(np.float64))
            np.testing.assert_array_equal(kc.get().astype(np.float64), kc_eager.get().astype(np.float64))
            lens += 1  # the next step appends one position later (device-side update)


def test_back_to_back_split_decodes_share_workspace_safely():
    """A cached split-KV decode plan reuses its partials buffer and an LSE scratch buffer per
    stream (``DecodePlan._workspace``, a ``PerStream``; ``_Call._lse_buffer``): many calls issued back to
    back on one stream, and on two streams at once, must each give the result of a fresh call
    on their own inputs."""
    rng = np.random.default_rng(7)
    B, ctx = 2, 300
    kc, vc = _rnd(rng, (B, ctx, HK, D)), _rnd(rng, (B, ctx, HK, D))
    lens = cp.asarray([ctx, 211], dtype=cp.int32)
    qs = [_rnd(rng, (B, 1, H, D)) for _ in range(6)]

    def call(q):
        return fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=4)

    expected = []
    for q in qs:
        CALLS.clear()
        expected.append(call(q).get())
        cp.cuda.Device().synchronize()
    CALLS.clear()
    call(qs[0])
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    outs = [None] * len(qs)
    for i, q in enumerate(qs):  # no synchronisation in between
        with streams[i % 2]:
            outs[i] = call(q)
    cp.cuda.Device().synchronize()
    for got, want in zip(outs, expected):
        np.testing.assert_array_equal(got.get(), want)
