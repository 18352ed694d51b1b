"""common.cuh exp2_poly, the softmax's exponential on the FMA pipe (FA_SM90_EXP_POLY), against
float64 2^x: within its stated bound (7.5e-5 relative) on the softmax's range x in [-125, 0],
exactly 0 below -125 (a masked key's -inf must give 0, or an empty row's l would not stay 0;
ex2.approx.ftz flushes only below -126, a difference of ~1e-38 that no 16-bit P can hold), and
NaN for every NaN bit pattern (a NaN score must reach l and O).

The kernels that call it are tested end to end by the GPU suite built with the switch on
(tools/device_switch_ab.sh); this pins the function itself over a million arguments.
"""

from __future__ import annotations

import numpy as np
import pytest

from cupy_flashattn._cuda.source import build_source

pytestmark = pytest.mark.gpu

PROBE = r"""
extern "C" __global__ void exp2_poly_probe(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fa::exp2_poly(x[i]);
}
"""

#: The polynomial's least-max relative error on [-1/2, 1/2] in float32 (common.cuh), with
#: room for the float32 multiply by 2^j.
BOUND = 7.6e-5


def _run(x: np.ndarray) -> np.ndarray:
    import cupy

    module = cupy.RawModule(code=build_source("common.cuh") + PROBE, options=("--std=c++17",))
    fn = module.get_function("exp2_poly_probe")
    dx = cupy.asarray(x.astype(np.float32))
    dy = cupy.full(x.shape, np.float32(1234.5))  # poisoned: every element must be written
    fn(((x.size + 255) // 256,), (256,), (dx, dy, np.int32(x.size)))
    return cupy.asnumpy(dy)


def test_exp2_poly_within_its_bound_on_the_softmax_range():
    rng = np.random.default_rng()
    x = np.concatenate([
        -rng.random(1_000_000) * 125.0,                      # the whole range
        -rng.random(100_000),                               # where P is largest
        np.linspace(-125.0, -124.0, 4097),                  # the smallest results
        np.arange(-125, 0, dtype=np.float64) + 0.5,         # ties of round(x)
        np.arange(-125, 1, dtype=np.float64),               # integers: f = 0
        [0.0, -0.0, 1e-7, 2e-7, -1e-30],                    # s = m (x = the rounding of m c)
    ]).astype(np.float32)
    y = _run(x).astype(np.float64)
    ref = np.exp2(x.astype(np.float64))
    rel = np.abs(y / ref - 1.0)
    worst = int(np.argmax(rel))
    assert rel.max() <= BOUND, f"exp2_poly({x[worst]!r}) = {y[worst]!r}, 2^x = {ref[worst]!r}"


def test_exp2_poly_is_zero_below_minus_125_and_for_minus_inf():
    x = np.array([-125.00001, -125.99999, -126.0, -126.5, -127.0, -127.5, -128.0, -150.0, -1e4,
                  -3e38, -np.inf], dtype=np.float32)
    y = _run(x)
    assert np.array_equal(y, np.zeros_like(y)) and not np.signbit(y).any(), y


def test_exp2_poly_keeps_nan():
    bits = np.array([0x7FC00000, 0x7FFFFFFF, 0xFFC00000, 0xFFFFFFFF, 0x7F800001, 0xFF800001],
                    dtype=np.uint32)
    y = _run(bits.view(np.float32))
    assert np.isnan(y).all(), y
