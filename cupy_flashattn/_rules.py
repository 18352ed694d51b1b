"""The attention rules the CPU backend and the host-side cache code share, each written once.

Plain Python functions of ints and floats (NumPy arrays work too where noted), so that the host
code calls them directly and ``_backend_cpu.py`` compiles the same functions with Numba for its
kernel (``njit(rule)``): one definition, no restatement.  The CUDA kernels state the same rules
once in ``cuda_src/attn/``: ``window.cuh`` (visibility), ``mask.cuh`` (softcap, ALiBi),
``paged.cuh`` (position -> page, row); ``reference.py`` states them independently on purpose (it
is the oracle the tests compare both with).

* Alignment: query row ``i`` of a sequence with ``len_q`` queries and ``len_k`` keys sits at
  key position ``diag = i + len_k - len_q`` (flash-attn's bottom-right alignment).
* Visibility: key ``j < len_k`` is visible iff ``diag - left <= j <= diag + right``; a negative
  side is unlimited, ``causal`` is ``right = 0``.
* Logit: ``s = scale * q.k``; softcap ``c > 0``: ``c * tanh(s / c)``; ALiBi: ``s -= slope *
  |diag - j|``.
* Paged mapping: key position ``p`` is row ``p % P`` of page ``block_table[b, p // P]``.
* Prefix ranges (candle's ``mm_prefix_ranges``): ranges ``[start, end)`` of key positions of a
  sequence, sorted and disjoint; a row whose ``diag`` lies in a range also sees every key of
  that range, whatever the window says (bidirectional attention inside an image's tokens).

Numba's on-disk cache of ``_backend_cpu`` does not notice edits here: after changing a rule,
clear ``cupy_flashattn/__pycache__/*.nbi|*.nbc`` (``make clean-cache``).
"""

from __future__ import annotations

import math

__all__ = ["visible_key_range", "key_visible", "prefix_range_of", "logit", "page_and_row"]


def visible_key_range(first_diag: int, last_diag: int, len_k: int, left: int, right: int):
    """Keys ``[lo, hi)`` that rows with diagonals ``first_diag .. last_diag`` can see at all
    (``hi <= lo``: none); the rows in between see subranges of it."""
    lo = 0 if left < 0 else max(0, first_diag - left)
    hi = len_k if right < 0 else min(len_k, last_diag + right + 1)
    return lo, hi


def key_visible(key_pos: int, diag: int, left: int, right: int) -> bool:
    """Whether key ``key_pos`` (``< len_k``) is inside the window of the row at ``diag``."""
    if left >= 0 and key_pos < diag - left:
        return False
    if right >= 0 and key_pos > diag + right:
        return False
    return True


def prefix_range_of(diag: int, ranges, b: int):
    """``(start, end)`` of the prefix range of sequence ``b`` that holds ``diag``, ``(0, 0)``
    when none does.  ``ranges``: int ``(B, max_ranges, 2)``; unused entries have start >= end.
    Keys ``start <= j < end`` are visible to that row on top of its window."""
    for r in range(ranges.shape[1]):
        start, end = ranges[b, r, 0], ranges[b, r, 1]
        if start <= diag < end:
            return start, end
    return 0, 0


def logit(score: float, scale: float, softcap: float, slope: float, distance: float) -> float:
    """The logit of a visible key from its raw score ``q.k`` (``distance = |diag - key_pos|``;
    ``slope = 0`` without ALiBi)."""
    s = score * scale
    if softcap > 0.0:
        s = softcap * math.tanh(s / softcap)
    return s - slope * distance


def page_and_row(pos, page_size):
    """(logical page, row in page) of key position ``pos`` (ints or integer arrays)."""
    return pos // page_size, pos % page_size
