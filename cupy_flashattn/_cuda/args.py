"""How host-side CuPy arrays become kernel arguments, shared by every launcher (prefill,
decode): 16-byte alignment checks, head-dim padding, element strides, null pointers, window
clamping.  No function here synchronises with the device."""

from __future__ import annotations

import numpy as np

#: Windows wider than any sequence are clamped so `i + shift +- window` cannot overflow int32.
WINDOW_CAP = 1 << 30


def bf16_dtype() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def aligned(a) -> bool:
    """Last dim contiguous, other strides multiples of 16 bytes, base 16-byte aligned (what
    cp.async and the 16-byte vector stores need)."""
    if a.strides[-1] != a.itemsize:
        return False
    ptr = a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data  # CuPy, or NumPy in tests
    if ptr % 16:
        return False
    return all(s % 16 == 0 for s, n in zip(a.strides[:-1], a.shape[:-1]) if n > 1)


def pad_last(a, d_to, dtype):
    """``a`` cast to ``dtype`` with its last dim zero-padded to ``d_to`` (``a`` itself if it
    already is): zero columns change neither Q K^T nor the kept part of P V."""
    import cupy

    if a.shape[-1] == d_to and a.dtype == dtype:
        return a
    out = cupy.zeros(a.shape[:-1] + (d_to,), dtype=dtype)
    out[..., : a.shape[-1]] = a.astype(dtype, copy=False)
    return out


def elem_stride(a, i) -> np.int64:
    """Stride of dim ``i`` in elements."""
    return np.int64(a.strides[i] // a.itemsize)


def ptr(a):
    """An array argument, or a null pointer for None."""
    return np.uint64(0) if a is None else a


def window(w: int) -> int:
    return -1 if w < 0 else min(int(w), WINDOW_CAP)
