"""Device A/B of compile-time switches of the float32 / float64 kernel (flash_fwd_precise.cu):
for each variant (a list of -D defines), the relative error against the float64 reference on
tests/gpu/test_gpu_precise.py's accuracy case (B = 1, H = 2, S = 4096, D = 128, all rows) and
the kernel-only TFLOP/s at B = 4, H = 16, S = 4096, D = 128; torch SDPA efficient beside.

    PYTHONPATH=. python3 tools/precise_variants.py "FA_PRECISE_S_PART=0,FA_PRECISE_PV_PART=1" ...
"""

from __future__ import annotations

import sys

import numpy as np

import cupy
import cupy_flashattn as fa
from cupy_flashattn._cuda import compile as cc
from cupy_flashattn.reference import attention_ref

BASE_OPTIONS = cc.NVRTC_OPTIONS


def use(defines: str) -> None:
    cc.NVRTC_OPTIONS = BASE_OPTIONS + tuple(f"-D{d}" for d in defines.split(",") if d)
    cc._FUNCTIONS.clear()
    cc._MODULES.clear()
    from cupy_flashattn import _signature

    _signature.CALLS._items.clear()


def main():
    rng = np.random.default_rng(4096)
    q, k, v = (rng.standard_normal((1, 4096, 2, 128)).astype(np.float32) for _ in range(3))
    ref = attention_ref(q, k, v)
    qd, kd, vd = (cupy.asarray(a) for a in (q, k, v))
    big = [cupy.random.standard_normal((4, 4096, 16, 128), np.float32) for _ in range(3)]
    flops = 4.0 * 4 * 16 * 4096 * 4096 * 128
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            t = torch.nn.functional.scaled_dot_product_attention(
                *(torch.from_dlpack(a).transpose(1, 2) for a in (qd, kd, vd)))
        o = cupy.from_dlpack(t.transpose(1, 2).contiguous()).get()
        print(f"torch efficient rel err {np.abs(o - ref).max() / np.abs(ref).max():.2e}", flush=True)
    except Exception as e:
        print("torch failed", e)
    for defines in sys.argv[1:] or [""]:
        use(defines)
        for mode in ("highest", "high"):
            fa.set_float32_precision(mode)
            o = fa.flash_attn_func(qd, kd, vd).get()
            err = np.abs(o - ref).max() / np.abs(ref).max()
            fn = lambda: fa.flash_attn_func(*big)  # noqa: E731
            fn()
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            ts = []
            for _ in range(5):
                a.record()
                fn()
                fn()
                b.record()
                b.synchronize()
                ts.append(cupy.cuda.get_elapsed_time(a, b) * 1e-3 / 2)
            print(f"[{defines}] {mode:8s} rel err {err:.2e}  {flops / np.median(ts) / 1e12:6.1f} TFLOP/s", flush=True)
        fa.set_float32_precision("highest")


if __name__ == "__main__":
    main()
