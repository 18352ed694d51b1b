"""flash-attn's accuracy criterion, in one place for the tests and ``python -m cupy_flashattn check``.

An output is right when its error against the float64 reference is at most twice the error of a
plain implementation in the same precision (the same math with the inputs' dtype, no fusion),
plus a small per-dtype epsilon for rows where that plain error happens to be ~0::

    max|out - ref| <= 2 * max|naive_same_precision - ref| + EPS[dtype]

The epsilons are a few units in the last place of the dtype at the magnitudes attention outputs
have (|out| <= max|v|, O(1) for normal inputs): float16 2e-3 (ulp 1e-3 at 1), bfloat16 1.6e-2
(ulp 7.8e-3), float32 2e-5, float64 1e-10.
"""

from __future__ import annotations

import numpy as np

from ._arrays import BFLOAT16

__all__ = ["EPS", "eps_for", "error_bound"]

#: dtype -> epsilon of the bound (see the module docstring)
EPS = {
    np.dtype(np.float16): 2e-3,
    BFLOAT16: 1.6e-2,
    np.dtype(np.float32): 2e-5,
    np.dtype(np.float64): 1e-10,
}


def eps_for(dtype) -> float:
    """The epsilon for a dtype (a NumPy dtype, a type, or a name such as "bfloat16")."""
    return EPS[BFLOAT16 if str(dtype) == "bfloat16" else np.dtype(dtype)]


def error_bound(naive_error: float, dtype) -> float:
    """``2 * naive_error + eps`` for outputs of ``dtype``."""
    return 2.0 * float(naive_error) + eps_for(dtype)
