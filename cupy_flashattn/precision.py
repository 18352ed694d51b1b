"""How float32 inputs are computed on the GPU: the one setting, named as torch names its own.

``set_float32_precision(mode)`` mirrors ``torch.set_float32_matmul_precision``:

* ``"highest"`` (default): float32 accuracy.  Both products (S = Q K^T and O += P V) run on
  tensor cores with each operand split into a high part and a residual, three products
  accumulated in float32, so the error against the float64 reference is that of a float32
  computation.  On a compute capability 9.0 GPU (dense / varlen, D <= 128) the parts are
  float16 planes of power-of-two-scaled operands on wgmma (~4x torch's memory-efficient SDPA
  at D = 128, S = 4k on an H100); elsewhere TF32 parts on mma.sync (3xTF32).  Measured:
  ``benchmarks/NOTES.md``, precise v1 and "float32 on Hopper".
* ``"high"``: one TF32 product each (10-bit mantissa operands, float32 accumulation and softmax,
  ~1e-3 relative), torch's ``allow_tf32``; about 2x the speed of "highest" on the sm80 kernel.
  Where the float16-plane kernel serves (above) "high" runs it too: it is faster there than
  TF32 on mma.sync, and float32-accurate.
* ``"medium"``: q/k/v are cast to bfloat16 and run on the 16-bit kernels (~3 significant
  digits; what float32 calls did before this setting existed), the fastest.

float64 is always computed in float64 (DMMA tensor cores); float16 / bfloat16 are unaffected.
The CPU backend computes float32 in float32 whatever the setting (it is for correctness, not
speed).  The setting is process-wide, like torch's, and part of every cached call's key.
"""

from __future__ import annotations

from .errors import ArgumentError

__all__ = ["set_float32_precision", "get_float32_precision", "FLOAT32_PRECISIONS"]

#: mode -> the kernel element type serving float32 inputs (``_cuda.compile``).
FLOAT32_PRECISIONS = {"highest": "f32", "high": "tf32", "medium": "bf16"}
_MODE = ["highest"]


def set_float32_precision(mode: str) -> None:
    """Choose how float32 inputs are computed on the GPU: "highest" (float32 accuracy, the
    default), "high" (TF32) or "medium" (bfloat16 operands); see the module docstring."""
    from ._signature import PLAN_VARIANT

    if not isinstance(mode, str) or mode not in FLOAT32_PRECISIONS:
        raise ArgumentError(
            f"set_float32_precision: mode must be one of 'highest', 'high', 'medium' (as "
            f"torch.set_float32_matmul_precision), got {mode!r}. Fix: pass 'highest' for "
            "float32 accuracy, 'high' for TF32, 'medium' for bfloat16 operands.")
    _MODE[0] = PLAN_VARIANT[1] = mode


def get_float32_precision() -> str:
    """The current float32 mode ("highest", "high" or "medium")."""
    return _MODE[0]


def float32_kernel_dtype() -> str:
    """The kernel element type float32 inputs run on now ("f32", "tf32" or "bf16")."""
    return FLOAT32_PRECISIONS[_MODE[0]]
