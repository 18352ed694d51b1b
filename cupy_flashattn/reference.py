"""Plain NumPy attention: the oracle for tests and a readable statement of the semantics.

``attention_ref`` is the textbook ``softmax(scale * Q K^T + bias) V`` computed in float64 by
default.  With ``upcast=False`` it instead rounds every intermediate (scores, probabilities,
output) to the input dtype, which is what a naive same-precision implementation would get; the
tests bound a kernel's error by twice that naive error, flash-attn's criterion.
"""

from __future__ import annotations

import numpy as np

__all__ = ["attention_ref"]


def _to_numpy(a):
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):  # CuPy
        return a.get()
    return np.asarray(a)


def attention_ref(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    mm_prefix_ranges=None,
    return_lse=False,
    upcast=True,
):
    """Attention of one sequence ``(Sq, H, D)`` or a dense batch ``(B, Sq, H, D)``.

    k, v: ``(Sk, Hk, D)`` / ``(B, Sk, Hk, D)``; query head ``h`` reads kv head ``h // (H // Hk)``.
    Masks are aligned bottom-right (query ``i`` sits at key position ``i + Sk - Sq``).
    alibi_slopes: ``(H,)`` or ``(B, H)``; adds ``-slope * |i + Sk - Sq - j|``.
    sinks: ``(H,)``: one more logit per row (not scaled, not capped) whose value vector is 0:
    the softmax is taken over ``[logits..., sinks[h]]`` and the sink's column dropped, so it only
    adds ``exp(sinks[h])`` to the denominator (and to the LSE).
    mm_prefix_ranges: ``(R, 2)`` / ``(B, R, 2)`` [start, end) key ranges; query i (at key
    position ``i + Sk - Sq``) inside a range also sees every key of that range.
    Returns ``out`` in q's dtype (float64 when upcast) and, with ``return_lse``, the natural-log
    LSE ``(H, Sq)`` / ``(B, H, Sq)`` in float64 (+inf for rows that see no key; their output is 0).

    Non-finite inputs follow IEEE arithmetic over the keys a row sees: a NaN logit (NaN q or k,
    a NaN slope) or a +inf one (its ``exp(inf - inf)``) makes the row's output and LSE NaN; a
    -inf logit weighs 0 like a masked key; a NaN / inf in v (row j, column d) reaches column d
    of the rows that give key j a nonzero weight; a key of weight 0 (masked, a -inf logit, an
    underflow) contributes nothing, whatever its v holds.
    """
    q, k, v = _to_numpy(q), _to_numpy(k), _to_numpy(v)
    alibi_slopes = _to_numpy(alibi_slopes)
    sinks = _to_numpy(sinks)
    ranges = _to_numpy(mm_prefix_ranges)
    batched = q.ndim == 4
    if not batched:
        q, k, v = q[None], k[None], v[None]
    if ranges is not None and ranges.ndim == 2:
        ranges = ranges[None]
    if alibi_slopes is not None and alibi_slopes.ndim == 1:
        alibi_slopes = np.broadcast_to(alibi_slopes, (q.shape[0], alibi_slopes.shape[0]))
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / np.sqrt(D)
    if causal:
        window_size = (window_size[0], 0)
    left, right = window_size
    dtype = q.dtype

    def rnd(x):
        return x if upcast else x.astype(dtype).astype(np.float64)

    group = H // Hk
    kk = np.repeat(k.astype(np.float64), group, axis=2)  # (B, Sk, H, D)
    vv = np.repeat(v.astype(np.float64), group, axis=2)
    qq = q.astype(np.float64)
    scores = rnd(np.einsum("bihd,bjhd->bhij", qq, kk)) * softmax_scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    diag = i + Sk - Sq  # the key column aligned with query i
    if alibi_slopes is not None:
        dist = np.abs(diag - j).astype(np.float64)
        scores = scores - alibi_slopes.astype(np.float64)[:, :, None, None] * dist
    visible = np.ones((Sq, Sk), dtype=bool)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    visible = np.broadcast_to(visible, (B, 1, Sq, Sk))
    if ranges is not None:  # bidirectional inside each range, for the queries it holds
        extra = np.zeros((B, 1, Sq, Sk), dtype=bool)
        for b in range(B):
            for start, end in ranges[b]:
                if start < end:
                    extra[b, 0] |= ((diag >= start) & (diag < end)) & ((j >= start) & (j < end))
        visible = visible | extra
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True) if Sk > 0 else np.full((B, H, Sq, 1), -np.inf)
    sink = None
    if sinks is not None:  # the sink as one more column of the row (its value vector is 0)
        sink = np.broadcast_to(sinks.astype(np.float64)[None, :, None, None], row_max.shape)
        row_max = np.where(np.isnan(row_max), np.nan, np.fmax(row_max, sink))
    # Empty: no visible key (or only -inf logits).  A NaN max (a NaN logit) is not empty, and a
    # +inf max is not either: exp(inf - inf) = NaN makes that row NaN, as in a plain softmax.
    empty = row_max == -np.inf
    safe_max = np.where(empty, 0.0, row_max)
    with np.errstate(invalid="ignore"):  # inf - inf of a +inf logit: NaN on purpose
        p = np.exp(scores - safe_max)
    denom = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + np.exp(sink - safe_max)
    probs = rnd(np.where(empty, 0.0, p / np.where(empty, 1.0, denom)))
    out = _probs_times_v(probs, vv)
    lse = np.where(empty[..., 0], np.inf, (safe_max + np.log(np.where(empty, 1.0, denom)))[..., 0])
    out = out if upcast else out.astype(dtype)
    if not batched:
        out, lse = out[0], lse[0]
    return (out, lse) if return_lse else out


def _probs_times_v(probs, vv):
    """``out[b, i, h] = sum_j probs[b, h, i, j] * vv[b, j, h]`` over the keys j of nonzero weight.

    The plain einsum also multiplies the v of a key of weight 0 (masked for row i) by 0, and
    0 * NaN = NaN would let a NaN (or inf) in v leak into rows that never see its key.  So
    non-finite v entries are left out of the einsum, and what they do to the rows that give
    their key a nonzero (positive) weight is added back: a NaN, or both infinities, -> NaN;
    +inf or -inf -> that infinity."""
    finite = np.isfinite(vv)
    if finite.all():
        return np.einsum("bhij,bjhd->bihd", probs, vv)
    out = np.einsum("bhij,bjhd->bihd", probs, np.where(finite, vv, 0.0))
    weighted = (probs != 0).astype(np.float64)  # NaN weights (NaN rows) too: out is NaN there

    def reached(mask):  # out elements that some key of nonzero weight with mask[j] reaches
        return np.einsum("bhij,bjhd->bihd", weighted, mask.astype(np.float64)) > 0

    pos, neg = reached(vv == np.inf), reached(vv == -np.inf)
    nan = reached(np.isnan(vv)) | (pos & neg) | np.isnan(out)
    return np.where(nan, np.nan, np.where(pos, np.inf, np.where(neg, -np.inf, out)))


def problem_ref(problem, upcast=True):
    """Reference ``(out (total_q, H, D), lse (H, total_q))`` of a normalized
    :class:`~cupy_flashattn.problem.AttentionProblem`, gathering each sequence's keys through
    the same resolution rules the backends use."""
    from .problem import resolve_sequence

    p = problem
    q = _to_numpy(p.q)
    k_all, v_all = _to_numpy(p.k), _to_numpy(p.v)
    alibi = _to_numpy(p.alibi_slopes)
    table = _to_numpy(p.block_table)
    H, D = q.shape[1], q.shape[2]
    out = np.zeros((q.shape[0], H, D), dtype=np.float64 if upcast else q.dtype)
    lse = np.full((H, q.shape[0]), np.inf)  # rows no sequence covers
    for b in range(p.batch_size):
        q_start, len_q, k_start, len_k = resolve_sequence(p, b)
        if len_q == 0:
            continue
        if p.paged:
            pos = np.arange(len_k)
            pages = table[b, pos // p.page_block_size]
            kb = k_all[pages, pos % p.page_block_size]
            vb = v_all[pages, pos % p.page_block_size]
        else:
            kb = k_all[k_start : k_start + len_k]
            vb = v_all[k_start : k_start + len_k]
        o, l = attention_ref(
            q[q_start : q_start + len_q],
            kb,
            vb,
            softmax_scale=p.softmax_scale,
            window_size=(p.window_left, p.window_right),
            softcap=p.softcap,
            alibi_slopes=None if alibi is None else alibi[b],
            sinks=_to_numpy(p.sinks),
            mm_prefix_ranges=None if p.mm_prefix_ranges is None else _to_numpy(p.mm_prefix_ranges)[b],
            return_lse=True,
            upcast=upcast,
        )
        out[q_start : q_start + len_q] = o
        lse[:, q_start : q_start + len_q] = l
    return out, lse
