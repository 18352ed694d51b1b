"""Merge two partial attention results computed over disjoint key sets.

If ``(out_a, lse_a)`` is attention over keys A and ``(out_b, lse_b)`` over keys B, the attention
over A u B is the LSE-weighted mix (this is how split-KV decoding and cascade / shared-prefix
attention combine their pieces)::

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

computed stably by subtracting ``max(lse_a, lse_b)`` before exponentiating.  A partial that saw
no key has LSE +inf (flash-attn's convention) or -inf (the mathematical one); either way it gets
weight 0, whatever its ``out`` holds.  If neither part saw a key, the result is 0 with LSE +inf.
A partial whose LSE is NaN (its scores held a NaN) makes the row's result NaN, out and LSE; a
NaN in the ``out`` of a partial that has a key (finite LSE) reaches the result too, however
small that partial's weight.

Attention sinks (the ``sinks=`` of the attention functions) behave as one more key with a zero
value vector: a state computed with sinks includes that key.  Merging is exact when the sink is
in exactly one of the states merged (compute one chunk with ``sinks=``, the others without);
merging two states that both include it counts it twice.

Zero-size inputs (no row: total, B or S is 0) give zero-size results without any device work;
a head dim or a head count of 0 is refused, as the attention functions refuse it.
"""

from __future__ import annotations

import numpy as np

from ._arrays import BFLOAT16, dtype_name
from .errors import DTypeError, ShapeError, explain
from .validate import same_library

__all__ = ["merge_attention_states"]

_OUT_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))
_LSE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _shape(a) -> str:
    return "(" + ", ".join(str(int(s)) for s in a.shape) + ")"


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key sets, from the two partial results.

    Args:
        out_a, out_b: partial outputs, varlen ``(total, H, D)`` or dense ``(B, S, H, D)``, same
            shape and dtype (float16, bfloat16, float32 or float64).
        lse_a, lse_b: their float32 (or float64) natural-log LSEs, flash-attn layouts:
            ``(H, total)`` for varlen outputs, ``(B, H, S)`` for dense ones.  +inf or -inf marks
            a row whose partial saw no key.

    Returns:
        ``(out, lse)``: ``out`` in out_a's shape and dtype, ``lse`` in lse_a's shape, float32
        (float64 when any input is float64, which is also the compute precision then;
        otherwise the merge is computed in float32).  Rows empty in both parts give 0 and +inf;
        a NaN LSE in either part gives NaN (out and LSE).
        Works on NumPy and CuPy arrays (CuPy: one kernel, the split-KV combine kernel of
        ``cuda_src/sm80/flash_decode.cu``, for float16/bfloat16/float32 outputs with float32 LSEs;
        a handful of elementwise kernels otherwise; never a host sync).
    """
    xp = _check(out_a, lse_a, out_b, lse_b)
    wide = any(np.dtype(a.dtype) == np.float64 for a in (out_a, lse_a, out_b, lse_b))
    if lse_a.size == 0:  # no row to merge: nothing to compute, no kernel to launch
        return (xp.empty(out_a.shape, dtype=out_a.dtype),
                xp.empty(lse_a.shape, dtype=np.float64 if wide else np.float32))
    if xp is not np:
        fast = _merge_cuda(out_a, lse_a, out_b, lse_b)
        if fast is not None:
            return fast
    ct = np.float64 if wide else np.float32

    la, lb = _finite_or_neg_inf(xp, lse_a, ct), _finite_or_neg_inf(xp, lse_b, ct)
    # NaN (a partial whose scores held a NaN) propagates through maximum, the weights and the
    # LSE, so such rows come out NaN; it is not "empty" (NaN == -inf is false).
    m = xp.maximum(la, lb)
    empty = m == -np.inf  # neither part saw a key
    m = xp.where(empty, ct(0), m)  # any finite shift works; avoids (-inf) - (-inf) = nan
    wa, wb = xp.exp(la - m), xp.exp(lb - m)  # in [0, 1], the larger one is exactly 1
    total = wa + wb
    lse = xp.where(empty, ct(np.inf), m + xp.log(xp.where(empty, ct(1), total)))
    scale_a = _row_weights(xp.where(empty, ct(0), wa / xp.where(empty, ct(1), total)), out_a.ndim)
    scale_b = _row_weights(xp.where(empty, ct(0), wb / xp.where(empty, ct(1), total)), out_b.ndim)

    # An empty part's out may hold anything (even nan); select on "has a key" (LSE not
    # infinite: finite or NaN) instead of multiplying by 0.  A part with a key contributes
    # scale * out even when its weight underflows to 0, so a NaN in its out (or a NaN scale)
    # reaches the result -- as in the CUDA combine kernel.
    has_a = _row_weights(~xp.isinf(lse_a), out_a.ndim)
    has_b = _row_weights(~xp.isinf(lse_b), out_b.ndim)
    out = xp.where(has_a, scale_a * out_a.astype(ct), ct(0)) + xp.where(
        has_b, scale_b * out_b.astype(ct), ct(0)
    )
    return out.astype(out_a.dtype), lse.astype(np.float64 if wide else np.float32)


def _merge_cuda(out_a, lse_a, out_b, lse_b):
    """The CUDA combine kernel, or None when it does not cover these dtypes / no GPU kernel."""
    try:
        from ._cuda.decode import merge_states
    except ImportError:  # pragma: no cover - CuPy arrays without the CUDA backend
        return None
    return merge_states(out_a, lse_a, out_b, lse_b)


def _finite_or_neg_inf(xp, lse, ct):
    """lse in the compute dtype with both infinities (no visible key) mapped to -inf."""
    lse = lse.astype(ct)
    return xp.where(xp.isinf(lse), ct(-np.inf), lse)


def _row_weights(w, out_ndim: int):
    """Reshape per-row weights from the LSE layout to broadcast against ``out``:
    ``(H, total) -> (total, H, 1)`` or ``(B, H, S) -> (B, S, H, 1)``."""
    w = w.T if out_ndim == 3 else w.transpose(0, 2, 1)
    return w[..., None]


def _check(out_a, lse_a, out_b, lse_b):
    """Validate the four arrays; return their array module."""
    arrays = {"out_a": out_a, "lse_a": lse_a, "out_b": out_b, "lse_b": lse_b}
    xp = same_library(**arrays)
    if out_a.ndim not in (3, 4):
        raise explain(
            ShapeError, "out_a", "must be varlen (total, H, D) or dense (B, S, H, D)",
            "rank 3 or 4", f"shape {_shape(out_a)}",
            "pass the attention output as flash-attn returns it",
        )
    if tuple(out_b.shape) != tuple(out_a.shape):
        raise explain(
            ShapeError, "out_b", "must have out_a's shape (the same queries)", _shape(out_a),
            _shape(out_b), "merge partial results of the same queries over disjoint key sets",
        )
    if out_a.ndim == 3:
        total, H, D = out_a.shape
        expected, layout = (H, total), "(H, total) for a varlen (total, H, D) output"
    else:
        B, S, H, D = out_a.shape
        expected, layout = (B, H, S), "(B, H, S) for a dense (B, S, H, D) output"
    if H < 1 or D < 1:
        # No attention call returns such an output (they refuse H = 0 and D = 0); an empty
        # batch is a 0 in total / B / S, which is fine.
        raise explain(
            ShapeError, "out_a", "must have at least one head and a head dim of at least 1",
            "nheads = out_a.shape[-2] >= 1 and headdim = out_a.shape[-1] >= 1",
            f"shape {_shape(out_a)}",
            "pass the outputs of attention calls (an empty batch has 0 rows, not 0 heads)",
        )
    for name in ("lse_a", "lse_b"):
        if tuple(arrays[name].shape) != expected:
            raise explain(
                ShapeError, name, f"must have flash-attn's LSE layout {layout}",
                "(" + ", ".join(map(str, expected)) + ")", _shape(arrays[name]),
                "pass the softmax_lse returned with the output (return_softmax_lse=True); "
                "transpose a (total, H) LSE with lse.T",
            )
    _dtype_in("out_a", out_a, _OUT_DTYPES)
    _dtype_in("lse_a", lse_a, _LSE_DTYPES)
    _dtype_in("lse_b", lse_b, _LSE_DTYPES)
    if np.dtype(out_b.dtype) != np.dtype(out_a.dtype):
        raise explain(
            DTypeError, "out_b", "must have out_a's dtype", dtype_name(out_a.dtype),
            dtype_name(out_b.dtype), "cast with out_b.astype(out_a.dtype)",
        )
    return xp


def _dtype_in(name: str, a, allowed) -> None:
    if np.dtype(a.dtype) not in allowed:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise explain(
            DTypeError, name, "unsupported dtype", f"one of {names}", dtype_name(a.dtype),
            f"cast with {name}.astype(numpy.float32)",
        )
