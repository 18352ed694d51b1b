"""Numba CPU backend: FlashAttention's forward pass on NumPy arrays.

Algorithm
---------
This is FlashAttention-2's forward pass, not "gather the keys, then matmul".  One work item is
one (sequence ``bidb``, query head ``bidh``, tile ``m_block`` of ``BLOCK_M`` query rows); the
work items are independent and spread over CPU threads with ``prange``.  A work item never
builds the ``len_q x len_k`` score matrix: it walks its sequence's keys in blocks of ``BLOCK_N``
(``n_block``), through the block table when the KV cache is paged, and keeps for each query
row ``i`` the online-softmax state::

    m_i = max_j s_ij                       running maximum of the logits seen so far
    l_i = sum_j exp(s_ij - m_i)            running denominator, relative to m_i
    o_i = sum_j exp(s_ij - m_i) * v_j      running unnormalized output, relative to m_i

When a key block raises the maximum from ``m_old`` to ``m_new``, ``l_i`` and ``o_i`` are first
rescaled by ``exp(m_old - m_new)``, then the block's terms are added.  After the last block
``out_i = o_i / l_i`` and ``lse_i = m_i + log(l_i)`` (natural log).  A row that saw no visible
key keeps ``m_i = -inf, l_i = 0`` and outputs exactly 0 with ``lse_i = +inf``.  A row with a
NaN logit among its visible keys (NaN q or k, a NaN ALiBi slope) or a +inf one (an inf in k)
outputs NaN with ``lse_i = NaN``, as a plain softmax does; a NaN in v reaches the output columns
of the rows that give its key a nonzero weight.

Logits and masks follow :mod:`cupy_flashattn.problem`: ``s = scale * q.k``;
``s = softcap * tanh(s / softcap)`` if softcap > 0; ``s -= slope[b, h] * |i + shift - j|`` with
ALiBi; with ``shift = len_k - len_q`` (bottom-right alignment), key ``j`` is visible to query
``i`` iff ``i + shift - window_left <= j <= i + shift + window_right`` (a negative window side is
unlimited).  A key whose page id lies outside ``[0, num_blocks)`` is treated as absent.

Sequence ranges (``q_start, len_q, k_start, len_k``) are resolved for all sequences at once by
:func:`resolve_sequences`, a vectorized twin of :func:`cupy_flashattn.problem.resolve_sequence`
with the identical clamping, so the kernel can never index outside the arrays it is given.

dtype policy
------------
float64 inputs are computed in float64.  float32, float16 and bfloat16 inputs are computed in
float32: Numba has no float16/bfloat16 arithmetic, so 16-bit q/k/v are converted to float32
arrays once per call before entering the kernel (for a paged cache only the pages the call
reads, see :func:`paged_operands`, so a decode step never pays for the whole pool), and the
float32 result is rounded into ``problem.out`` at the end.  The kernel therefore has exactly
two compiled signatures (float32 and float64), one kernel serving contiguous and paged caches;
it compiles lazily on first use (never at import) and is cached on disk (``cache=True``).
``softmax_lse`` is float32 (float64 for float64 inputs, computed in float64).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import ml_dtypes
import numpy as np
from numba import njit, prange

from . import _rules
from .errors import DTypeError, ShapeError, explain
from .problem import AttentionProblem

__all__ = ["run_attention", "resolve_sequences", "SequenceRanges", "BLOCK_M", "BLOCK_N"]

# Query rows per work item: a q tile of BLOCK_M rows reuses every key block it loads BLOCK_M
# times, while keeping enough work items to fill the threads for decode-sized batches.
BLOCK_M = 16
# Keys per block: a (BLOCK_M, BLOCK_N) score tile plus a transposed (D, BLOCK_N) key tile stay
# in L1/L2 for D <= 256.
BLOCK_N = 64

_COMPUTE_DTYPE = {
    np.dtype(np.float64): np.dtype(np.float64),
    np.dtype(np.float32): np.dtype(np.float32),
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(ml_dtypes.bfloat16): np.dtype(np.float32),
}


# --------------------------------------------------------------------------------------------
# Sequence resolution (host side, vectorized over the batch)
# --------------------------------------------------------------------------------------------


class SequenceRanges(NamedTuple):
    """Resolved, clamped per-sequence ranges; every field is int64 of shape (batch_size,)."""

    q_start: np.ndarray  # first row of sequence b in q / out
    len_q: np.ndarray  # its number of query rows
    k_start: np.ndarray  # first row in the flat (k_rows, Hk, D) k/v; 0 when paged
    len_k: np.ndarray  # its number of keys (logical positions 0 .. len_k-1)


def _per_sequence(array, name: str, length: int) -> np.ndarray:
    """The first ``length`` entries of an index array as a fresh int64 array."""
    values = np.asarray(array).reshape(-1)
    if values.shape[0] < length:
        raise explain(
            ShapeError,
            name,
            "too few entries for the batch",
            f"at least {length}",
            values.shape[0],
            "pass one entry per sequence (cu_seqlens_*: batch_size + 1)",
        )
    return values[:length].astype(np.int64)


def resolve_sequences(problem: AttentionProblem) -> SequenceRanges:
    """``(q_start, len_q, k_start, len_k)`` of every sequence, with exactly the rules and clamps
    of :func:`cupy_flashattn.problem.resolve_sequence`, computed for all ``b`` at once."""
    p = problem
    batch = p.batch_size
    bidb = np.arange(batch, dtype=np.int64)

    # Queries: cu_seqlens_q, or the dense layout b * seqlen_q.
    if p.cu_seqlens_q is not None:
        cu_q = _per_sequence(p.cu_seqlens_q, "cu_seqlens_q", batch + 1)
        q_start, len_q = cu_q[:-1], cu_q[1:] - cu_q[:-1]
    else:
        q_start = bidb * p.seqlen_q
        len_q = np.full(batch, p.seqlen_q, dtype=np.int64)
    total_q = p.total_q
    q_start = np.clip(q_start, 0, total_q)
    len_q = np.minimum(np.maximum(len_q, 0), total_q - q_start)

    # Keys: cu_seqlens_k, or cache row (cache_batch_idx[b] or b) * seqlen_k; then seqused_k
    # overrides the length and leftpad_k moves the start right and shortens the length.
    if p.cu_seqlens_k is not None:
        cu_k = _per_sequence(p.cu_seqlens_k, "cu_seqlens_k", batch + 1)
        k_start, len_k = cu_k[:-1], cu_k[1:] - cu_k[:-1]
    else:
        cache_row = bidb
        if p.cache_batch_idx is not None:
            cache_row = _per_sequence(p.cache_batch_idx, "cache_batch_idx", batch)
        k_start = cache_row * p.seqlen_k
        len_k = np.full(batch, p.seqlen_k, dtype=np.int64)
    if p.seqused_k is not None:
        len_k = _per_sequence(p.seqused_k, "seqused_k", batch) + p.seqused_k_add
    if p.leftpad_k is not None:
        leftpad = _per_sequence(p.leftpad_k, "leftpad_k", batch)
        k_start = k_start + leftpad
        len_k = len_k - leftpad

    # Clamp to the arrays the kernel is given: the block table's capacity when paged (positions
    # are mapped through the table, k_start is unused), else the rows of the flat k.
    if p.paged:
        k_start = np.zeros(batch, dtype=np.int64)
        capacity = np.int64(p.block_table.shape[1]) * p.page_block_size
    else:
        k_rows = p.k.shape[0]
        k_start = np.clip(k_start, 0, k_rows)
        capacity = k_rows - k_start
    len_k = np.minimum(np.maximum(len_k, 0), capacity)
    return SequenceRanges(q_start, len_q, k_start, np.asarray(len_k, dtype=np.int64))


# --------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------


# The shared rules (_rules.py), compiled for the kernel below.
_visible_key_range = njit(cache=True)(_rules.visible_key_range)
_key_visible = njit(cache=True)(_rules.key_visible)
_logit = njit(cache=True, error_model="numpy")(_rules.logit)
_page_and_row = njit(cache=True)(_rules.page_and_row)
_prefix_range_of = njit(cache=True)(_rules.prefix_range_of)


@njit(cache=True, fastmath=False, error_model="numpy")
def _attend_query_tile(
    q, k, v, out, softmax_lse,
    bidb, bidh, m_start, q_start, seqlen_q, k_start, seqlen_k,
    block_table, page_block_size, num_pages, paged,
    softmax_scale, window_left, window_right, softcap, alibi_slopes, has_alibi, sinks, has_sinks,
    ranges, has_ranges,
):  # fmt: skip
    """Online-softmax attention of query rows ``m_start .. m_start + BLOCK_M - 1`` of sequence
    ``bidb``, head ``bidh``; writes their ``out`` rows and ``softmax_lse`` entries."""
    head_dim = q.shape[2]
    bidh_k = bidh // (q.shape[1] // k.shape[1])  # GQA/MQA: the kv head this query head reads
    m_rows = min(BLOCK_M, seqlen_q - m_start)
    shift = seqlen_k - seqlen_q  # bottom-right alignment: query i sits at key position i + shift
    slope = alibi_slopes[bidb, bidh] if has_alibi else 0.0

    # Keys any row of this tile may see: [n_lo, n_hi).  Rows further down see further right.
    n_lo, n_hi = _visible_key_range(m_start + shift, m_start + m_rows - 1 + shift, seqlen_k,
                                    window_left, window_right)
    # Prefix ranges: each row's range (if its diagonal lies in one) widens the keys to visit.
    # Row m also sees keys row_rs[m] <= j < row_re[m] (only read when has_ranges).
    row_rs = np.zeros(BLOCK_M if has_ranges else 1, dtype=np.int64)
    row_re = np.zeros(BLOCK_M if has_ranges else 1, dtype=np.int64)
    if has_ranges:
        if n_hi <= n_lo:
            n_lo, n_hi = seqlen_k, 0
        for m in range(m_rows):
            rs, re = _prefix_range_of(m_start + m + shift, ranges, bidb)
            rs, re = max(rs, 0), min(re, seqlen_k)
            if re > rs:
                row_rs[m], row_re[m] = rs, re
                n_lo, n_hi = min(n_lo, rs), max(n_hi, re)

    q_tile = np.empty((BLOCK_M, head_dim), dtype=q.dtype)
    for m in range(m_rows):
        q_tile[m, :] = q[q_start + m_start + m, bidh, :]
    k_tile_t = np.empty((head_dim, BLOCK_N), dtype=q.dtype)  # keys transposed: (d, n)
    key_row = np.empty(BLOCK_N, dtype=np.int64)  # flat k/v row of each key, -1 if absent
    scores = np.empty((BLOCK_M, BLOCK_N), dtype=q.dtype)  # logits, then probabilities
    acc_o = np.zeros((BLOCK_M, head_dim), dtype=q.dtype)  # o_i
    row_max = np.full(BLOCK_M, -np.inf, dtype=q.dtype)  # m_i
    row_sum = np.zeros(BLOCK_M, dtype=q.dtype)  # l_i
    row_nan = np.zeros(BLOCK_M, dtype=np.bool_)  # a visible logit was NaN: out and lse NaN

    for n_start in range(n_lo, n_hi, BLOCK_N):
        n_count = min(BLOCK_N, n_hi - n_start)

        # Where each key of the block lives: page block_table[b, j // P], row j % P when paged.
        for n in range(n_count):
            key_pos = n_start + n
            if paged:
                column, row_in_page = _page_and_row(key_pos, page_block_size)
                page = block_table[bidb, column]
                if page < 0 or page >= num_pages:
                    key_row[n] = -1  # out-of-range page id: the key is absent, never read
                else:
                    key_row[n] = page * page_block_size + row_in_page
            else:
                key_row[n] = k_start + key_pos

        # K tile transposed, so that the score loop below runs over contiguous n: each score is
        # its own accumulator and the loop vectorizes without reassociating any sum.
        for n in range(n_count):
            row = key_row[n]
            if row >= 0:
                for d in range(head_dim):
                    k_tile_t[d, n] = k[row, bidh_k, d]
            else:
                for d in range(head_dim):
                    k_tile_t[d, n] = 0.0

        # S = Q K^T for the tile.
        for m in range(m_rows):
            for n in range(n_count):
                scores[m, n] = 0.0
            for d in range(head_dim):
                q_md = q_tile[m, d]
                for n in range(n_count):
                    scores[m, n] += q_md * k_tile_t[d, n]

        # Logits: scale, softcap, ALiBi; then mask invisible keys to -inf.
        for m in range(m_rows):
            diag = m_start + m + shift  # key position aligned with this query row
            # This row's prefix range (empty without ranges: range_start = range_end = 0).
            range_start = row_rs[m] if has_ranges else 0
            range_end = row_re[m] if has_ranges else 0
            for n in range(n_count):
                key_pos = n_start + n
                if key_row[n] < 0 or not _key_visible(key_pos, diag, window_left, window_right):
                    # Outside the window: still visible inside the row's prefix range.
                    if key_row[n] < 0 or not range_start <= key_pos < range_end:
                        scores[m, n] = -np.inf
                        continue
                scores[m, n] = _logit(scores[m, n], softmax_scale, softcap, slope,
                                      abs(diag - key_pos))

        # Online softmax update, row by row.  The max skips NaN logits (NaN q or k, a NaN
        # slope, inf * 0) and flags the row instead: it outputs NaN, never the empty marker.
        for m in range(m_rows):
            block_max = -np.inf
            for n in range(n_count):
                s = scores[m, n]
                if s > block_max:
                    block_max = s
                elif s != s:
                    row_nan[m] = True
            new_max = row_max[m] if row_max[m] >= block_max else block_max
            if new_max == -np.inf:
                continue  # nothing visible to this row yet: state stays (m=-inf, l=0, o=0)
            # exp(m_old - m_new) rescales the old terms; it is 0 on the first visible block.
            correction = np.exp(row_max[m] - new_max)
            block_sum = 0.0
            for n in range(n_count):
                p = np.exp(scores[m, n] - new_max)  # masked keys: exp(-inf) = 0
                scores[m, n] = p
                block_sum += p
            row_sum[m] = row_sum[m] * correction + block_sum
            row_max[m] = new_max
            for d in range(head_dim):
                acc_o[m, d] *= correction
            # O += P V, over contiguous d.
            for n in range(n_count):
                p = scores[m, n]
                row = key_row[n]
                if p == 0.0 or row < 0:
                    continue
                for d in range(head_dim):
                    acc_o[m, d] += p * v[row, bidh_k, d]

    # Sinks: the sink logit joins the finished state (m, l) as one more term of weight
    # exp(sink - m') with no value vector, m' = max(m, sink): l' = l exp(m - m') + exp(sink - m'),
    # out = o exp(m - m') / l', lse = m' + log(l').  A row that saw no key then gives 0 and the
    # sink as its LSE; a NaN sink makes l' (so out and lse) NaN.
    if has_sinks:
        sink = sinks[bidh]
        for m in range(m_rows):
            if row_nan[m] or not (row_sum[m] == row_sum[m]):
                continue
            top = sink if sink > row_max[m] else row_max[m]
            w = np.exp(row_max[m] - top) if row_sum[m] > 0.0 else 0.0
            row_sum[m] = row_sum[m] * w + np.exp(sink - top)
            row_max[m] = top
            for d in range(head_dim):
                acc_o[m, d] *= w
    # Epilogue: out = o / l, lse = m + log(l); rows that saw no key (l == 0 exactly) give 0 and
    # +inf; rows with a NaN logit, or a +inf one (then l = exp(inf - inf) = NaN), give NaN.
    for m in range(m_rows):
        row_q = q_start + m_start + m
        if row_nan[m] or not (row_sum[m] == row_sum[m]):
            for d in range(head_dim):
                out[row_q, bidh, d] = np.nan
            softmax_lse[bidh, row_q] = np.nan
        elif row_sum[m] > 0.0:
            inv_sum = 1.0 / row_sum[m]
            for d in range(head_dim):
                out[row_q, bidh, d] = acc_o[m, d] * inv_sum
            softmax_lse[bidh, row_q] = row_max[m] + np.log(row_sum[m])
        else:
            for d in range(head_dim):
                out[row_q, bidh, d] = 0.0
            softmax_lse[bidh, row_q] = np.inf


@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def _flash_fwd_kernel(
    q, k, v, out, softmax_lse,
    q_start, len_q, k_start, len_k, num_m_blocks,
    block_table, page_block_size, num_pages, paged,
    softmax_scale, window_left, window_right, softcap, alibi_slopes, has_alibi, sinks, has_sinks,
    ranges, has_ranges,
):  # fmt: skip
    """All (bidb, bidh, m_block) work items in parallel.

    q, out: (total_q, H, D); k, v: (k_rows, Hk, D), for a paged cache the pool seen as
    (num_pages * P, Hk, D); softmax_lse: float32 (H, total_q).  Rows of out/softmax_lse that no
    sequence covers are left untouched.
    """
    batch_size = len_q.shape[0]
    num_heads = q.shape[1]
    items_per_seq = num_heads * num_m_blocks
    for item in prange(batch_size * items_per_seq):
        bidb = item // items_per_seq
        bidh = (item // num_m_blocks) % num_heads
        m_block = item % num_m_blocks
        m_start = m_block * BLOCK_M
        if m_start >= len_q[bidb]:
            continue  # this sequence is shorter than the longest one
        _attend_query_tile(
            q, k, v, out, softmax_lse,
            bidb, bidh, m_start, q_start[bidb], len_q[bidb], k_start[bidb], len_k[bidb],
            block_table, page_block_size, num_pages, paged,
            softmax_scale, window_left, window_right, softcap, alibi_slopes, has_alibi,
            sinks, has_sinks, ranges, has_ranges,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Host entry point
# --------------------------------------------------------------------------------------------


def _kernel_array(array, dtype) -> np.ndarray:
    """``array`` as a C-contiguous, writeable ``dtype`` array (no copy when it already is one),
    so that every call hits the same compiled signature."""
    result = np.ascontiguousarray(array, dtype=dtype)
    if not result.flags.writeable:
        result = result.copy()
    return result


def paged_operands(k_pages, v_pages, block_table, len_k, page_block_size: int, dtype):
    """The paged k/v as the kernel reads them: ``(k, v, block_table, num_pages)`` with k/v
    flat ``(num_pages * P, Hk, D)`` rows of ``dtype`` (page g, row r is row g * P + r).

    A pool already in ``dtype`` (C-contiguous, writeable) is passed as is, zero copy.  Otherwise
    (16-bit pools, which Numba computes in float32, or a strided pool) only the pages the call
    reads are gathered and converted: the distinct in-range ids of ``block_table[b, :ceil(len_k[b]
    / P)]``, in ascending order, and the table is remapped onto them (entries the kernel never
    reads, and ids outside the pool, become -1, i.e. absent).  A decode step therefore costs what
    its sequences hold, not what the pool holds.  ``len_k`` are the resolved (clamped) lengths.
    """
    num_blocks, rows_per_page, num_heads_k, head_dim = (int(s) for s in k_pages.shape)
    P = int(page_block_size)
    table = np.asarray(block_table)
    reusable = all(
        a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable for a in (k_pages, v_pages)
    )
    if reusable:
        rows = num_blocks * rows_per_page
        return (
            k_pages.reshape(rows, num_heads_k, head_dim),
            v_pages.reshape(rows, num_heads_k, head_dim),
            _kernel_array(table, np.int32),
            num_blocks,
        )
    batch = int(table.shape[0])
    used_cols = (np.asarray(len_k, dtype=np.int64)[:batch] + P - 1) // P
    width = min(int(used_cols.max(initial=0)), int(table.shape[1]))
    ids = table[:, :width].astype(np.int64)
    read = (np.arange(width)[None, :] < used_cols[:, None]) & (ids >= 0) & (ids < num_blocks)
    pages = np.unique(ids[read])  # sorted: the gathered pool keeps the pool's page order
    remapped = np.full((batch, max(width, 1)), -1, dtype=np.int32)
    remapped[:, :width][read] = np.searchsorted(pages, ids[read]).astype(np.int32)
    rows = pages.shape[0] * rows_per_page

    def gather(pool):
        return _kernel_array(pool[pages], dtype).reshape(rows, num_heads_k, head_dim)

    return gather(k_pages), gather(v_pages), remapped, int(pages.shape[0])


def run_attention(problem: AttentionProblem) -> None:
    """Fill ``problem.out`` and ``problem.softmax_lse`` in place (see the module docstring).

    ``problem`` holds NumPy arrays; q, k, v are float16, bfloat16, float32 or float64 (k and v
    may be float8 with ``k_scale`` / ``v_scale``, dequantized as they are read).  Rows of
    ``out`` / ``softmax_lse`` not covered by any sequence are set to 0 / +inf.  Zero-size
    problems are legal: no query row returns at once; k/v of no row (or a pool of no page) give
    every row 0 / +inf.
    """
    p = problem
    if p.kv_dtype is not None:  # float8 bytes (kv_cache_dtype): the same memory as float8
        p = dataclasses.replace(p, k=p.k.view(p.kv_dtype), v=p.v.view(p.kv_dtype), kv_dtype=None)
    compute_dtype = _COMPUTE_DTYPE.get(np.dtype(p.q.dtype))
    if compute_dtype is None:
        raise explain(
            DTypeError,
            "q",
            "unsupported dtype for the CPU backend",
            "float16, bfloat16, float32 or float64",
            p.q.dtype,
            "cast q, k and v to one of the supported dtypes",
        )
    batch, num_heads, head_dim = p.batch_size, p.num_heads, p.head_dim
    num_heads_k = p.num_heads_k
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        raise explain(
            ShapeError,
            "k",
            "number of query heads must be a multiple of the number of kv heads",
            f"H % Hk == 0 with H={num_heads}",
            f"Hk={num_heads_k}",
            "use H // Hk query heads per kv head",
        )

    if p.total_q == 0:
        return  # no query row: out and softmax_lse have no element (nothing to convert/compile)

    ranges = resolve_sequences(p)

    q = _kernel_array(p.q, compute_dtype)
    if p.paged:
        page_block_size = int(p.page_block_size)
        block_table = np.asarray(p.block_table)
        if block_table.ndim != 2 or block_table.shape[0] < batch:
            raise explain(
                ShapeError,
                "block_table",
                "needs one row per sequence",
                f"(batch_size={batch}, max_blocks_per_seq)",
                block_table.shape,
                "pass a (batch_size, max_blocks_per_seq) int32 table",
            )
        # Only the pages this call reads, converted once (never the whole pool).
        k, v, block_table, num_pages = paged_operands(
            p.k, p.v, block_table[:batch], ranges.len_k, page_block_size, compute_dtype
        )
    else:
        k = _kernel_array(p.k, compute_dtype)
        v = _kernel_array(p.v, compute_dtype)
        num_pages, page_block_size = 0, 1
        block_table = np.zeros((1, 1), dtype=np.int32)  # unused placeholder, same signature
    if p.k_scale is not None:
        # float8 K/V (fp8.py): the conversion above made new compute_dtype arrays of the rows
        # this call reads; scale them per kv head in place (float(x8) * scale[h]).
        k *= np.asarray(p.k_scale, dtype=compute_dtype)[None, :, None]
        v *= np.asarray(p.v_scale, dtype=compute_dtype)[None, :, None]

    has_alibi = p.alibi_slopes is not None
    if has_alibi:
        alibi_slopes = np.asarray(p.alibi_slopes, dtype=np.float32)
        if alibi_slopes.shape not in ((num_heads,), (batch, num_heads)):
            raise explain(
                ShapeError,
                "alibi_slopes",
                "wrong shape",
                f"({num_heads},) or ({batch}, {num_heads})",
                alibi_slopes.shape,
                "pass one float32 slope per query head (and per sequence)",
            )
        alibi_slopes = _kernel_array(np.broadcast_to(alibi_slopes, (batch, num_heads)), np.float32)
    else:
        alibi_slopes = np.zeros((1, 1), dtype=np.float32)  # unused placeholder

    has_sinks = p.sinks is not None
    sinks = (_kernel_array(np.asarray(p.sinks, dtype=np.float32), compute_dtype) if has_sinks
             else np.zeros(1, dtype=compute_dtype))  # unused placeholder

    has_ranges = p.mm_prefix_ranges is not None
    prefix_ranges = (_kernel_array(np.asarray(p.mm_prefix_ranges), np.int64) if has_ranges
                     else np.zeros((1, 1, 2), dtype=np.int64))  # unused placeholder

    # Rows no sequence covers read as 0 / +inf (the reference's convention).
    out = np.zeros((p.total_q, num_heads, head_dim), dtype=compute_dtype)
    softmax_lse = np.full((num_heads, p.total_q), np.inf, dtype=compute_dtype)  # float64 LSE of float64
    max_len_q = int(ranges.len_q.max()) if batch > 0 else 0
    num_m_blocks = (max_len_q + BLOCK_M - 1) // BLOCK_M

    _flash_fwd_kernel(
        q, k, v, out, softmax_lse,
        ranges.q_start, ranges.len_q, ranges.k_start, ranges.len_k, num_m_blocks,
        block_table, page_block_size, num_pages, bool(p.paged),
        float(p.softmax_scale), int(p.window_left), int(p.window_right), float(p.softcap),
        alibi_slopes, has_alibi, sinks, has_sinks, prefix_ranges, has_ranges,
    )  # fmt: skip

    p.out[...] = out  # rounds to q's dtype (float16 / bfloat16) where needed
    p.softmax_lse[...] = softmax_lse
