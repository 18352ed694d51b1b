"""FP8 K/V caches: the two float8 formats, their scales, quantization and dequantization.

vLLM's ``kv_cache_dtype="fp8"`` convention: a cache element is ``x8 = fp8(x / scale)`` with a
float32 scale per tensor or per kv head (``k_scale``, ``v_scale``), and attention reads
``x = float(x8) * scale``.  Quantization saturates: values beyond the format's largest finite
number (448 for e4m3fn, 57344 for e5m2; +-inf too) become that number, so a large activation
clips instead of turning into NaN (e4m3fn has no infinity) or inf; NaN stays NaN.

Formats (ml_dtypes): ``float8_e4m3fn`` (4 exponent bits, 3 mantissa bits: the usual K/V
format, ~2 significant digits) and ``float8_e5m2`` (more range, 2 mantissa bits).  Strings
accepted where a dtype is: "fp8" and "fp8_e4m3" (e4m3fn), "fp8_e5m2".

The CPU backend dequantizes the pages a call reads; on the GPU the split-KV decode kernel reads
float8 pages as stored and dequantizes in registers (every query length of a float8 call goes to
it; ``_cuda.route``), with 16-bit queries and head dims that are multiples of 16 up to 256
(:func:`gpu_rules`); appends quantize inside the append kernel (``cuda_src/kv_cache.cu``),
bit for bit the same as :func:`quantize`.

Scales on the GPU (:class:`ScaleBinding`): a float (or None = 1, or a NumPy array) becomes a
float32 ``(Hk,)`` device array once per validated call; a CuPy float32 array of shape (Hk,) is
read where it lies on every call (vLLM passes its scales as device tensors; a cached call, a
CUDA graph, sees new values without a host sync), and one of shape () or (1,) is expanded to
(Hk,) per call (one small copy).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._arrays import adopt
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
           "kv_cache_format", "storage_format",
           "scale_array", "device_scale", "ScaleBinding", "refuse_scales", "gpu_rules",
           "quantize", "dequantize"]

#: Head dims the GPU's float8 decode kernel reads: whole 16-element (16-byte) float8 chunks, up
#: to its largest float8 bucket (``_cuda.decode.FP8_KV_BUCKETS``).
GPU_HEAD_DIM_MULTIPLE = 16
GPU_MAX_HEAD_DIM = 256


def kv_cache_format(kv_cache_dtype):
    """vLLM's ``kv_cache_dtype`` argument as a float8 dtype, or None for "auto" / None (K/V
    carry their own dtype).  Accepts "fp8" / "fp8_e4m3" (e4m3fn), "fp8_e5m2", and the
    ml_dtypes float8 dtypes; an ArgumentError names anything else."""
    if kv_cache_dtype is None or (isinstance(kv_cache_dtype, str) and kv_cache_dtype == "auto"):
        return None
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype in FP8_NAMES:
        return FP8_NAMES[kv_cache_dtype]
    if not isinstance(kv_cache_dtype, str) and is_fp8(kv_cache_dtype):
        return np.dtype(kv_cache_dtype)
    raise explain(
        ArgumentError, "kv_cache_dtype", "names the float8 format uint8 K/V bytes hold",
        '"auto" (or None), "fp8", "fp8_e4m3", "fp8_e5m2" or an ml_dtypes float8 dtype',
        repr(kv_cache_dtype), 'pass kv_cache_dtype="fp8" for e4m3fn bytes (vLLM\'s default)',
    )


def is_fp8(dtype) -> bool:
    """Whether ``dtype`` is one of the two float8 formats."""
    try:
        return np.dtype(dtype) in FP8_DTYPES
    except TypeError:
        return False


def fp8_max(dtype) -> float:
    """The largest finite value of a float8 format (448 or 57344)."""
    return _MAX[np.dtype(dtype)]


def gpu_rules(kv_name: str, head_dim: int, q_dtype=None, q_name: str = "q") -> None:
    """What the GPU's float8 kernels need, as typed errors before anything is allocated or
    launched: a head dim that is a multiple of 16 up to 256 (named ``kv_name``), and queries
    in float16 or bfloat16 (``q_dtype``; None: not known yet, e.g. a cache being made)."""
    if head_dim % GPU_HEAD_DIM_MULTIPLE or head_dim > GPU_MAX_HEAD_DIM:
        raise explain(
            UnsupportedError, kv_name, "the GPU reads float8 K/V in whole 16-byte chunks per row "
            "(the float8 decode kernel)",
            f"head_dim a multiple of {GPU_HEAD_DIM_MULTIPLE} up to {GPU_MAX_HEAD_DIM}",
            f"head_dim {head_dim}", "pad the head dim to a multiple of 16, or keep a bfloat16 "
            "cache for this head dim, or run a NumPy float8 cache on the CPU backend",
        )
    if q_dtype is not None and np.dtype(q_dtype).itemsize != 2:
        raise explain(
            UnsupportedError, q_name, "float8 K/V on the GPU are read by the 16-bit decode kernel",
            "float16 or bfloat16 queries", f"{np.dtype(q_dtype).name} queries",
            f"cast with {q_name}.astype(ml_dtypes.bfloat16) (the output then is bfloat16)",
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


def storage_format(dtype, kv_dtype=None):
    """The float8 format of K/V stored as ``dtype``: ``kv_dtype`` (the format uint8 bytes hold,
    given with kv_cache_dtype), else ``dtype`` itself when it is a float8 dtype, else None."""
    if kv_dtype is not None:
        return np.dtype(kv_dtype)
    return np.dtype(dtype) if is_fp8(dtype) else None


def device_scale(name: str, scale, num_heads_k: int, xp):
    """``scale`` as a float32 ``(Hk,)`` array of ``xp``: floats / None / NumPy arrays through
    :func:`scale_array` (values checked), copied to the device for CuPy; a CuPy float32 array
    of shape (), (1,) or (Hk,) as given or expanded (its values stay on the device unread)."""
    if xp is np or not _is_device_array(scale):
        values = scale_array(name, scale, num_heads_k)
        return values if xp is np else xp.asarray(values)
    check_device_scale(name, scale, num_heads_k)
    return _per_head(scale, num_heads_k)


def _is_device_array(a) -> bool:
    return hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray)


def _per_head(scale, num_heads_k: int):
    """A checked device scale as (Hk,): itself, or a per-tensor one expanded on the device (one
    small copy, no host sync)."""
    return scale if scale.shape == (num_heads_k,) else scale.reshape(1).repeat(num_heads_k)


def check_device_scale(name: str, scale, num_heads_k: int) -> None:
    """A CuPy scale: float32, shape (), (1,) or (Hk,), a contiguous vector."""
    if np.dtype(scale.dtype) != np.float32:
        raise explain(DTypeError, name, "a scale array must have dtype float32", "float32",
                      str(scale.dtype), f"pass {name}.astype(cupy.float32)")
    if tuple(scale.shape) not in ((), (1,), (num_heads_k,)):
        raise explain(ShapeError, name, "one scale per tensor or per kv head",
                      f"shape (), (1,) or ({num_heads_k},)", tuple(scale.shape),
                      "pass a float, or one float32 scale per kv head")
    if scale.ndim == 1 and scale.strides[0] != 4 and num_heads_k > 1:
        raise explain(ShapeError, name, "the kernels read the scales as a contiguous vector",
                      "stride 4 bytes", f"stride {scale.strides[0]} bytes",
                      f"pass cupy.ascontiguousarray({name})")


class ScaleBinding:
    """Where a validated float8 call finds its (k_scale, v_scale) on every execution.

    Each is either fixed -- a float32 ``(Hk,)`` array of the call's library made at validation
    from a float, None (= 1) or a NumPy array, kept by the cached call (the value is part of
    the call's signature) -- or the caller's CuPy array, read per call (its shape and dtype are
    part of the signature, its values are not: they stay on the device)."""

    def __init__(self, k_scale, v_scale, num_heads_k: int, xp):
        self.num_heads_k = num_heads_k
        self.fixed = (self._bind("k_scale", k_scale, xp), self._bind("v_scale", v_scale, xp))

    def _bind(self, name: str, scale, xp):
        """The fixed (Hk,) array of ``scale``, or None when it is read per call (checked)."""
        scale = adopt(scale)  # a torch tensor: a CuPy view
        if xp is not np and _is_device_array(scale):
            check_device_scale(name, scale, self.num_heads_k)
            return None
        return device_scale(name, scale, self.num_heads_k, xp)

    def arrays(self, k_scale, v_scale) -> dict:
        """The AttentionProblem's ``k_scale`` / ``v_scale`` for one execution."""
        k, v = self.fixed
        return {"k_scale": _per_head(adopt(k_scale), self.num_heads_k) if k is None else k,
                "v_scale": _per_head(adopt(v_scale), self.num_heads_k) if v is None else v}


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
