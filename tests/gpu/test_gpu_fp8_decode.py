"""The decode kernel on float8 K/V (issue 16; flash_decode.cu with Kv = KvE4M3 / KvE5M2): the
launcher below the front end (decode.run_decode); the public API's float8 path is
tests/gpu/test_gpu_fp8_api.py.  K/V are uint8 CuPy arrays of float8 bytes with
``problem.kv_dtype`` naming the format (CuPy has no float8 dtype).

Oracle: the float64 attention of the *dequantized* cache (float(k8) * k_scale per kv head), with
flash-attn's bound against the same attention computed naively in the query's 16-bit type on
the dequantized values; LSE within 1e-3.  Inputs: random normal K/V quantized like vLLM does
(scale = amax / format max per kv head, times a random factor), NaN-poisoned outputs, dense and
paged caches (page 16 / 256, scattered, partial last page), MHA / GQA / MQA, head dims 64 / 128 /
256, one and several query rows, a forced split.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from cupy_flashattn.reference import problem_ref  # noqa: E402

from test_gpu_kernels import _check_out, make_problem  # noqa: E402

pytestmark = pytest.mark.gpu

FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


@pytest.fixture(scope="module", autouse=True)
def cuda():
    from cupy_flashattn._cuda import is_available

    if not is_available():
        pytest.skip("no CUDA device")


def quantize_cache(problem, fmt, rng):
    """problem with its K / V replaced by float8 copies and per-head scales on the device; returns
    (problem, the dequantized K / V as float64 NumPy arrays)."""
    dt = FORMATS[fmt]
    limit = float(ml_dtypes.finfo(dt).max)
    out = {}
    for name in ("k", "v"):
        x = cupy.asnumpy(getattr(problem, name)).astype(np.float32)
        amax = np.abs(x).reshape(-1, x.shape[-2], x.shape[-1]).max(axis=(0, 2))
        scale = (amax / limit * rng.uniform(1.0, 1.5, amax.shape)).astype(np.float32)
        x8 = np.clip(x / scale[:, None], -limit, limit).astype(dt)
        setattr(problem, name, cupy.asarray(x8.view(np.uint8)))  # CuPy has no float8 dtype
        setattr(problem, f"{name}_scale", cupy.asarray(scale))
        out[name] = x8.astype(np.float64) * scale[:, None]
    problem.kv_dtype = np.dtype(dt)
    return problem, out["k"], out["v"]


def check_fp8(problem, k_deq, v_deq, num_splits=0):
    from cupy_flashattn._cuda.decode import plan, run_decode

    assert plan(problem)[0].kv, "expected a float8 decode kernel"
    problem.num_splits = num_splits
    ref_p = copy.copy(problem)
    ref_p.k, ref_p.v = k_deq, v_deq
    ref_p.k_scale = ref_p.v_scale = ref_p.kv_dtype = None
    ref, ref_lse = problem_ref(ref_p)
    naive_p = copy.copy(ref_p)
    q_dtype = cupy.asnumpy(problem.q).dtype
    naive_p.q = cupy.asnumpy(problem.q)
    naive_p.k, naive_p.v = k_deq.astype(q_dtype), v_deq.astype(q_dtype)
    naive, _ = problem_ref(naive_p, upcast=False)

    _check_out(problem, ref, ref_lse, naive, run=run_decode)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_dense_cache(fmt, dtype, d):
    rng = np.random.default_rng(d + 3 * (fmt == "e5m2") + 7 * (dtype == "f16"))
    p = make_problem(rng, dtype=dtype, d=d, h=8, hk=2, lens_q=[1, 1, 1], lens_k=[97, 1025, 1],
                     varlen=True)
    check_fp8(*quantize_cache(p, fmt, rng))


@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("h,hk", [(8, 8), (8, 2), (8, 1)])
def test_paged_cache_scattered_partial_last(page, h, hk):
    rng = np.random.default_rng(page + h * 10 + hk)
    p = make_problem(rng, dtype="bf16", d=128, h=h, hk=hk, lens_q=[1, 1, 1],
                     lens_k=[300, 17, 1000], page=page)
    check_fp8(*quantize_cache(p, "e4m3", rng))


@pytest.mark.parametrize("splits", [1, 3])
def test_several_query_rows_causal_and_split(splits):
    rng = np.random.default_rng(11 + splits)
    p = make_problem(rng, dtype="bf16", d=128, h=8, hk=2, lens_q=[4, 2], lens_k=[700, 513],
                     page=16, causal=True)
    check_fp8(*quantize_cache(p, "e4m3", rng), num_splits=splits)
