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
    return_lse=False,
    upcast=True,
):
    """Attention of one sequence ``(Sq, H, D)`` or a dense batch ``(B, Sq, H, D)``.

    k, v: ``(Sk, Hk, D)`` / ``(B, Sk, Hk, D)``; query head ``h`` reads kv head ``h // (H // Hk)``.
    Masks are aligned bottom-right (query ``i`` sits at key position ``i + Sk - Sq``).
    alibi_slopes: ``(H,)`` or ``(B, H)``; adds ``-slope * |i + Sk - Sq - j|``.
    Returns ``out`` in q's dtype (float64 when upcast) and, with ``return_lse``, the natural-log
    LSE ``(H, Sq)`` / ``(B, H, Sq)`` in float64 (+inf for rows that see no key; their output is 0).
    """
    q, k, v = _to_numpy(q), _to_numpy(k), _to_numpy(v)
    alibi_slopes = _to_numpy(alibi_slopes)
    batched = q.ndim == 4
    if not batched:
        q, k, v = q[None], k[None], v[None]
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
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True) if Sk > 0 else np.full((B, H, Sq, 1), -np.inf)
    empty = ~np.isfinite(row_max)
    safe_max = np.where(empty, 0.0, row_max)
    p = np.exp(scores - safe_max)
    denom = p.sum(axis=-1, keepdims=True)
    probs = rnd(np.where(empty, 0.0, p / np.where(empty, 1.0, denom)))
    out = np.einsum("bhij,bjhd->bihd", probs, vv)
    lse = np.where(empty[..., 0], np.inf, (safe_max + np.log(np.where(empty, 1.0, denom)))[..., 0])
    out = out if upcast else out.astype(dtype)
    if not batched:
        out, lse = out[0], lse[0]
    return (out, lse) if return_lse else out


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
    lse = np.full((H, q.shape[0]), np.inf)
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
            return_lse=True,
            upcast=upcast,
        )
        out[q_start : q_start + len_q] = o
        lse[:, q_start : q_start + len_q] = l
    return out, lse
