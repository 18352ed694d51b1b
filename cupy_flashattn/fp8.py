"""FP8 K/V caches: the two float8 formats, their scales, quantization and dequantization.

vLLM's ``kv_cache_dtype="fp8"`` convention: a cache element is ``x8 = fp8(x / scale)`` with a
float32 scale per tensor or per kv head (``k_scale``, ``v_scale``), and attention reads
``x = float(x8) * scale``.  Quantization saturates: values beyond the format's largest finite
number (448 for e4m3fn, 57344 for e5m2; +-inf too) become that number, so a large activation
clips instead of turning into NaN (e4m3fn has no infinity) or inf; NaN stays NaN.

Formats (ml_dtypes): ``float8_e4m3fn`` (4 exponent bits, 3 mantissa bits: the usual K/V
format, ~2 significant digits) and ``float8_e5m2`` (more range, 2 mantissa bits).  Strings
accepted where a dtype is: "fp8" and "fp8_e4m3" (e4m3fn), "fp8_e5m2".

The CPU backend dequantizes the pages a call reads; the CUDA kernels do not read FP8 yet
(issue 16): a CuPy call with FP8 K/V is refused with an UnsupportedError.
"""

from __future__ import annotations

import numbers

import numpy as np

from .errors import ArgumentError, DTypeError, ShapeError, UnsupportedError, explain

try:
    import ml_dtypes

    FLOAT8_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
    FLOAT8_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
    FP8_DTYPES = (FLOAT8_E4M3FN, FLOAT8_E5M2)
    _MAX = {FLOAT8_E4M3FN: float(ml_dtypes.finfo(FLOAT8_E4M3FN).max),
            FLOAT8_E5M2: float(ml_dtypes.finfo(FLOAT8_E5M2).max)}
except ImportError:  # pragma: no cover - ml_dtypes is in install_requires
    FLOAT8_E4M3FN = FLOAT8_E5M2 = None
    FP8_DTYPES = ()
    _MAX = {}

#: vLLM's kv_cache_dtype names.
FP8_NAMES = {"fp8": FLOAT8_E4M3FN, "fp8_e4m3": FLOAT8_E4M3FN, "fp8_e5m2": FLOAT8_E5M2}

__all__ = ["FP8_DTYPES", "FLOAT8_E4M3FN", "FLOAT8_E5M2", "FP8_NAMES", "is_fp8", "fp8_max",
           "scale_array", "refuse_scales", "refuse_on_gpu", "quantize", "dequantize"]


def is_fp8(dtype) -> bool:
    """Whether ``dtype`` is one of the two float8 formats."""
    try:
        return np.dtype(dtype) in FP8_DTYPES
    except TypeError:
        return False


def fp8_max(dtype) -> float:
    """The largest finite value of a float8 format (448 or 57344)."""
    return _MAX[np.dtype(dtype)]


def refuse_on_gpu(name: str, dtype, how: str) -> None:
    """The one rule while the CUDA kernels do not read FP8: an UnsupportedError naming
    ``name`` (a float8 array or cache ``how`` it was given, e.g. "with xp=cupy")."""
    raise explain(
        UnsupportedError, name, "float8 K/V caches run on the CPU backend only so far (the CUDA "
        "kernels do not read FP8 yet)", "float16 / bfloat16 K/V on the GPU, or float8 with NumPy",
        f"{np.dtype(dtype).name} {how}", "keep the cache in bfloat16 on the GPU, or use a NumPy "
        "FP8 cache (xp=numpy) on the CPU backend",
    )


def refuse_scales(k_scale, v_scale, problem: str, expected: str, fix: str) -> None:
    """Scales given where the K/V are not float8: an ArgumentError naming the first one given
    (``fix`` may mention ``{name}``)."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None:
            raise explain(ArgumentError, name, problem, expected, repr(scale), fix.format(name=name))


def scale_array(name: str, scale, num_heads_k: int) -> np.ndarray:
    """``scale`` (None = 1; a positive finite float; or a float32 array of shape (), (1,) or
    (Hk,) on the host) as a float32 ``(Hk,)`` NumPy array -- the per-head form the backends
    read.  Raises a typed error naming ``name`` otherwise."""
    if scale is None:
        return np.ones(num_heads_k, dtype=np.float32)
    if isinstance(scale, numbers.Real) and not isinstance(scale, bool):
        values = np.full(num_heads_k, float(scale), dtype=np.float32)
    elif isinstance(scale, np.ndarray):
        if scale.dtype != np.float32:
            raise explain(DTypeError, name, "a scale array must have dtype float32", "float32",
                          str(scale.dtype), f"pass {name}.astype(numpy.float32)")
        if scale.shape not in ((), (1,), (num_heads_k,)):
            raise explain(ShapeError, name, "one scale per tensor or per kv head",
                          f"shape (), (1,) or ({num_heads_k},)", scale.shape,
                          "pass a float, or one float32 scale per kv head")
        values = np.broadcast_to(scale.reshape(-1), (num_heads_k,)).astype(np.float32)
    else:
        raise explain(
            DTypeError, name, "must be a float or a float32 NumPy array", "a float or numpy.ndarray",
            type(scale).__name__, f"pass {name}=1.0, or one float32 scale per kv head",
        )
    if not (np.all(np.isfinite(values)) and np.all(values > 0)):
        raise explain(ArgumentError, name, "scales must be positive and finite", "> 0",
                      values.tolist(), "pass the scale the cache was quantized with (x8 = x / scale)")
    return values


def quantize(x, scale: np.ndarray, dtype, xp=np):
    """``fp8(clip(x / scale, -max, max))`` for ``x`` of shape ``(..., Hk, D)`` and per-head
    ``scale`` ``(Hk,)``: the cache's elements for new keys or values (saturating, NaN kept)."""
    limit = fp8_max(dtype)
    s = xp.asarray(scale, dtype=np.float32)[:, None]
    scaled = x.astype(np.float32) / s
    return xp.clip(scaled, -limit, limit).astype(dtype)


def dequantize(x8, scale: np.ndarray, dtype, head_axis: int = -2):
    """``float(x8) * scale`` in ``dtype`` (float32 or float64), the scale per kv head along
    ``head_axis`` of ``x8`` (``(..., Hk, D)``)."""
    shape = [1] * x8.ndim
    shape[head_axis] = -1
    return x8.astype(dtype) * np.asarray(scale, dtype=dtype).reshape(shape)
