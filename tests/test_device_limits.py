"""Kernels that need more shared memory per block than a GPU allows are refused with a typed
error from host data, before anything runs (``_cuda/device_limits.py``); no GPU needed.

The tiles were measured on the H200 (227 KB per block).  An A100 allows 163 KB, an sm_86 / sm_89
GPU 99 KB: there the sm80 D=256 prefill (194 KB) and the D=128 decode (106 KB) cannot launch.
The GPU side (the cache is unchanged when with_kvcache is refused) is in
tests/gpu/test_gpu_device_limits.py."""

import numpy as np
import pytest

from helpers import require_nvrtc

require_nvrtc()  # traits and shared memory come from the compiler (device_facts.py)

from cupy_flashattn import UnsupportedError  # noqa: E402
from cupy_flashattn._cuda import compile as cc  # noqa: E402
from cupy_flashattn._cuda import decode as dc  # noqa: E402
from cupy_flashattn._cuda.device_limits import check_fits  # noqa: E402
from test_plan import H100_SMS, _problem  # noqa: E402

A100 = 166912  # cudaDevAttrMaxSharedMemoryPerBlockOptin of an A100 (163 KB)
SM89 = 101376  # of an sm_86 / sm_89 GPU (99 KB)
H200 = 232448  # of an H100 / H200 (227 KB)


def test_every_shipped_kernel_fits_a_hopper_block():
    for d in (64, 128, 256, 512):
        check_fits(_problem(D=d, max_q=1), limit=H200, sm_count=H100_SMS, device_cc=90)  # decode
        check_fits(_problem(D=d, max_q=512), limit=H200, sm_count=H100_SMS, device_cc=90)


def test_a100_refuses_the_d256_prefill_naming_both_sizes_and_the_largest_head_dim_that_fits():
    need = cc.traits(256, "sm80").smem_bytes
    assert need > A100
    fits = max(d for d in cc.HEAD_DIM_BUCKETS if cc.traits(d, "sm80").smem_bytes <= A100)
    with pytest.raises(UnsupportedError) as e:
        check_fits(_problem(D=256, max_q=512), limit=A100, sm_count=108, device_cc=80)
    text = str(e.value)
    assert text.startswith("head_dim:") and "prefill" in text
    assert f"at most {A100} bytes" in text and f"got {need} bytes" in text
    assert f"head_dim <= {fits}" in text
    check_fits(_problem(D=128, max_q=512), limit=A100, sm_count=108, device_cc=80)  # 82 KB fits


def test_a_99_kb_gpu_refuses_the_d128_decode_and_names_d64():
    assert dc.smem_bytes(128) > SM89 >= dc.smem_bytes(64)
    with pytest.raises(UnsupportedError, match=r"decode kernel for head_dim 128 .*head_dim <= 64"):
        check_fits(_problem(D=128, max_q=1), limit=SM89, sm_count=84, device_cc=89)
    check_fits(_problem(D=64, max_q=1), limit=SM89, sm_count=84, device_cc=89)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_precise_kernels_are_checked_against_their_own_table(dtype):
    tag = cc.kernel_dtype_tag(dtype)
    sizes = {d: cc.traits(d, "sm80", tag).smem_bytes for d in cc.head_dim_buckets("sm80", tag)}
    d, need = max(sizes.items(), key=lambda kv: kv[1])
    limit = need - 1
    with pytest.raises(UnsupportedError, match=f"got {need} bytes"):
        check_fits(_problem(D=d, max_q=512, dtype=dtype), limit=limit, sm_count=108, device_cc=80)
