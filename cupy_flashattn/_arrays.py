"""Which array library an argument belongs to, NumPy-style dispatch, and DLPack intake.

CuPy is optional: nothing here imports it unless an argument is not a NumPy array.
"""

from __future__ import annotations

import numpy as np

try:  # bfloat16 for NumPy comes from ml_dtypes (a hard dependency)
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is in install_requires
    BFLOAT16 = None

_KDL_CUDA = 2  # DLDeviceType kDLCUDA
_KDL_CUDA_MANAGED = 13


def cupy_or_none():
    """The cupy module if it can be imported, else None."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install
        return None
    return cupy


def is_cupy_array(a) -> bool:
    if isinstance(a, np.ndarray) or a is None:
        return False
    cp = cupy_or_none()
    return cp is not None and isinstance(a, cp.ndarray)


def is_gpu_dlpack(a) -> bool:
    """A foreign GPU array (a torch tensor, a JAX array...) that CuPy can adopt without a copy."""
    if isinstance(a, np.ndarray) or is_cupy_array(a) or not hasattr(a, "__dlpack_device__"):
        return False
    try:
        device_type = int(a.__dlpack_device__()[0])
    except Exception:
        return False
    return device_type in (_KDL_CUDA, _KDL_CUDA_MANAGED)


def adopt(a):
    """Return ``a`` as a NumPy or CuPy array: NumPy/CuPy arrays pass through, foreign GPU arrays
    are wrapped zero-copy with ``cupy.from_dlpack``; anything else is returned unchanged (and
    rejected by validation with a message saying what is accepted)."""
    if is_gpu_dlpack(a):
        return cupy_or_none().from_dlpack(a)
    return a


def array_module(a):
    """numpy for NumPy arrays, cupy for CuPy arrays, None otherwise."""
    if isinstance(a, np.ndarray):
        return np
    if is_cupy_array(a):
        return cupy_or_none()
    return None


def dtype_name(dtype) -> str:
    dtype = np.dtype(dtype)
    return "bfloat16" if dtype == BFLOAT16 else dtype.name


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    cp = cupy_or_none()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
