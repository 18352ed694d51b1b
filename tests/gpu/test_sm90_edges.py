"""The Hopper (sm_90a) prefill path on the edges that matter to its own code: the producer's
cp.async gather (lengths that are not multiples of the 128 x kBlockN tile, the last partial
page, page sizes 1 / 7 / 16 / 48 / 64 / 256 with scattered pages), the consumers' per-warpgroup
tile ranges (causal rows split over two warpgroups, Sq = 1), GQA ratios, and the head-dim
buckets (64 / 80 / 128 / 200 / 256).  Same oracle and bound as test_gpu_kernels.py; the whole
GPU suite also runs on this path (the default for prefill on a 9.0 device; these tests force
it).
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from test_gpu_kernels import check, make_problem  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def sm90_path():
    from cupy_flashattn._cuda import is_available
    from cupy_flashattn._cuda.launch import force_prefill_arch

    if not is_available() or int(cupy.cuda.Device().compute_capability) != 90:
        pytest.skip("the sm_90a kernels need a compute capability 9.0 GPU")
    force_prefill_arch("sm90")
    yield
    force_prefill_arch(None)


def check_sm90(problem):
    """check() of test_gpu_kernels.py, after asserting the problem runs on the sm90 family."""
    from cupy_flashattn._cuda import select_kernel

    assert select_kernel(problem).arch == "sm90"
    check(problem)



@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("d", [64, 80, 128, 200, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_and_ragged_tiles(dtype, d, causal):
    rng = np.random.default_rng(d + 7 * causal)
    check_sm90(make_problem(rng, dtype=dtype, d=d, h=2, lens_q=[97, 300], lens_k=[1025, 131],
                        causal=causal))


@pytest.mark.parametrize("page", [1, 7, 16, 48, 64, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_pages_scattered_partial_last(page, causal):
    rng = np.random.default_rng(page + 1000 * causal)
    check_sm90(make_problem(rng, dtype="bf16", d=128, h=8, hk=2, lens_q=[130, 1, 257],
                        lens_k=[300, 129, 1000], page=page, causal=causal))


@pytest.mark.parametrize("ratio", [1, 4, 7, 8])
def test_gqa_ratios(ratio):
    rng = np.random.default_rng(ratio)
    check_sm90(make_problem(rng, dtype="f16", d=64, h=2 * ratio, hk=2, lens_q=[200, 200],
                        lens_k=[333, 333], causal=True))


@pytest.mark.parametrize("sk", [1, 97, 4096])
def test_single_query_row(sk):
    rng = np.random.default_rng(sk)
    check_sm90(make_problem(rng, dtype="bf16", d=128, h=4, lens_q=[1, 1], lens_k=[sk, sk], causal=True))


@pytest.mark.parametrize("window", [(32, 0), (100, 100), (-1, 8)])
def test_windows_alibi_softcap(window):
    rng = np.random.default_rng(sum(window))
    check_sm90(make_problem(rng, dtype="f16", d=128, h=3, lens_q=[260, 260], lens_k=[400, 400],
                        window=window, alibi=True, softcap=30.0))


def test_long_causal_many_tiles():
    rng = np.random.default_rng(42)
    check_sm90(make_problem(rng, dtype="bf16", d=128, h=2, lens_q=[2049], lens_k=[2049], causal=True))


def test_tma_maps_follow_the_arrays_between_cached_calls():
    """A cached plan re-encodes a TMA map only when its array moved (launcher.TmaLaunch): calls
    alternating between two K/V arrays (A, B, A), and a pool rewritten in place between calls
    (same address, new values), each give what a fresh call on those arrays gives."""
    import cupy_flashattn as fa
    from cupy_flashattn._signature import CALLS

    rng = np.random.default_rng(3)
    B, S, H, D = 2, 300, 4, 128

    def arr(shape):
        return cupy.asarray(rng.standard_normal(shape).astype(np.float16))

    q = arr((B, S, H, D))
    kv = {name: (arr((B, S, H, D)), arr((B, S, H, D))) for name in "AB"}
    expected = {}
    for name, (k, v) in kv.items():
        CALLS.clear()
        expected[name] = fa.flash_attn_func(q, k, v, causal=True).get()
    CALLS.clear()
    for name in "ABA":
        out = fa.flash_attn_func(q, *kv[name], causal=True)  # one cached plan for all three
        np.testing.assert_array_equal(out.get(), expected[name])
    k, v = kv["A"]
    k[...] = kv["B"][0]
    v[...] = kv["B"][1]  # A's buffers now hold B's values, at A's addresses
    np.testing.assert_array_equal(fa.flash_attn_func(q, k, v, causal=True).get(), expected["B"])


@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_pages_of_an_interleaved_kv_pool(page, causal):
    """K and V as the two halves of one (num_pages, 2, P, Hk, D) pool (vLLM's layout): the page
    stride is 2 P rows, not P rows; the 4-D TMA maps (page id outermost) read it as they read a
    contiguous pool."""
    rng = np.random.default_rng(page + 77 * causal)
    problem = make_problem(rng, dtype="bf16", d=128, h=8, hk=2, lens_q=[130, 1, 257],
                           lens_k=[300, 129, 1000], page=page, causal=causal)
    pool = cupy.empty((problem.k.shape[0], 2) + problem.k.shape[1:], problem.k.dtype)
    pool[:, 0], pool[:, 1] = problem.k, problem.v
    problem.k, problem.v = pool[:, 0], pool[:, 1]
    assert problem.k.strides[0] == 2 * page * problem.k.strides[1]
    check_sm90(problem)


@pytest.mark.parametrize("layout", ["dense", "varlen"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_wide_key_tiles_without_a_window(layout, dtype):
    """No causal / local window and keys of at least SM90_WIDE_MIN_KEYS: the wide D = 128 kernel
    (176-key tiles, KernelKey.wide).  Lengths that no key tile divides, so every query tile has
    a sequence-end tile: by TMA from the per-sequence maps (dense: two sequences) or gathered
    (varlen); D = 80 rides the 128 bucket with a predicated tail."""
    from cupy_flashattn._cuda import compile as cc
    from cupy_flashattn._cuda import select_kernel

    n = cc.SM90_WIDE_MIN_KEYS
    lens_k = [n + 77, n + 77] if layout == "dense" else [n + 77, 300, n + 1]
    lens_q = [200, 200] if layout == "dense" else [200, 37, 129]
    rng = np.random.default_rng(n + (layout == "dense"))
    problem = make_problem(rng, dtype=dtype, d=80, h=4, hk=2, lens_q=lens_q, lens_k=lens_k,
                           varlen=layout == "varlen")
    assert select_kernel(problem).wide
    check_sm90(problem)
