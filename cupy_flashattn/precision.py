"""How float32 inputs are computed on the GPU: the one setting, named as torch names its own.

``set_float32_precision(mode)`` mirrors ``torch.set_float32_matmul_precision``:

* ``"highest"`` (default): float32 accuracy.  Both products (S = Q K^T and O += P V) run on
  tensor cores as 3xTF32 -- each operand split into a TF32 high part and a TF32 residual, three
  products accumulated in float32 -- so the error against the float64 reference is that of a
  float32 computation (measured: ``benchmarks/NOTES.md``, precise v1).
* ``"high"``: one TF32 product each (10-bit mantissa operands, float32 accumulation and softmax,
  ~1e-3 relative), torch's ``allow_tf32``; about 2x the speed of "highest".
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
