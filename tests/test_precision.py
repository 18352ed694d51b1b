"""CPU: the float32 precision setting (precision.py) and how it reaches kernel selection and the
call cache; float64's GPU head-dim limit.  The accuracy itself is asserted on the GPU
(tests/gpu/test_gpu_precise.py)."""

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import _signature
from cupy_flashattn._cuda import compile as cc
from cupy_flashattn.errors import ArgumentError


@pytest.fixture(autouse=True)
def restore():
    yield
    fa.set_float32_precision("highest")


def test_default_is_float32_accuracy():
    assert fa.get_float32_precision() == "highest"
    assert cc.kernel_dtype_tag(np.float32) == "f32"
    assert cc.kernel_dtype_tag(np.float64) == "f64"
    assert cc.kernel_dtype_tag(np.float16) == "f16"


@pytest.mark.parametrize("mode,tag", [("highest", "f32"), ("high", "tf32"), ("medium", "bf16")])
def test_modes_pick_the_kernel_element_type(mode, tag):
    fa.set_float32_precision(mode)
    assert fa.get_float32_precision() == mode
    assert cc.kernel_dtype_tag(np.float32) == tag
    assert cc.kernel_dtype_tag(np.float64) == "f64"  # float64 is always float64


def test_mode_is_part_of_every_cached_call_key():
    # A plan holds the kernel it chose: the same arrays under another mode must miss the cache.
    fa.set_float32_precision("high")
    assert _signature.PLAN_VARIANT[1] == "high"
    fa.set_float32_precision("highest")
    assert _signature.PLAN_VARIANT[1] == "highest"


@pytest.mark.parametrize("bad", ["fp32", "HIGHEST", 3, None])
def test_unknown_mode_is_a_typed_error_with_the_choices(bad):
    with pytest.raises(ArgumentError, match="'highest', 'high', 'medium'") as e:
        fa.set_float32_precision(bad)
    assert isinstance(e.value, ValueError) and repr(bad) in str(e.value)
    assert fa.get_float32_precision() == "highest"


def test_precise_keys_are_sm80_except_hopper_float32_and_float64_stops_at_128():
    """float32 also has the sm90 planes kernel (dense / varlen, D <= 128); TF32, float64 and a
    paged float32 key are sm80 only."""
    assert cc.KernelKey("f32", 128, arch="sm90").name == "fa_fwd_sm90_f32_d128"
    for bad in (dict(dtype="tf32", head_dim=128), dict(dtype="f64", head_dim=64),
                dict(dtype="f32", head_dim=128, paged=True)):
        with pytest.raises(ValueError, match="sm80"):
            cc.KernelKey(**bad, arch="sm90")
    with pytest.raises(ValueError, match="head_dim"):
        cc.KernelKey("f32", 256, arch="sm90")
    with pytest.raises(ValueError, match="head_dim"):
        cc.KernelKey("f64", 256)
    assert cc.KernelKey("f64", 128).name == "fa_fwd_f64_d128"
    assert {k.dtype for k in cc.shipped_precise_keys()} == {"f32", "tf32", "f64"}
    with pytest.raises(ValueError, match="one module per kernel source"):
        cc.kernel_source([cc.KernelKey("f32", 64), cc.KernelKey("bf16", 64)])


def test_float64_head_dim_limit_on_the_gpu_only():
    from cupy_flashattn import validate
    from cupy_flashattn.errors import UnsupportedError

    validate.gpu_head_dim(200, False, "q", np.float64)  # the CPU backend takes it
    validate.gpu_head_dim(200, True, "q", np.float32)
    with pytest.raises(UnsupportedError, match="float64 head dims above 128") as e:
        validate.gpu_head_dim(160, True, "q", np.float64)
    assert "use float32 on the GPU" in str(e.value)


def test_precise_tile_tables_fit_an_a100():
    # The family runs on any GPU >= 8.0: every entry within an A100's 163 KB per CTA.
    for tag in ("f32", "tf32", "f64"):
        for d in cc.PRECISE_HEAD_DIM_BUCKETS[tag]:
            tr = cc.traits(d, "sm80", tag)
            assert tr.smem_bytes <= 166912 and tr.block_m == 16 * tr.num_warps, (tag, d, tr)
