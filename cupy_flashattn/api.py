"""The public functions, with flash-attn's names, arguments, layouts and semantics (forward).

Each function validates its arguments (``validate.py``), lowers the call to one
:class:`~cupy_flashattn.problem.AttentionProblem` and hands it to the backend that owns the
arrays: NumPy arrays run on the Numba CPU backend and return NumPy arrays; CuPy arrays (and
foreign GPU arrays such as torch tensors, adopted zero-copy through DLPack) run on the CUDA
kernels on CuPy's current stream and return CuPy arrays.

Shapes (``H`` query heads, ``Hk`` key/value heads, ``D`` head dim)::

    dense      q (B, Sq, H, D)        k, v (B, Sk, Hk, D)
    varlen     q (total_q, H, D)      k, v (total_k, Hk, D)      cu_seqlens_q/k int32 (B+1,)
    paged      k, v (num_blocks, page_block_size, Hk, D)   block_table int32 (B, max_blocks_per_seq)
    kv cache   k_cache, v_cache (B_cache, S_cache, Hk, D) or paged;  cache_seqlens int32 (B,)

GQA/MQA: ``H % Hk == 0`` and query head ``h`` reads kv head ``h // (H // Hk)``.

Causal and local masks are aligned to the bottom-right corner.  With Sq = 2, Sk = 5 (x = seen)::

    causal=True          keys 0 1 2 3 4
        query 0               x x x x .
        query 1               x x x x x

Query ``i`` sees key ``j`` iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``
(``window_size=(left, right)``, -1 = unlimited; causal is ``right = 0``).

``softmax_lse`` is float32 (float64 for float64 inputs) natural log, ``(B, H, Sq)`` dense / ``(H, total_q)`` varlen; a row that
sees no key has output 0 and LSE +inf.
"""

from __future__ import annotations

import math
import os

import numpy as np

from . import fp8 as fp8_mod
from . import validate
from ._arrays import adopt
from .errors import ArgumentError, SeqlenError, UnsupportedError, explain
from ._calls import DenseCall, KVCacheCall, VarlenCall
from ._signature import CALLS, signature
from .kvcache import PagedKVCache

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]


_SEMANTICS = """
    Semantics shared by every entry point:
        GQA/MQA: ``H % Hk == 0``; query head ``h`` reads kv head ``h // (H // Hk)`` (no copy).
        Masks are aligned to the bottom-right corner, per sequence: with ``shift = Sk - Sq``,
        query ``i`` sees key ``j`` iff ``i + shift - left <= j <= i + shift + right``
        (``window_size=(left, right)``, -1 = unlimited; ``causal=True`` sets ``right = 0``).
        Sq = 3, Sk = 5, causal::

                      keys 0 1 2 3 4
            query 0        x x x . .
            query 1        x x x x .
            query 2        x x x x x

        Sq = 5, Sk = 3, causal (the first Sq - Sk rows see no key)::

                      keys 0 1 2
            query 0        . . .      -> output 0, LSE +inf
            query 1        . . .      -> output 0, LSE +inf
            query 2        x . .
            query 3        x x .
            query 4        x x x

        Logits: ``s = softmax_scale * q.k``; then ``softcap * tanh(s / softcap)`` if softcap > 0;
        then ``- slope[h] * |i + shift - j|`` with ALiBi (for plain causal calls flash-attn adds
        ``slope * j`` instead: same output, its LSE differs by a per-row constant).
        softmax_lse: float32 (float64 for float64 inputs), natural log of the softmax denominator (after the max shift is
        added back); +inf for a row that sees no key, whose output is exactly 0.
        Zero-size inputs are legal: no query row (B, Sq or total_q = 0; cu_seqlens = [0] for
        an empty varlen batch) returns zero-size results; k/v of no row (Sk = 0, total_k = 0,
        a cache of 0 rows, a pool of 0 pages) gives every row output 0 and LSE +inf.  Neither
        launches a kernel.  A zero head count or head dim is an error.
        Backends: NumPy inputs run on the Numba CPU backend and return NumPy arrays; CuPy inputs
        (and torch/JAX GPU arrays, adopted zero-copy via DLPack) run the CUDA kernels on CuPy's
        current stream and return CuPy arrays.  Every dtype keeps its precision: float32 on the
        GPU runs at float32 accuracy (split operands on tensor cores: float16 planes on Hopper,
        3xTF32 elsewhere) unless
        :func:`set_float32_precision` asks for TF32 ("high") or bfloat16 operands ("medium");
        float64 runs in float64 (DMMA tensor cores; head dims up to 128 on the GPU).
"""


def _with_semantics(fn):
    fn.__doc__ = (fn.__doc__ or "") + _SEMANTICS
    return fn


def _default_check() -> bool:
    return os.environ.get("CUPY_FLASHATTN_CHECK", "0") not in ("", "0", "false", "False")


def _full_check(xp, check) -> bool:
    """Value checks that read index arrays: always on NumPy (free), on CuPy only when asked
    (they synchronise with the device)."""
    if xp is np:
        return True
    return _default_check() if check is None else bool(check)


def _common_checks(q, k, v, dropout_p, softmax_scale, window_size, softcap, k_scale=None,
                   v_scale=None, kv_names=("k", "v"), kv_cache_dtype=None):
    """Checks shared by all entry points; returns (xp, q, k, v, fp8) with foreign GPU arrays
    adopted; ``fp8``: the float8 format of k and v (a float8 cache, fp8.py, read with
    ``k_scale`` / ``v_scale``; uint8 bytes with ``kv_cache_dtype``), or None."""
    q, k, v = adopt(q), adopt(k), adopt(v)
    xp = validate.same_library(q=q, k=k, v=v)
    validate.dtype_supported("q", q, xp)
    fp8 = validate.kv_dtypes(q, k, v, xp, *kv_names, k_scale=k_scale, v_scale=v_scale,
                             kv_cache_dtype=kv_cache_dtype)
    for name, a in (("q", q), ("k", k), ("v", v)):
        validate.last_dim_contiguous(name, a)
    validate.dropout(dropout_p)
    validate.softmax_scale(softmax_scale)
    validate.window_size(window_size)
    validate.softcap(softcap)
    return xp, q, k, v, fp8


def _kv_scales(fp8, k_scale, v_scale, num_heads_k: int, xp, k) -> dict:
    """A float8 call's fields: its scales as ``kv_scales`` (fp8.ScaleBinding, which
    _calls._Call takes out of the fields: floats become (Hk,) arrays once, CuPy arrays are read
    per call) and, for uint8 bytes, their format as ``kv_dtype``; nothing for 16/32/64-bit K/V
    (``fp8`` None)."""
    if fp8 is None:
        return {}
    fields = dict(kv_scales=fp8_mod.ScaleBinding(k_scale, v_scale, num_heads_k, xp))
    if np.dtype(k.dtype) == np.uint8:
        fields["kv_dtype"] = fp8
    return fields


def _mask(causal, window_size):
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    return left, right


def _check_output(xp, q, out, rows_shape):
    """A preallocated ``out`` has q's shape and dtype, lives with q, can be written, and can be
    viewed as ``rows_shape`` = (tokens, H, D) without a copy (the kernels write into it)."""
    if out is None:
        return
    validate.same_backend(xp, out=out)
    validate.out_dtype(out, q)
    if tuple(out.shape) != tuple(q.shape):
        raise explain(
            validate.ShapeError, "out", "must have q's shape", tuple(q.shape), tuple(out.shape),
            "allocate out with xp.empty_like(q)",
        )
    validate.last_dim_contiguous("out", out)
    validate.writable("out", out, "pass a writeable out (e.g. xp.empty_like(q)) or none")
    if out.size == 0:
        return  # nothing will be written (NumPy gives zero-size arrays all-zero strides)
    flat = out.reshape(rows_shape)
    if not _shares_memory(xp, flat, out):
        raise explain(
            validate.LayoutError, "out", "must be viewable as (tokens, H, D) without a copy",
            "a contiguous array", f"strides {out.strides}", "pass a contiguous out or none",
        )


def _shares_memory(xp, a, b) -> bool:
    if xp is np:
        return np.shares_memory(a, b)
    return a.data.ptr == b.data.ptr


# -- dense ----------------------------------------------------------------------------------


@_with_semantics
def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    return_softmax_lse=False,
    out=None,
    check=None,
    sinks=None,
    mm_prefix_ranges=None,
    k_scale=None,
    v_scale=None,
    kv_cache_dtype=None,
):
    """Attention over a dense batch.

    Arguments:
        q: ``(B, Sq, H, D)``; k, v: ``(B, Sk, Hk, D)``; float16, bfloat16, float32 or
            float64 (each computed at its own precision).  ``H % Hk == 0``.
        dropout_p: must be 0.0 (forward inference only).
        softmax_scale: defaults to ``1 / sqrt(D)``.
        causal, window_size: bottom-right aligned masks (see the module docstring).
        softcap: ``s = softcap * tanh(s / softcap)`` on the scaled logits when > 0.
        alibi_slopes: float32 ``(H,)`` or ``(B, H)``; adds ``-slope * |i + Sk - Sq - j|``.
        sinks: float32 ``(H,)`` attention sinks (FlashInfer's name; gpt-oss's ``s_aux``, FA3's
            and vLLM's ``sinks``): one more logit per row of head h, neither scaled nor capped,
            with no value vector -- ``out = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sinks[h]))``.
            The LSE includes it; a row that sees no key outputs 0 with LSE ``sinks[h]``.  To merge
            states with :func:`merge_attention_states`, pass sinks to exactly one of the calls
            (each state that includes the sink counts it once).
        mm_prefix_ranges: int32 ``(B, max_ranges, 2)`` (candle's name): ``[start, end)`` key
            positions per sequence, sorted and disjoint (unused entries ``start >= end``); a
            query whose position ``i + Sk - Sq`` lies in a range also sees every key of that
            range, later ones too (bidirectional image tokens inside a causal prompt); all
            else keeps the causal / window mask.  CPU backend for now (CuPy arrays get an
            UnsupportedError).
        k_scale, v_scale: with float8 k / v (vLLM's FP8 KV cache): the dequantization scales,
            keys ``float(k) * k_scale`` -- a float or float32 ``(Hk,)`` per kv head, default
            1.0; a CuPy float32 array is read on the device at every call (see
            :mod:`cupy_flashattn.fp8`).
        kv_cache_dtype: vLLM's name for the float8 format of uint8 k / v bytes: "fp8" (=
            "fp8_e4m3", ``ml_dtypes.float8_e4m3fn``) or "fp8_e5m2"; None / "auto" for k / v of
            their own dtype (NumPy float8 arrays need none).  CuPy has no float8 dtype, so a
            GPU float8 cache is always bytes; the GPU reads it for float16 / bfloat16 queries
            and head dims that are multiples of 16 up to 256.
        deterministic: accepted for compatibility (the forward pass is deterministic).
        return_attn_probs: returns ``(out, softmax_lse, None)`` like flash-attn (no probs).
        return_softmax_lse: returns ``(out, softmax_lse)``; LSE is ``(B, H, Sq)`` float32
            (float64 for float64 inputs).
        out: optional preallocated output ``(B, Sq, H, D)``.
        check: run value checks that need a device sync (CuPy); default from
            ``CUPY_FLASHATTN_CHECK``.

    Returns ``out (B, Sq, H, D)`` in q's dtype (plus the LSE as requested).

    Example::

        import cupy as cp, ml_dtypes
        q = cp.random.standard_normal((2, 1024, 32, 128)).astype(ml_dtypes.bfloat16)
        k = cp.random.standard_normal((2, 1024, 8, 128)).astype(ml_dtypes.bfloat16)  # GQA 32/8
        out, lse = flash_attn_func(q, k, k, causal=True, return_softmax_lse=True)
        # out (2, 1024, 32, 128) bfloat16, lse (2, 32, 1024) float32
    """
    key = signature((q, k, v, alibi_slopes, sinks, mm_prefix_ranges, out),
                    (dropout_p, softmax_scale, causal, window_size, softcap, return_attn_probs,
                     return_softmax_lse, check, _default_check(), k_scale, v_scale,
                     kv_cache_dtype))
    call = CALLS.get(key) if key is not None else None
    if call is None:
        q, k, v, alibi_slopes, sinks, mm_prefix_ranges, out = (adopt(a) for a in (q, k, v,
                                                               alibi_slopes, sinks,
                                                               mm_prefix_ranges, out))
        call = _prepare_dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                              alibi_slopes, sinks, mm_prefix_ranges, return_attn_probs,
                              return_softmax_lse, out, k_scale, v_scale, check, kv_cache_dtype)
        if key is not None:
            CALLS.put(key, call)
    return call.execute(q, k, v, alibi_slopes, sinks, mm_prefix_ranges, out, k_scale, v_scale)


def _prepare_dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   sinks, mm_prefix_ranges,
                   return_attn_probs, return_softmax_lse, out, k_scale=None,
                   v_scale=None, check=None, kv_cache_dtype=None) -> DenseCall:
    """Every check of flash_attn_func (none needs a device sync), lowered to a DenseCall."""
    xp, q, k, v, fp8 = _common_checks(q, k, v, dropout_p, softmax_scale, window_size, softcap,
                                      k_scale, v_scale, kv_cache_dtype=kv_cache_dtype)
    validate.rank("q", q, 4, "dense (batch, seqlen_q, nheads, headdim)")
    validate.rank("k", k, 4, "dense (batch, seqlen_k, nheads_k, headdim)")
    validate.rank("v", v, 4, "dense (batch, seqlen_k, nheads_k, headdim)")
    validate.head_dims(q, k, v)
    validate.kv_same_shape(k, v)
    B, Sq, H, D = (int(s) for s in q.shape)
    Sk, Hk = int(k.shape[1]), int(k.shape[2])
    validate.batch_matches("k", k, B)
    validate.heads(H, Hk)
    left, right = _mask(causal, window_size)
    _check_output(xp, q, out, (B * Sq, H, D))
    fields = dict(
        batch_size=B, seqlen_q=Sq, seqlen_k=Sk, max_seqlen_q=Sq, max_seqlen_k=Sk,
        **_logits(xp, softmax_scale, D, left, right, softcap, alibi_slopes, sinks,
        mm_prefix_ranges, B, H, _full_check(xp, check)), **_kv_scales(fp8, k_scale, v_scale, Hk, xp, k),
    )
    return DenseCall(xp, fields, H, D, return_softmax_lse, return_attn_probs, tuple(q.shape),
                     tuple(k.shape))


def _logits(xp, softmax_scale, head_dim, left, right, softcap, alibi_slopes, sinks,
            mm_prefix_ranges, batch, num_heads, full):
    """The AttentionProblem fields of the logit transform and mask, shared by every entry point
    (the slopes are validated here and passed per call: see ``_calls._Call._alibi``).  ``full``:
    also check the values of the prefix ranges (reads them on the host; see _full_check)."""
    validate.alibi_slopes(alibi_slopes, xp, batch, num_heads)
    validate.sinks(sinks, xp, num_heads)
    validate.prefix_ranges(mm_prefix_ranges, xp, batch, full)
    return dict(
        softmax_scale=_scale(softmax_scale, head_dim),
        window_left=left,
        window_right=right,
        softcap=float(softcap),
    )


def _scale(softmax_scale, head_dim):
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)


# -- varlen and paged -----------------------------------------------------------------------


@_with_semantics
def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    page_block_size=None,
    seqused_k=None,
    seq_ids=None,
    return_softmax_lse=False,
    out=None,
    check=None,
    sinks=None,
    mm_prefix_ranges=None,
    k_scale=None,
    v_scale=None,
    kv_cache_dtype=None,
):
    """Attention over a batch of sequences of different lengths, packed without padding.

    Arguments:
        q: ``(total_q, H, D)``; sequence b owns rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``.
        k, v: ``(total_k, Hk, D)`` with ``cu_seqlens_k``; or a paged cache
            ``(num_blocks, page_block_size, Hk, D)`` with ``block_table (B, max_blocks_per_seq)``
            int32, where logical key ``p`` of sequence ``b`` is row ``p % P`` of page
            ``block_table[b, p // P]`` and ``cu_seqlens_k`` gives the key lengths; or a
            :class:`PagedKVCache` as ``k`` (``v=None``, ``cu_seqlens_k=None``), whose sequences
            ``seq_ids`` (default: all, in creation order) supply keys, lengths and tables.
        cu_seqlens_q, cu_seqlens_k: int32 ``(B+1,)`` cumulative lengths starting at 0.
        max_seqlen_q, max_seqlen_k: host ints bounding the lengths (they size the grid).
        block_table: int32 ``(B, max_blocks_per_seq)`` page ids for a paged k/v.
        page_block_size: optional; when given it must equal ``k.shape[1]`` (it is read from the
            cache otherwise).
        seqused_k: int32 ``(B,)``: use only the first ``seqused_k[b]`` keys of sequence b.
        seq_ids: with a PagedKVCache as ``k``: which of its sequences, in batch order.
        alibi_slopes: float32 ``(H,)`` or ``(B, H)``.  out: optional ``(total_q, H, D)`` buffer.
        k_scale, v_scale, kv_cache_dtype: a float8 k / v's scales and format
            (:func:`flash_attn_func`); a float8 PagedKVCache supplies its own.
        Other arguments as :func:`flash_attn_func`; the LSE is ``(H, total_q)``.
        max_seqlen_k is a hint (it may be None with a PagedKVCache); max_seqlen_q sizes the grid
        and must bound every query length (checked on NumPy and with ``check=True``).

    Returns ``out (total_q, H, D)`` (plus the LSE as requested).

    Example (two sequences of 3 and 5 tokens, paged cache of 16-row pages)::

        cu_q = cp.asarray([0, 3, 8], dtype=cp.int32)
        cu_k = cp.asarray([0, 40, 45], dtype=cp.int32)            # key lengths 40 and 5
        table = cp.asarray([[7, 2, 9], [4, 0, 0]], dtype=cp.int32)  # pages of each sequence
        out = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 5, 40,
                                     causal=True, block_table=table)
    """
    if isinstance(k, PagedKVCache):
        return _varlen_from_cache(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
            page_block_size, seqused_k, seq_ids,
            dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
            mm_prefix_ranges=mm_prefix_ranges,
            deterministic=deterministic, return_attn_probs=return_attn_probs,
            return_softmax_lse=return_softmax_lse, out=out, check=check,
            k_scale=k_scale, v_scale=v_scale, kv_cache_dtype=kv_cache_dtype,
        )
    key = signature((q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
                    sinks, mm_prefix_ranges, out),
                    (max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                     softcap, return_attn_probs, page_block_size, return_softmax_lse, check,
                     _default_check(), k_scale, v_scale, kv_cache_dtype))
    call = CALLS.get(key) if key is not None else None
    if call is None:
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, sinks, mm_prefix_ranges, out = (
            adopt(a) for a in (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                               alibi_slopes, sinks, mm_prefix_ranges, out))
        call = _prepare_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, mm_prefix_ranges,
            return_attn_probs,
            block_table, page_block_size, seqused_k, return_softmax_lse, out, check,
            k_scale, v_scale, kv_cache_dtype)
        if key is not None:
            CALLS.put(key, call)
    return call.execute(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                        alibi_slopes, sinks, mm_prefix_ranges, out, k_scale, v_scale)


def _prepare_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    softmax_scale, causal, window_size, softcap, alibi_slopes, sinks,
                    mm_prefix_ranges, return_attn_probs,
                    block_table, page_block_size, seqused_k, return_softmax_lse, out,
                    check, k_scale=None, v_scale=None, kv_cache_dtype=None) -> VarlenCall:
    """Every check of flash_attn_varlen_func (value checks only with ``check``/on NumPy),
    lowered to a VarlenCall."""
    xp, q, k, v, fp8 = _common_checks(q, k, v, dropout_p, softmax_scale, window_size, softcap,
                                      k_scale, v_scale, kv_cache_dtype=kv_cache_dtype)
    full = _full_check(xp, check)
    validate.rank("q", q, 3, "varlen (total_q, nheads, headdim)")
    paged = block_table is not None
    if paged:
        validate.paged_kv(k, v)
    else:
        validate.rank("k", k, 3, "varlen (total_k, nheads_k, headdim)")
        validate.rank("v", v, 3, "varlen (total_k, nheads_k, headdim)")
        if page_block_size is not None:
            raise explain(
                ArgumentError, "page_block_size", "is only meaningful with a paged cache",
                "block_table together with page_block_size", "page_block_size without block_table",
                "pass block_table (and k/v as (num_blocks, page_block_size, Hk, D)) or drop page_block_size",
            )
    validate.head_dims(q, k, v)
    validate.kv_same_shape(k, v)
    H, D, Hk = int(q.shape[1]), int(q.shape[2]), int(k.shape[-2])
    validate.heads(H, Hk)
    validate.max_seqlen("max_seqlen_q", max_seqlen_q)
    validate.max_seqlen("max_seqlen_k", max_seqlen_k)
    validate.cu_seqlens("cu_seqlens_q", cu_seqlens_q, xp, q.shape[0], full)
    B = int(cu_seqlens_q.shape[0]) - 1
    validate.cu_seqlens("cu_seqlens_k", cu_seqlens_k, xp, None if paged else k.shape[0], full)
    validate.batch_matches("cu_seqlens_k", cu_seqlens_k, B + 1, "cu_seqlens_q")
    if seqused_k is not None:
        validate.index_array("seqused_k", seqused_k, xp, 1, length=B)
    P = 0
    if paged:
        P = validate.page_block_size(page_block_size, k)
        validate.block_table(block_table, xp, B)
    if full:
        validate.varlen_values(max_seqlen_q, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                               P, int(k.shape[0]))
    left, right = _mask(causal, window_size)
    _check_output(xp, q, out, tuple(q.shape))
    fields = dict(
        batch_size=B, seqlen_q=0, seqlen_k=0, max_seqlen_q=int(max_seqlen_q),
        max_seqlen_k=int(max_seqlen_k), page_block_size=P,
        **_logits(xp, softmax_scale, D, left, right, softcap, alibi_slopes, sinks,
        mm_prefix_ranges, B, H, full), **_kv_scales(fp8, k_scale, v_scale, Hk, xp, k),
    )
    key_rows = int(k.shape[0]) * (P if paged else 1)
    return VarlenCall(xp, fields, H, D, return_softmax_lse, return_attn_probs,
                      query_rows=int(q.shape[0]), key_rows=key_rows)


def _refuse_what_the_cache_supplies(passed_as: str, **given) -> None:
    """A PagedKVCache supplies its values, lengths, tables and layout itself; an argument
    given beside it could only disagree with the cache, so it is refused by name."""
    for name, value in given.items():
        if value is not None:
            raise explain(
                ArgumentError, name, f"is read from the PagedKVCache passed as {passed_as}",
                "None", type(value).__name__, f"drop {name}; the cache supplies it",
            )


def _varlen_from_cache(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                       page_block_size, seqused_k, seq_ids, **rest):
    """flash_attn_varlen_func with a PagedKVCache in place of k: keys, lengths, page size and
    block table all come from the cache, so none of them can disagree with it."""
    cache = k
    _refuse_what_the_cache_supplies("k", v=v, cu_seqlens_k=cu_seqlens_k, block_table=block_table,
                                    seqused_k=seqused_k, k_scale=rest.pop("k_scale", None),
                                    v_scale=rest.pop("v_scale", None),
                                    kv_cache_dtype=rest.pop("kv_cache_dtype", None))
    validate.page_block_size(page_block_size, cache.k_pages)
    seqs = cache._sequences(list(cache.seq_ids) if seq_ids is None else list(seq_ids))
    # One upload of the table and cu_seqlens_k (summed on the host; [0] for no sequence).
    table, cu_k = cache._varlen_tables(seqs)
    capacity = int(table.shape[1]) * cache.page_block_size
    return flash_attn_varlen_func(
        q, cache.k_pages, cache.v_pages, cu_seqlens_q, cu_k, max_seqlen_q,
        capacity if max_seqlen_k is None else max_seqlen_k, block_table=table,
        k_scale=cache.k_scale, v_scale=cache.v_scale, kv_cache_dtype=cache._kv_cache_dtype, **rest,
    )


# -- KV cache (decode) ----------------------------------------------------------------------


@_with_semantics
def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    page_block_size=None,
    seq_ids=None,
    out=None,
    check=None,
    sinks=None,
    mm_prefix_ranges=None,
    k_scale=None,
    v_scale=None,
    kv_cache_dtype=None,
):
    """Attention of a few new query tokens per sequence against a KV cache, appending the new
    keys/values into the cache in place first (flash-attn's decode entry point).

    Arguments:
        q: ``(B, Sq, H, D)``.
        k_cache, v_cache: ``(B_cache, S_cache, Hk, D)``, or paged
            ``(num_blocks, page_block_size, Hk, D)`` with ``block_table``; or a
            :class:`PagedKVCache` as ``k_cache`` with ``v_cache=None`` (then ``seq_ids`` picks
            its sequences and ``cache_seqlens``/``block_table`` come from it).
        k, v: optional new keys/values ``(B, S_new, Hk, D)``, written at positions
            ``cache_seqlens[b] ...`` (after rotary on k) before attention.
        rotary_cos, rotary_sin: ``(seqlen_ro, rotary_dim / 2)``; rotate q and the new k at their
            absolute cache positions (q: ``cache_seqlens[b] + i`` when causal/local, else
            ``cache_seqlens[b]``).  ``rotary_interleaved`` pairs dims (0,1),(2,3)... when True,
            (i, i + rotary_dim/2) when False.  ``seqlen_ro`` must cover the cache's capacity
            (``k_cache.shape[1]``, or ``block_table.shape[1] * page_block_size``), as in
            flash-attn; with a PagedKVCache, the longest sequence after the append.
        cache_seqlens: int or int32 ``(B,)``: current cache lengths (before appending).
        cache_batch_idx: int32 ``(B,)``: which cache row each sequence uses (contiguous cache).
        cache_leftpad: int32 ``(B,)``: keys start at this cache index (contiguous cache).
        block_table: int32 ``(B, max_blocks_per_seq)`` for a paged cache.
        num_splits: split-KV factor (0 = automatic); a hint to the CUDA backend.
        Other arguments as :func:`flash_attn_func`; the LSE is ``(B, H, Sq)``.

        seq_ids: with a PagedKVCache as ``k_cache``: which of its sequences, in batch order.
        k_scale, v_scale, kv_cache_dtype: a float8 cache's scales and format
            (:func:`flash_attn_func`); the new k / v (in q's dtype) are appended as
            ``fp8(clip(k / k_scale))``, saturating at the format's largest value.  A float8
            PagedKVCache supplies its own.

    The keys of sequence b are cache positions ``[cache_leftpad[b], cache_seqlens[b] + S_new)``;
    the Sq queries are the last Sq of them for the mask (usually Sq == S_new: each new token
    attends to the cache and to the new tokens before it when causal).  The LSE is
    ``(B, H, Sq)``.  ``num_splits`` is honoured by the CUDA decode kernel (split-KV); the CPU
    backend ignores it.

    Returns ``out (B, Sq, H, D)`` (and the LSE with ``return_softmax_lse``).  Like flash-attn,
    ``cache_seqlens`` itself is not updated; a PagedKVCache updates its own lengths.

    Example (one decode step of 64 sequences against a paged cache)::

        out = flash_attn_with_kvcache(q, k_pages, v_pages, k=k_new, v=v_new,
                                      cache_seqlens=lens, block_table=table, causal=True)
        lens += 1
    """
    if isinstance(k_cache, PagedKVCache):
        return _kvcache_from_cache(
            k_cache, q, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
            rotary_interleaved, alibi_slopes, sinks, mm_prefix_ranges, num_splits,
            return_softmax_lse, page_block_size,
            seq_ids, out, check, k_scale, v_scale, kv_cache_dtype,
        )
    return _with_kvcache_arrays(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, sinks, mm_prefix_ranges, num_splits,
        return_softmax_lse, page_block_size, out,
        check, k_scale=k_scale, v_scale=v_scale, kv_cache_dtype=kv_cache_dtype)


def _with_kvcache_arrays(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                         window_size, softcap, rotary_interleaved, alibi_slopes, sinks,
                         mm_prefix_ranges, num_splits,
                         return_softmax_lse, page_block_size, out, check,
                         cache_names=("k_cache", "v_cache"), rotary_covers_capacity=True,
                         k_scale=None, v_scale=None, kv_cache_dtype=None):
    """flash_attn_with_kvcache on arrays: the call cache, else full validation first.
    ``cache_names``: how errors name the caches (a PagedKVCache's pools).
    ``rotary_covers_capacity``: see _prepare_kvcache."""
    # cache_seqlens: an int is part of the signature's scalars, an array of its arrays.
    lens_int = cache_seqlens if isinstance(cache_seqlens, (int, np.integer)) else None
    lens_array = None if lens_int is not None else cache_seqlens
    key = signature(
        (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lens_array, cache_batch_idx,
         cache_leftpad, block_table, alibi_slopes, sinks, mm_prefix_ranges, out),
        (lens_int, softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits,
         return_softmax_lse, page_block_size, check, _default_check(), rotary_covers_capacity,
         k_scale, v_scale, kv_cache_dtype),
    )
    call = CALLS.get(key) if key is not None else None
    if call is None:
        arrays = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lens_array, cache_batch_idx,
                  cache_leftpad, block_table, alibi_slopes, sinks, mm_prefix_ranges, out)
        (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lens_array, cache_batch_idx,
         cache_leftpad, block_table, alibi_slopes, sinks, mm_prefix_ranges,
         out) = (adopt(a) for a in arrays)
        call = _prepare_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
            lens_int if lens_int is not None else lens_array, cache_batch_idx, cache_leftpad,
            block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
            alibi_slopes, sinks, mm_prefix_ranges, num_splits, return_softmax_lse,
            page_block_size, out, check,
            cache_names=cache_names, rotary_covers_capacity=rotary_covers_capacity,
            k_scale=k_scale, v_scale=v_scale, kv_cache_dtype=kv_cache_dtype,
        )
        if key is not None:
            CALLS.put(key, call)
    return call.execute(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lens_array,
                        cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sinks,
                        mm_prefix_ranges, out, k_scale, v_scale)


def _prepare_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                     window_size, softcap, rotary_interleaved, alibi_slopes, sinks,
                     mm_prefix_ranges, num_splits,
                     return_softmax_lse, page_block_size, out, check,
                     cache_names=("k_cache", "v_cache"),
                     rotary_covers_capacity=True, k_scale=None, v_scale=None,
                     kv_cache_dtype=None) -> KVCacheCall:
    """Every check of flash_attn_with_kvcache -- the new k/v, rotary tables, ALiBi slopes and
    ``out`` included -- BEFORE anything is appended: a call that raises leaves the cache as it
    was.  Lowered to a KVCacheCall, whose execute() appends and attends.

    ``rotary_covers_capacity``: the rotary tables must have a row for every position of the
    cache (flash-attn's rule, "cos/sin seqlen must be at least the seqlen of KV cache"): a
    shape check, so it holds on the GPU without reading cache_seqlens.  A PagedKVCache passes
    False and checks its host-side lengths instead -- its capacity is a private bucket."""
    xp, q, k_cache, v_cache, fp8 = _common_checks(q, k_cache, v_cache, 0.0, softmax_scale,
                                                  window_size, softcap, k_scale, v_scale,
                                                  kv_names=cache_names,
                                                  kv_cache_dtype=kv_cache_dtype)
    validate.num_splits(num_splits)
    full = _full_check(xp, check)
    validate.rank("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    B, Sq, H, D = (int(s) for s in q.shape)
    paged = block_table is not None
    if paged:
        validate.paged_kv(k_cache, v_cache, "k_cache", "v_cache")
    else:
        validate.rank("k_cache", k_cache, 4, "(batch_cache, seqlen_cache, nheads_k, headdim)")
    validate.head_dims(q, k_cache, v_cache)
    validate.kv_same_shape(k_cache, v_cache, "k_cache", "v_cache")
    Hk = int(k_cache.shape[2])
    validate.heads(H, Hk)
    if (k is None) != (v is None):
        raise explain(
            ArgumentError, "k" if k is None else "v", "new keys and values must be given together",
            "both k and v, or neither", "only one", "pass both k and v",
        )
    S_new = 0
    if k is not None:
        validate.same_backend(xp, k=k, v=v)
        validate.same_dtype("q", q, k=k, v=v)
        validate.rank("k", k, 4, "(batch, seqlen_new, nheads_k, headdim)")
        validate.kv_same_shape(k, v)
        validate.batch_matches("k", k, B)
        if tuple(k.shape[2:]) != (Hk, D):
            raise explain(
                validate.ShapeError, "k", "new keys must have the cache's (nheads_k, headdim)",
                (Hk, D), tuple(k.shape[2:]), "project new keys with the cache's head layout",
            )
        for name, a in zip(cache_names, (k_cache, v_cache)):
            validate.writable(name, a, f"make {name} writeable ({name}.flags.writeable = True, "
                                       "or copy it): the new k/v are appended into it in place; "
                                       "or call without k/v")
        S_new = int(k.shape[1])
    if rotary_cos is not None and k is None:
        raise explain(
            ArgumentError, "rotary_cos", "rotary embedding needs the new keys it rotates",
            "k and v with rotary_cos/rotary_sin", "rotary tables without k",
            "pass the new k and v, or rotate q yourself",
        )

    # cache geometry
    if paged:
        P = validate.page_block_size(page_block_size, k_cache, cache_names[0])
        validate.block_table(block_table, xp, B)
        capacity = int(block_table.shape[1]) * P
        for name, given in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            if given is not None:
                raise explain(
                    UnsupportedError, name, "is not supported with a paged cache (as in flash-attn)",
                    "None with block_table", "an array", "point the block table at the right pages instead",
                )
    else:
        if page_block_size is not None:
            raise explain(
                ArgumentError, "page_block_size", "is only meaningful with a paged cache",
                "block_table together with page_block_size", "page_block_size without block_table",
                "pass block_table (and a cache of shape (num_blocks, page_block_size, Hk, D)) or "
                "drop page_block_size",
            )
        P = 0
        capacity = int(k_cache.shape[1])
        if cache_batch_idx is None:
            validate.batch_matches("k_cache", k_cache, B)
        else:
            validate.index_array("cache_batch_idx", cache_batch_idx, xp, 1, length=B)
        if cache_leftpad is not None:
            validate.index_array("cache_leftpad", cache_leftpad, xp, 1, length=B)
    seqlens = _cache_seqlens(cache_seqlens, xp, B, capacity)
    validate.rotary(rotary_cos, rotary_sin, xp, D,
                    capacity if rotary_covers_capacity and rotary_cos is not None else None)
    left, right = _mask(causal, window_size)
    _check_output(xp, q, out, (B * Sq, H, D))
    logits = _logits(xp, softmax_scale, D, left, right, softcap, alibi_slopes, sinks,
                     mm_prefix_ranges, B, H, full)

    if full:
        validate.kvcache_values(seqlens, S_new, capacity, rotary_cos, cache_batch_idx,
                                cache_leftpad, block_table if paged else None, P,
                                int(k_cache.shape[0]))

    fields = dict(
        batch_size=B, seqlen_q=Sq, seqlen_k=capacity, max_seqlen_q=Sq, max_seqlen_k=capacity,
        page_block_size=P, seqused_k_add=S_new, num_splits=int(num_splits), **logits,
        **_kv_scales(fp8, k_scale, v_scale, Hk, xp, k_cache),
    )
    return KVCacheCall(
        xp, fields, H, D, return_softmax_lse, q_shape=tuple(q.shape),
        k_cache_rows=None if paged else (int(k_cache.shape[0]) * int(k_cache.shape[1]), Hk, D),
        key_rows=int(k_cache.shape[0]) * int(k_cache.shape[1]), paged=paged,
        seqlens=None if seqlens is cache_seqlens else seqlens,
        rotary_interleaved=rotary_interleaved, q_per_token=causal or left >= 0 or right >= 0,
    )


def _cache_seqlens(cache_seqlens, xp, batch, capacity):
    """cache_seqlens as an int32 (B,) array on q's device (an int is broadcast; None = full)."""
    if cache_seqlens is None:
        return xp.full((batch,), capacity, dtype=np.int32)
    if isinstance(cache_seqlens, (int, np.integer)):
        if isinstance(cache_seqlens, bool) or not 0 <= int(cache_seqlens) <= capacity:
            raise explain(
                SeqlenError, "cache_seqlens", "is outside the cache", f"0 <= cache_seqlens <= {capacity}",
                repr(cache_seqlens), "pass the number of tokens already in the cache",
            )
        return xp.full((batch,), int(cache_seqlens), dtype=np.int32)
    validate.index_array("cache_seqlens", cache_seqlens, xp, 1, length=batch)
    return cache_seqlens


def _kvcache_from_cache(cache, q, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                        cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                        window_size, softcap, rotary_interleaved, alibi_slopes, sinks,
                        mm_prefix_ranges, num_splits,
                        return_softmax_lse, page_block_size, seq_ids, out, check,
                        k_scale=None, v_scale=None, kv_cache_dtype=None):
    """flash_attn_with_kvcache on a PagedKVCache: reserve pages for the new tokens
    (CacheExhaustedError before anything changes), then run the ordinary paged call -- fully
    validated before it writes, and served from the call cache when repeated -- over one upload
    of the table and the lengths before the append.  If that call raises, the pages go back and
    the lengths do not move: a call that raises leaves the cache exactly as it was."""
    _refuse_what_the_cache_supplies("k_cache", v_cache=v_cache, cache_seqlens=cache_seqlens,
                                    block_table=block_table, cache_batch_idx=cache_batch_idx,
                                    cache_leftpad=cache_leftpad, k_scale=k_scale,
                                    v_scale=v_scale, kv_cache_dtype=kv_cache_dtype)
    validate.page_block_size(page_block_size, cache.k_pages)
    seq_ids = list(cache.seq_ids) if seq_ids is None else list(seq_ids)
    q, k, v, rotary_cos, rotary_sin, alibi_slopes, sinks, mm_prefix_ranges, out = (
        adopt(a) for a in (q, k, v, rotary_cos, rotary_sin, alibi_slopes, sinks,
        mm_prefix_ranges, out))
    validate.same_library(q=q, k_cache=cache.k_pages)
    validate.rank("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    B = int(q.shape[0])
    if len(seq_ids) != B:
        raise explain(
            validate.ShapeError, "seq_ids", "must name one cache sequence per batch entry of q",
            f"{B} ids", f"{len(seq_ids)} ids", "pass seq_ids=[...] with q.shape[0] entries",
        )
    seqs = cache._sequences(seq_ids)  # rejects unknown or repeated ids
    # Pages for the new tokens first (CacheExhaustedError before anything changes), so that
    # the step below is an ordinary paged flash_attn_with_kvcache call -- validated in full
    # before it writes, then served from the call cache like any other -- over one upload of
    # the table and the lengths before the append.  If that call raises, the pages go back.
    if k is not None:
        validate.rank("k", k, 4, "(batch, seqlen_new, nheads_k, headdim)")
    new_tokens = np.full(B, 0 if k is None else int(k.shape[1]), dtype=np.int64)
    if rotary_cos is not None and hasattr(rotary_cos, "shape"):
        # The lengths are on the host: the tables must reach the last new position.
        validate.rotary_covers(rotary_cos, max((s.length + int(n) for s, n in
                                                zip(seqs, new_tokens)), default=0))
    with cache._growing(seqs, new_tokens):
        table, before = cache._step_tables(seqs)
        return _with_kvcache_arrays(
            q, cache.k_pages, cache.v_pages, k, v, rotary_cos, rotary_sin, before, None, None,
            table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes,
            sinks, mm_prefix_ranges,
            num_splits, return_softmax_lse, None, out, check,
            cache_names=("cache.k_pages", "cache.v_pages"), rotary_covers_capacity=False,
            k_scale=cache.k_scale, v_scale=cache.v_scale, kv_cache_dtype=cache._kv_cache_dtype)
