"""Every check the public API makes before anything is launched.

Each function checks one thing and raises one typed error (``errors.py``) whose message keeps
the wording users search for (flash-attn's and candle's), names the argument, shows the expected
and the given values, and says how to fix it.

Value checks that would need the contents of an index array (cu_seqlens monotonic, block ids in
range, lengths within the block table) run always on NumPy inputs and, on CuPy inputs, only with
``check=True``, because reading a device array forces a host synchronisation.  Without them the
kernels still never read out of bounds: they clamp every range (see ``problem.py``).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._arrays import BFLOAT16, array_module, dtype_name
from .fp8 import gpu_rules, is_fp8, kv_cache_format, refuse_scales
from .errors import (
    ArgumentError,
    BlockTableError,
    DeviceError,
    DTypeError,
    LayoutError,
    PageSizeMismatchError,
    ReadOnlyError,
    SeqlenError,
    ShapeError,
    UnsupportedError,
    explain,
)

#: Head dims every entry point accepts (candle's paged limit), on both backends: the CUDA
#: kernels go to 512 with V-split tiles above 256 (sm80/kernel_traits.cuh); float64 and
#: float32 at float32 accuracy stop earlier (below).
MAX_HEAD_DIM = 512
MAX_GPU_HEAD_DIM = 512
#: The float32 kernels at float32 / TF32 accuracy (precision "highest" / "high") stop here.
MAX_GPU_HEAD_DIM_F32 = 256  # compile.PRECISE_HEAD_DIM_BUCKETS["f32"][-1]
MAX_GPU_HEAD_DIM_F64 = 128  # compile.PRECISE_HEAD_DIM_BUCKETS["f64"][-1]

#: Largest window side: the kernels take it as a 32-bit int (as flash-attn's C++ does); any side
#: longer than the longest sequence already means "unlimited", so nothing is lost.
MAX_WINDOW = 2**31 - 1

GPU_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))
CPU_DTYPES = GPU_DTYPES

_ACCEPTED = "a NumPy array (CPU backend) or a CuPy array (CUDA backend; torch/JAX GPU arrays are adopted zero-copy via DLPack)"


def _shape(a) -> str:
    return str(tuple(int(s) for s in a.shape))


def _describe(value) -> str:
    """``value`` with its type, for messages where the repr alone misleads ("got 0.5" for the
    string '0.5', or for a 0-d array)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        kind = f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"
        return f"a {len(value.shape)}-d {kind} of dtype {dtype_name(value.dtype)} ({value!r})"
    return f"{type(value).__name__} {value!r}"


# -- arrays, devices, dtypes ----------------------------------------------------------------


def array(name: str, a):
    """``a`` must be a NumPy or CuPy array; returns its array module."""
    xp = array_module(a)
    if xp is None:
        raise explain(
            DTypeError, name, "unsupported array type", _ACCEPTED, type(a).__name__,
            f"convert {name} with numpy.asarray(...) or cupy.asarray(...)",
        )
    return xp


def same_library(**arrays):
    """The given arrays (None skipped) are all NumPy, or all CuPy on one GPU; returns their array
    module.  Messages name the first array as the reference, so pass the one the user thinks of
    as the anchor (q, out_a, x, the cache) first."""
    ref_name, ref_xp, device = None, None, None
    for name, a in arrays.items():
        if a is None:
            continue
        xp = array(name, a)
        if ref_xp is None:
            ref_name, ref_xp = name, xp
        elif xp is not ref_xp:
            raise explain(
                DeviceError, name, f"mixes array libraries with {ref_name}",
                f"a {ref_xp.__name__} array like {ref_name}", f"a {xp.__name__} array",
                f"move {name} with {ref_xp.__name__}.asarray(...) so every array lives where "
                f"{ref_name} does",
            )
        if xp is not np:
            if device is None:
                device = a.device.id
            elif a.device.id != device:
                raise explain(
                    DeviceError, name, f"is on another GPU than {ref_name}", f"device {device}",
                    f"device {a.device.id}", f"copy it under `with cupy.cuda.Device({device}):`",
                )
    return ref_xp


def same_backend(xp, **arrays):
    """The given arrays (None skipped) live in ``xp``, q's library, and on one GPU."""
    for name, a in arrays.items():
        if a is not None and array(name, a) is not xp:
            raise explain(
                DeviceError, name, "mixes array libraries with q",
                f"a {xp.__name__} array like q", f"a {array(name, a).__name__} array",
                f"move {name} with {xp.__name__}.asarray(...) so every array lives where q does",
            )
    same_library(**arrays)


def dtype_supported(name: str, a, xp):
    allowed = CPU_DTYPES if xp is np else GPU_DTYPES
    if np.dtype(a.dtype) not in allowed:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise explain(
            DTypeError, name, "unsupported dtype", f"one of {names}", dtype_name(a.dtype),
            f"cast it, e.g. {name}.astype(numpy.float16)",
        )


def out_dtype(out, q):
    """A preallocated ``out`` has q's dtype (the output is written in the inputs' dtype).

    Call it before :func:`same_dtype`-style q/k/v checks see ``out``, so the message talks about
    the output buffer and not about "query and key/value"."""
    if out is not None and np.dtype(out.dtype) != np.dtype(q.dtype):
        raise explain(
            DTypeError, "out", "the output buffer must have q's dtype (out is written in q's dtype)",
            dtype_name(q.dtype), dtype_name(out.dtype),
            "allocate it with xp.empty_like(q), or cast the result yourself after the call",
        )


def writable(name: str, a, fix: str):
    """``a`` (None skipped) can be written in place: a NumPy array with ``flags.writeable``
    False (a read-only view, ``np.broadcast_to``, an array over read-only memory) would only
    fail after the computation, or deep inside the cache update.  CuPy arrays are always
    writable."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise explain(
            ReadOnlyError, name, "is read-only but this call writes it in place",
            "a writeable array (flags.writeable is True)", "flags.writeable == False", fix,
        )


def same_dtype(reference_name: str, reference, **arrays):
    for name, a in arrays.items():
        if name == "out":
            out_dtype(a, reference)  # an output buffer, not a "query and key/value" mismatch
            continue
        if a is not None and np.dtype(a.dtype) != np.dtype(reference.dtype):
            raise explain(
                DTypeError, name, f"query and key/value must have the same dtype as {reference_name}",
                dtype_name(reference.dtype), dtype_name(a.dtype),
                f"cast with {name}.astype({reference_name}.dtype)",
            )


def kv_dtypes(q, k, v, xp, k_name: str = "k", v_name: str = "v", k_scale=None, v_scale=None,
              kv_cache_dtype=None):
    """k and v have q's dtype -- or they are a float8 cache (fp8.py): both in one float8
    format, or both uint8 bytes of the format ``kv_cache_dtype`` names (vLLM's argument; the
    GPU's only form, as CuPy has no float8 dtype), on the GPU within the float8 kernels' rules
    (fp8.gpu_rules).  The scales apply to float8 k / v only.  Returns the float8 format, or
    None for 16/32/64-bit K/V."""
    fmt = kv_cache_format(kv_cache_dtype)
    byte_k, byte_v = (np.dtype(a.dtype) == np.uint8 for a in (k, v))
    if fmt is None and (byte_k or byte_v):
        bad = k_name if byte_k else v_name
        raise explain(
            DTypeError, bad, "uint8 K/V are read as float8 bytes only when kv_cache_dtype names "
            "their format", "kv_cache_dtype='fp8' (e4m3fn) or 'fp8_e5m2' with uint8 K/V",
            "uint8 with kv_cache_dtype=None", f"pass kv_cache_dtype='fp8' (or 'fp8_e5m2') with "
            f"{bad}, or cast it to q's dtype",
        )
    fp8_k, fp8_v = is_fp8(k.dtype) or byte_k, is_fp8(v.dtype) or byte_v
    if not (fp8_k or fp8_v):
        same_dtype("q", q, **{k_name: k, v_name: v})
        refuse_scales(k_scale, v_scale, "dequantization scales apply to float8 K/V only",
                      f"None with {k_name}/{v_name} of dtype {dtype_name(k.dtype)}",
                      "drop {name}, or pass float8 (ml_dtypes.float8_e4m3fn / float8_e5m2) K/V")
        if fmt is not None:
            raise explain(
                DTypeError, k_name, f"kv_cache_dtype={kv_cache_dtype!r} names float8 bytes",
                "uint8 K/V (float8 bytes)", dtype_name(k.dtype),
                "drop kv_cache_dtype, or pass the cache's uint8 bytes",
            )
        return None
    if fmt is None:
        fmt = np.dtype(k.dtype if fp8_k else v.dtype)
    for name, a in ((k_name, k), (v_name, v)):
        if np.dtype(a.dtype) not in (np.dtype(np.uint8), fmt):
            raise explain(
                DTypeError, name, "an FP8 cache holds keys and values in the same float8 format",
                f"{dtype_name(fmt)} (or its uint8 bytes)", dtype_name(a.dtype),
                f"quantize {name} to the same format (cupy_flashattn.fp8.quantize)",
            )
    if xp is not np:
        for name, a in ((k_name, k), (v_name, v)):
            gpu_rules(name, int(a.shape[-1]) if a.ndim else 0, q.dtype)
    return fmt


def index_array(name: str, a, xp, ndim: int, length=None):
    """An int32 index array (cu_seqlens, seqused_k, cache_seqlens, block_table...)."""
    same_backend(xp, **{name: a})
    if a.ndim != ndim:
        raise explain(
            ShapeError, name, f"must have rank {ndim}", f"{ndim} dims", f"shape {_shape(a)}",
            f"pass {name} as a {ndim}-d int32 array",
        )
    if np.dtype(a.dtype) != np.int32:
        raise explain(
            DTypeError, name, "must have dtype int32", "int32", dtype_name(a.dtype),
            f"convert with {name}.astype(numpy.int32)",
        )
    if length is not None and a.shape[0] != length:
        raise explain(
            ShapeError, name, "has the wrong length", f"shape[0] == {length}", f"shape {_shape(a)}",
            f"give one entry per sequence ({length})",
        )
    last_dim_contiguous(name, a)


def rank(name: str, a, ndim: int, layout: str):
    if a.ndim != ndim:
        raise explain(
            ShapeError, name, f"has the wrong rank for the {layout} layout", f"rank {ndim} {layout}",
            f"rank {a.ndim} with shape {_shape(a)}",
            f"reshape {name} to {layout}",
        )


def last_dim_contiguous(name: str, a):
    # A zero-size array holds no element to read, and NumPy gives it all-zero strides: its
    # layout cannot be wrong (the shape checks then say what is wrong with it, if anything).
    if a.ndim and a.size and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        raise explain(
            LayoutError, name, "Input tensor must have contiguous last dimension",
            f"stride {a.itemsize} bytes", f"stride {a.strides[-1]} bytes",
            f"pass xp.ascontiguousarray({name})",
        )


# -- heads and head dims --------------------------------------------------------------------


def head_dims(q, k, v):
    D = q.shape[-1]
    for name, a in (("k", k), ("v", v)):
        if a.shape[-1] != D:
            raise explain(
                ShapeError, name, "head dim must match q's", f"last dim {D}",
                f"last dim {a.shape[-1]} (shape {_shape(a)})",
                "use the same head dim for q, k and v",
            )
    if D < 1:
        raise explain(
            ShapeError, "q", "head dimension must be at least 1", f"1 <= head_dim <= {MAX_HEAD_DIM}",
            f"head_dim {D} (shape {_shape(q)})",
            "give q, k and v a last dim (head_dim) >= 1; a zero-size head carries no data",
        )
    if D > MAX_HEAD_DIM:
        raise explain(
            UnsupportedError, "q", f"FlashAttention forward only supports head dimension at most {MAX_HEAD_DIM}",
            f"1 <= head_dim <= {MAX_HEAD_DIM}", D,
            "split the head dim into several heads, or project to a smaller head dim",
        )
    gpu_head_dim(D, not isinstance(q, np.ndarray), "q", q.dtype)


def gpu_head_dim(D: int, on_gpu: bool, name: str, dtype=None):
    """The CUDA kernels' head-dim limits below MAX_HEAD_DIM (which ``head_dims`` enforces for
    both backends, = MAX_GPU_HEAD_DIM): float64 stops at MAX_GPU_HEAD_DIM_F64 (its accumulators
    would spill above), float32 at float32 / TF32 accuracy at MAX_GPU_HEAD_DIM_F32."""
    if on_gpu and dtype is not None and np.dtype(dtype) == np.float64 and D > MAX_GPU_HEAD_DIM_F64:
        raise explain(
            UnsupportedError, name,
            f"float64 head dims above {MAX_GPU_HEAD_DIM_F64} run on the CPU backend only (the "
            f"float64 CUDA kernel holds D doubles of output per thread and stops at {MAX_GPU_HEAD_DIM_F64})",
            f"1 <= head_dim <= {MAX_GPU_HEAD_DIM_F64} for float64 CuPy arrays", D,
            "use float32 on the GPU (float32 accuracy by default), NumPy arrays (the CPU "
            f"backend), or split each head into heads of at most {MAX_GPU_HEAD_DIM_F64} dims",
        )
    if on_gpu and dtype is not None and np.dtype(dtype) == np.float32 and D > MAX_GPU_HEAD_DIM_F32:
        from .precision import get_float32_precision

        mode = get_float32_precision()
        if mode != "medium":
            raise explain(
                UnsupportedError, name,
                f"float32 head dims above {MAX_GPU_HEAD_DIM_F32} run on the GPU only through "
                f"16-bit operands (the float32-accuracy kernels stop at {MAX_GPU_HEAD_DIM_F32})",
                f"1 <= head_dim <= {MAX_GPU_HEAD_DIM_F32} at precision {mode!r}", D,
                'call cupy_flashattn.set_float32_precision("medium") (bf16 operands, up to '
                f"{MAX_GPU_HEAD_DIM}), cast to bfloat16 / float16, or use NumPy arrays (the CPU "
                "backend)",
            )


def heads(num_heads: int, num_heads_k: int):
    if num_heads < 1:
        # A zero-size batch (B, Sq or total 0) is legal; a query without heads is not: there
        # is no head for a kv head to serve, and the output layout (..., H, D) degenerates.
        raise explain(
            ShapeError, "q", "must have at least one query head (nheads = q.shape[-2])",
            "H >= 1", f"H={num_heads}",
            "give q shape (..., nheads, headdim) with nheads >= 1 (an empty batch is a 0 in "
            "batch or seqlen, not in nheads)",
        )
    if num_heads_k < 1:
        raise explain(
            ShapeError, "k", "must have at least one key/value head (nheads_k = k.shape[-2])",
            f"1 <= Hk <= H={num_heads}, a divisor of H", f"Hk={num_heads_k}",
            "give k and v shape (..., nheads_k, headdim) with nheads_k >= 1 (1 = MQA)",
        )
    if num_heads % num_heads_k != 0:
        raise explain(
            ShapeError, "k", "Number of heads in key/value must divide number of heads in query",
            f"a divisor of H={num_heads}", f"Hk={num_heads_k}",
            "repeat kv heads or pick Hk among the divisors of H "
            f"({', '.join(str(d) for d in range(1, num_heads + 1) if num_heads % d == 0)})",
        )


def kv_same_shape(k, v, k_name="k", v_name="v"):
    if tuple(k.shape) != tuple(v.shape):
        raise explain(
            ShapeError, v_name, f"must have the same shape as {k_name}", _shape(k), _shape(v),
            f"allocate {k_name} and {v_name} with one shape",
        )


def batch_matches(name: str, a, batch: int, what: str = "q"):
    if a.shape[0] != batch:
        raise explain(
            ShapeError, name, f"batch size must match {what}'s", f"shape[0] == {batch}",
            f"shape {_shape(a)}", f"give {name} one entry per sequence of {what}",
        )


# -- scalar options -------------------------------------------------------------------------


def dropout(dropout_p):
    if dropout_p not in (0, 0.0, None):
        raise explain(
            UnsupportedError, "dropout_p", "dropout is not supported (forward inference only)",
            "0.0", dropout_p, "pass dropout_p=0.0; apply dropout elsewhere if you train",
        )


def softmax_scale(scale):
    if scale is None:
        return
    # numbers.Real covers float, int, np.float32...; not str, bool (a mistake), or arrays (a
    # 0-d array would be read through float() and, on CuPy, force a device sync).
    if not isinstance(scale, numbers.Real) or isinstance(scale, (bool, np.bool_)):
        fix = "pass a Python float, or None for 1/sqrt(head_dim)"
        if isinstance(scale, str):
            fix = f"convert the string: softmax_scale=float({scale!r}), or pass None"
        elif hasattr(scale, "shape"):
            fix = "pass softmax_scale=float(scale) (a host number, not an array), or None"
        raise explain(
            ArgumentError, "softmax_scale", "must be a real number (a Python or NumPy scalar)",
            "a float such as 1/sqrt(head_dim), or None", _describe(scale), fix,
        )
    if not math.isfinite(scale):
        raise explain(
            ArgumentError, "softmax_scale", "must be a finite number", "e.g. 1/sqrt(head_dim)",
            scale, "pass a float, or None for 1/sqrt(head_dim)",
        )


def window_size(window):
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise explain(
            ArgumentError, "window_size", "must be a pair of ints >= -1 (-1 = unlimited)",
            "(left, right), e.g. (-1, -1) or (256, 0)", repr(window),
            "pass window_size=(left, right) with -1 for no limit",
        )
    for side, w in zip(("left", "right"), window):
        # bool is an Integral, but window_size=(True, False) is certainly a mistake (causal=True?)
        if not isinstance(w, numbers.Integral) or isinstance(w, (bool, np.bool_)):
            raise explain(
                ArgumentError, "window_size", f"the {side} side must be an int (-1 = unlimited)",
                "(left, right) ints, e.g. (-1, -1) or (256, 0)",
                f"{_describe(w)} in {window!r}",
                "pass window_size=(left, right) with ints; for a causal mask pass causal=True",
            )
        if not -1 <= w <= MAX_WINDOW:
            raise explain(
                ArgumentError, "window_size",
                f"the {side} side must be -1 (unlimited) or a key count in [0, 2**31 - 1]",
                f"(left, right) with -1 <= {side} <= {MAX_WINDOW}", f"{side} = {int(w)} in {window!r}",
                "pass -1 for no limit (any window longer than the sequences is the same)",
            )


def softcap(cap):
    if not isinstance(cap, numbers.Real) or not math.isfinite(cap) or cap < 0:
        raise explain(
            ArgumentError, "softcap", "must be a finite number >= 0 (0 disables it)", ">= 0", cap,
            "pass softcap=0.0 to disable, or a positive cap such as 30.0",
        )


def num_splits(n):
    if not isinstance(n, numbers.Integral) or n < 0:
        raise explain(
            ArgumentError, "num_splits", "must be an int >= 0 (0 = choose automatically)", ">= 0",
            n, "pass num_splits=0",
        )


def max_seqlen(name: str, value):
    if not isinstance(value, numbers.Integral) or value < 0:
        raise explain(
            SeqlenError, name, "must be a host int >= 0 (it sizes the launch grid)", "int >= 0",
            repr(value), f"pass {name}=int(max length)",
        )


def _per_head_float32(name, a, xp, shapes, what, expected, fix):
    """alibi_slopes / sinks: a float32 array on q's backend, of one of ``shapes``, with a
    contiguous last dim (the kernels read it with strides in elements)."""
    same_backend(xp, **{name: a})
    if np.dtype(a.dtype) != np.float32:
        raise explain(DTypeError, name, "must have dtype float32", "float32", dtype_name(a.dtype),
                      f"convert with {name}.astype(numpy.float32)")
    if tuple(a.shape) not in shapes:
        raise explain(ShapeError, name, what, expected, _shape(a), fix)
    last_dim_contiguous(name, a)


def alibi_slopes(slopes, xp, batch: int, num_heads: int):
    if slopes is not None:
        _per_head_float32(
            "alibi_slopes", slopes, xp, ((num_heads,), (batch, num_heads)),
            "must have shape (nheads,) or (batch_size, nheads)",
            f"({num_heads},) or ({batch}, {num_heads})",
            "give one slope per query head (optionally per sequence)")


def sinks(sinks, xp, num_heads: int):
    """Attention sinks: one float32 logit per query head, on q's device."""
    if sinks is not None:
        _per_head_float32(
            "sinks", sinks, xp, ((num_heads,),), "must have one logit per query head",
            f"({num_heads},)", "pass a float32 array of shape (nheads,), e.g. the model's s_aux")


#: Ranges per sequence the kernels index (every prefill kernel packs each row's range index + 1
#: in 16 bits: attn/mask.cuh RowRangeIds).
MAX_PREFIX_RANGES = 65535


def prefix_ranges(ranges, xp, batch: int, full: bool = True):
    """candle's mm_prefix_ranges: int32 ``(B, max_ranges, 2)`` of [start, end) key positions on
    q's backend, each sequence's pairs contiguous (the kernels read pair i of sequence b at
    ``b * stride + 2 i``).  ``full`` (always on NumPy; on CuPy with ``check=True``, since it reads
    the ranges on the host): starts >= 0, the used ranges (start < end) of a sequence sorted and
    disjoint.  Without it a CuPy call trusts the values; bad ones cannot reach memory outside the
    sequence (the kernels clip every range to [0, len_k)), they only change what is visible."""
    if ranges is None:
        return
    same_backend(xp, mm_prefix_ranges=ranges)
    if np.dtype(ranges.dtype) != np.int32:
        raise explain(DTypeError, "mm_prefix_ranges", "must have dtype int32", "int32",
                      dtype_name(ranges.dtype), "convert with mm_prefix_ranges.astype(numpy.int32)")
    if ranges.ndim != 3 or ranges.shape[0] != batch or ranges.shape[2] != 2:
        raise explain(ShapeError, "mm_prefix_ranges", "must hold [start, end) pairs per sequence",
                      f"(B={batch}, max_ranges, 2)", _shape(ranges),
                      "pass an int32 array (batch, max_ranges, 2); unused entries start >= end")
    if ranges.shape[1] > MAX_PREFIX_RANGES:
        raise explain(ShapeError, "mm_prefix_ranges", "has too many ranges per sequence",
                      f"max_ranges <= {MAX_PREFIX_RANGES}", _shape(ranges),
                      "merge adjacent ranges (a range may span any number of tokens)")
    if ranges.size and ((ranges.strides[2] != ranges.itemsize)
                        or (ranges.shape[1] > 1 and ranges.strides[1] != 2 * ranges.itemsize)):
        raise explain(
            LayoutError, "mm_prefix_ranges", "must hold each sequence's pairs contiguously",
            f"strides (any, {2 * ranges.itemsize}, {ranges.itemsize}) bytes",
            f"strides {tuple(ranges.strides)} bytes", "pass xp.ascontiguousarray(mm_prefix_ranges)",
        )
    if not full:
        return
    if xp is not np:
        ranges = ranges.get()
    r = np.asarray(ranges).astype(np.int64)
    used = r[..., 0] < r[..., 1]
    bad = used & (r[..., 0] < 0)
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        raise explain(SeqlenError, "mm_prefix_ranges", f"range {i} of sequence {b} starts before key 0",
                      "start >= 0", int(r[b, i, 0]), "give key positions of the sequence, from 0")
    for b in range(r.shape[0]):
        spans = r[b][used[b]]
        order = np.argsort(spans[:, 0], kind="stable")
        if (order != np.arange(len(order))).any() or (spans[1:, 0] < spans[:-1, 1]).any():
            raise explain(
                ArgumentError, "mm_prefix_ranges", f"the ranges of sequence {b} overlap or are unsorted",
                "used ranges in increasing order, each starting at or after the previous end",
                spans.tolist(), "sort the ranges by start and merge overlapping ones",
            )


# -- paged KV -------------------------------------------------------------------------------


def paged_kv(k, v, k_name="k", v_name="v"):
    rank(k_name, k, 4, "paged (num_blocks, page_block_size, Hk, D)")
    rank(v_name, v, 4, "paged (num_blocks, page_block_size, Hk, D)")


def page_block_size_value(given):
    if not isinstance(given, numbers.Integral) or isinstance(given, bool) or given < 1:
        raise explain(
            ArgumentError, "page_block_size", "must be an int >= 1", ">= 1", repr(given),
            "pass page_block_size=k.shape[1], or omit it to read it from the cache",
        )


def page_block_size(given, k, name: str = "k") -> int:
    """The seed of this project: a configured page size that drifted from the cache's.

    Returns the page size to use (read from ``k`` when not given)."""
    actual = int(k.shape[1])
    if actual < 1:
        # Pages of 0 rows hold no key and would make every position p // P a division by 0.
        # (A pool of 0 pages, k.shape[0] == 0, is legal: every sequence then has no key.)
        raise explain(
            ShapeError, name, "a paged cache's pages must hold at least one row",
            "page_block_size = k.shape[1] >= 1", f"shape {_shape(k)}",
            "allocate the pool as (num_blocks, page_block_size >= 1, Hk, D), e.g. with "
            "PagedKVCache",
        )
    if given is None:
        return actual
    page_block_size_value(given)
    if given != actual:
        nb, _, hk, d = (int(s) for s in k.shape)
        raise PageSizeMismatchError(
            f"page_block_size {given} does not match k shape (blocks={nb}, {actual}, {hk}, {d}): "
            f"the kernel would address pages of {given} rows in a cache whose pages hold {actual} "
            f"(expected page_block_size == k.shape[1] == {actual}, got {given}). Fix: allocate the "
            f"cache with page_block_size={given} (shape ({nb}, {given}, {hk}, {d})), or pass "
            f"page_block_size=k.shape[1] (= {actual}), or omit page_block_size so it is read from "
            "the cache, or use PagedKVCache, which makes this mismatch impossible."
        )
    return actual


def block_table(table, xp, batch: int):
    index_array("block_table", table, xp, 2, length=batch)
    if table.shape[1] < 1:
        raise explain(
            BlockTableError, "block_table", "must have at least one column", "shape (batch, >= 1)",
            f"shape {_shape(table)}", "give max_blocks_per_seq >= 1 columns",
        )


def block_ids_in_range(table, lengths, page_size: int, num_blocks: int):
    """Host-side: every page a sequence uses (positions < its length) is in [0, num_blocks)."""
    lengths = np.asarray(_host(lengths), dtype=np.int64)
    used = (lengths + page_size - 1) // page_size
    # Only the columns some sequence uses: the cost follows the sequences, not the table width
    # (a PagedKVCache's table is as wide as its pool by default).
    width = min(int(used.max(initial=0)), int(table.shape[1]))
    table = _host(table[:, :width])
    cols = np.arange(width)[None, :]
    in_use = cols < used[:, None]
    bad = in_use & ((table < 0) | (table >= num_blocks))
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        raise explain(
            BlockTableError, "block_table", f"entry [{b}, {i}] points outside the page pool",
            f"a page id in [0, {num_blocks})", int(table[b, i]),
            "fill block_table only with ids of allocated pages (k.shape[0] pages); "
            "PagedKVCache.block_table() does this for you",
        )


def lengths_fit(name: str, lengths, capacity: int, why: str, fix: str):
    """Host-side: every length is in [0, capacity]."""
    lengths = np.asarray(_host(lengths), dtype=np.int64)
    if lengths.size == 0:
        return
    b_max = int(np.argmax(lengths))
    b_min = int(np.argmin(lengths))
    if lengths[b_min] < 0:
        raise explain(
            SeqlenError, name, f"sequence {b_min} has a negative length", ">= 0", int(lengths[b_min]),
            "lengths (and cache_seqlens) must be >= 0",
        )
    if lengths[b_max] > capacity:
        raise explain(SeqlenError, name, f"sequence {b_max} {why}", f"<= {capacity}", int(lengths[b_max]), fix)


def seqused_within(used, lengths):
    """Host-side: seqused_k[b] is in [0, cu_seqlens_k[b+1] - cu_seqlens_k[b]]."""
    for bad, what, fix in (
        (used < 0, "has a negative number of used keys",
         "seqused_k[b] counts the keys of sequence b to attend to: pass values >= 0"),
        (used > lengths, "uses more keys than cu_seqlens_k gives it",
         "keep seqused_k[b] <= cu_seqlens_k[b+1] - cu_seqlens_k[b]"),
    ):
        if bad.any():
            b = int(np.argmax(bad))
            raise explain(SeqlenError, "seqused_k", f"sequence {b} {what}",
                          f"0 <= seqused_k[{b}] <= {int(lengths[b])}", int(used[b]), fix)


def indices_in_range(name: str, idx, upper: int, fix: str):
    """Host-side: every entry of an index array is in [0, upper)."""
    idx = np.asarray(_host(idx), dtype=np.int64)
    bad = (idx < 0) | (idx >= upper)
    if bad.any():
        b = int(np.argmax(bad))
        raise explain(
            SeqlenError, name, f"entry {b} is outside [0, {upper})", f"0 <= {name}[{b}] < {upper}",
            int(idx[b]), fix,
        )


def leftpad_within(leftpad, cache_seqlens):
    """Host-side: 0 <= cache_leftpad[b] <= cache_seqlens[b] (keys start at the left pad)."""
    pad = np.asarray(_host(leftpad), dtype=np.int64)
    lens = np.asarray(_host(cache_seqlens), dtype=np.int64)
    bad = (pad < 0) | (pad > lens)
    if bad.any():
        b = int(np.argmax(bad))
        raise explain(
            SeqlenError, "cache_leftpad", f"sequence {b} starts outside its cached keys",
            f"0 <= cache_leftpad[{b}] <= cache_seqlens[{b}] = {int(lens[b])}", int(pad[b]),
            "keep cache_leftpad[b] <= cache_seqlens[b]",
        )


# -- varlen ---------------------------------------------------------------------------------


def cu_seqlens(name: str, cu, xp, total: int | None, full: bool):
    """cu_seqlens: int32 (B+1,), starting at 0, non-decreasing, ending at ``total`` tokens."""
    if cu is None:
        raise explain(
            ArgumentError, name, "is required by flash_attn_varlen_func (paged or not)",
            "an int32 array (batch_size + 1,)", "None",
            f"pass {name} = [0, len_0, len_0 + len_1, ...] (a PagedKVCache as k supplies the key "
            "lengths itself)",
        )
    index_array(name, cu, xp, 1)
    # B = 0 is a legal (empty) batch: cu_seqlens = [0].
    if cu.shape[0] < 1:
        raise explain(
            SeqlenError, name, "must hold batch_size + 1 cumulative offsets",
            "length >= 1 ([0] for an empty batch)", f"length {cu.shape[0]}",
            "build it as [0, len_0, len_0 + len_1, ...] (just [0] when there is no sequence)",
        )
    if cu.shape[0] == 1 and total:
        # [0] is an empty batch, which owns no row: a shape fact, checked without a host read
        # (otherwise a GPU call would leave the tensor's rows unwritten).
        raise explain(
            SeqlenError, name, "must hold batch_size + 1 cumulative offsets (one offset is an "
            f"empty batch, but the tensor it indexes has {total} rows)",
            f"length >= 2, ending at {total}", f"length {cu.shape[0]}",
            "build it as [0, len_0, len_0 + len_1, ...] over the sequences of the packed rows",
        )
    if not full:
        return
    host = _host(cu).astype(np.int64)
    if host[0] != 0:
        raise explain(
            SeqlenError, name, "must start at 0", "0", int(host[0]),
            "prepend 0: cu_seqlens = concatenate([[0], cumsum(lengths)])",
        )
    steps = np.diff(host)
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise explain(
            SeqlenError, name, f"must be non-decreasing (entry {b + 1} is below entry {b})",
            f">= {int(host[b])}", int(host[b + 1]), "build it with a cumulative sum of lengths >= 0",
        )
    if total is not None and host[-1] != total:
        raise explain(
            SeqlenError, name, "must end at the total number of tokens", total, int(host[-1]),
            "the last entry is the number of packed rows of the tensor it indexes",
        )


def max_seqlen_covers(name: str, max_len: int, cu_name: str, cu):
    host = _host(cu).astype(np.int64)
    longest = int(np.diff(host).max()) if host.size > 1 else 0
    if longest > max_len:
        raise explain(
            SeqlenError, name, f"is smaller than the longest sequence in {cu_name}", f">= {longest}",
            max_len, f"pass {name}=int(diff({cu_name}).max())",
        )


def _host(a):
    if a is None or isinstance(a, np.ndarray):
        return a
    return a.get()


# -- rotary ---------------------------------------------------------------------------------


def rotary(cos, sin, xp, head_dim: int, needed_positions: int | None):
    if cos is None and sin is None:
        return
    if (cos is None) != (sin is None):
        raise explain(
            ArgumentError, "rotary_cos" if cos is None else "rotary_sin",
            "rotary_cos and rotary_sin must be given together", "both or neither", "only one",
            "pass both tables",
        )
    same_backend(xp, rotary_cos=cos, rotary_sin=sin)
    rank("rotary_cos", cos, 2, "(seqlen_ro, rotary_dim / 2)")
    if tuple(sin.shape) != tuple(cos.shape):
        raise explain(
            ShapeError, "rotary_sin", "must have the same shape as rotary_cos", _shape(cos),
            _shape(sin), "build both tables from the same positions and frequencies",
        )
    rotary_dim = 2 * cos.shape[1]
    if rotary_dim > head_dim or rotary_dim == 0:
        raise explain(
            ShapeError, "rotary_cos", "rotary_dim (= 2 * rotary_cos.shape[1]) must be in [2, head_dim]",
            f"shape[1] <= {head_dim // 2}", f"shape {_shape(cos)}",
            "give rotary_dim / 2 columns (one frequency per rotated pair)",
        )
    if needed_positions is not None:
        rotary_covers(cos, needed_positions, "has fewer rows (positions) than the cache has "
                      "positions (flash-attn: cos/sin seqlen must be at least the seqlen of KV cache)")
    for name, a in (("rotary_cos", cos), ("rotary_sin", sin)):
        if np.dtype(a.dtype) not in CPU_DTYPES:
            raise explain(
                DTypeError, name, "must be a float array", "float16/bfloat16/float32", dtype_name(a.dtype),
                f"convert with {name}.astype(numpy.float32)",
            )


def rotary_covers(cos, needed_positions: int,
                  what: str = "has fewer rows (positions) than the new tokens occupy"):
    """The tables have a row for each of ``needed_positions`` positions (the cache's, or the
    last one a new token will occupy)."""
    if cos.shape[0] < needed_positions:
        raise explain(
            ShapeError, "rotary_cos", what,
            f"seqlen_ro >= {needed_positions}", f"shape {_shape(cos)}",
            "build the tables for every position up to the cache capacity",
        )


# -- value checks (check=True): they read index arrays on the host ----------------------------


def varlen_values(max_seqlen_q, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, page_size,
                  num_pages) -> None:
    """flash_attn_varlen_func's value checks: max_seqlen_q covers every query length; seqused_k
    within the contiguous lengths; paged lengths within the table's capacity and every used
    block id a page of the pool.  ``block_table`` None: contiguous k/v."""
    paged = block_table is not None
    max_seqlen_covers("max_seqlen_q", max_seqlen_q, "cu_seqlens_q", cu_seqlens_q)
    lengths_k = np.diff(_host(cu_seqlens_k).astype(np.int64))
    if seqused_k is not None:
        used = _host(seqused_k).astype(np.int64)
        if not paged:
            seqused_within(used, lengths_k)
        lengths_k = used
    if paged:
        width = int(block_table.shape[1])
        lengths_fit(
            "cu_seqlens_k" if seqused_k is None else "seqused_k", lengths_k, width * page_size,
            f"is longer than max_blocks_per_seq * page_block_size = {width} * {page_size}",
            "give the block table more columns or the sequence fewer keys",
        )
        block_ids_in_range(block_table, lengths_k, page_size, num_pages)


def kvcache_values(cache_seqlens, new_tokens, capacity, rotary_cos, cache_batch_idx,
                   cache_leftpad, block_table, page_size, cache_rows) -> None:
    """flash_attn_with_kvcache's value checks, made before anything is appended: the lengths
    after the append fit the cache (and the rotary tables), cache_batch_idx rows exist,
    cache_leftpad within the lengths, every used block id a page of the pool.  ``block_table``
    None: a contiguous cache of ``cache_rows`` rows; else a pool of ``cache_rows`` pages."""
    host_lens = _host(cache_seqlens).astype(np.int64)
    after = host_lens + new_tokens
    if rotary_cos is not None:
        rotary_covers(rotary_cos, int(after.max(initial=0)))
    lengths_fit(
        "cache_seqlens", after, capacity,
        f"would hold more than the cache's {capacity} positions after appending {new_tokens} "
        "new tokens",
        "allocate a larger cache (or more block-table columns), or start a new sequence",
    )
    if cache_batch_idx is not None:
        indices_in_range(
            "cache_batch_idx", cache_batch_idx, cache_rows,
            "use row indices of k_cache, in [0, k_cache.shape[0])",
        )
    if cache_leftpad is not None:
        leftpad_within(cache_leftpad, host_lens)
    if block_table is not None:
        block_ids_in_range(block_table, after, page_size, cache_rows)
