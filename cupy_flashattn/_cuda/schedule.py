"""Where the prefill kernels' CTAs go: the grid of a launch and, for the sm90 family, the
persistent schedule's CTA count.

sm80 launches one CTA per query tile (``prefill_grid``: query tiles of the longest sequence x
heads x batch).  sm90 launches at most one CTA per SM, each running the tiles i = m + tiles_m
(h + H b) that ``cuda_src/sm90/tile_scheduler.cuh`` hands it:
* problems whose sequence lengths the host knows (:func:`uniform_lengths`): static rounds of
  the grid, odd rounds reversed, with the CTA count :func:`persistent_grid` picks to balance
  causal tiles of unequal work;
* the others (cu_seqlens, seqused_k, leftpad: lengths on the device, e.g. every varlen and
  paged-cache call): one CTA per SM claiming tiles from a counter (:func:`dynamic_schedule`),
  so unequal sequences balance like a one-CTA-per-tile grid while each CTA still overlaps a
  tile's fill with the previous tile (static rounds measured varlen at 0.81-1.04x of dense; one
  CTA per tile paid the fill per tile: paged S = 512 0.80x of dense).
Measurements behind each choice: benchmarks/NOTES.md, sm90 v7 and "dynamic schedule".
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ..problem import AttentionProblem

__all__ = ["prefill_grid", "persistent_grid", "uniform_lengths", "snake_makespan", "launch_grid",
           "new_tile_counter", "dynamic_schedule", "sm_count_of", "SM90_GRID_ENV"]


def prefill_grid(problem: AttentionProblem, tr) -> tuple:
    """(query tiles of the longest sequence, heads x V-splits, batch): one CTA per block_m
    queries of one head of one sequence (a varlen CTA past its sequence's end exits at once),
    and per V-split chunk of its head dim (``tr.v_splits``: head dims 384 / 512,
    sm80/kernel_traits.cuh; the chunk is blockIdx.y % v_splits)."""
    p = problem
    return (-(-int(p.max_seqlen_q) // tr.block_m), p.num_heads * tr.v_splits, int(p.batch_size))


def _tile_work(problem: AttentionProblem, tiles_m: int, block_m: int, block_n: int) -> np.ndarray:
    """Key tiles each query tile of a (sequence, head) visits, in the sm90 schedule's order (m
    index 0 first: the last query tile under a window, as flash_fwd.cu's tile_at walks them),
    for the longest sequence (varlen lengths are on the device) plus one tile of fill and
    epilogue.  The mask's rule: query i sees keys [i + shift - window_left, i + shift +
    window_right] (bottom-right aligned, shift = Sk - Sq)."""
    p = problem
    sq, sk = int(p.max_seqlen_q), int(p.max_seqlen_k)
    shift = sk - sq
    m_block = np.arange(tiles_m)
    if p.window_right >= 0:
        m_block = tiles_m - 1 - m_block
    first_q = m_block * block_m
    last_q = np.minimum(first_q + block_m, sq) - 1
    lo = np.zeros(tiles_m, np.int64) if p.window_left < 0 else np.maximum(first_q + shift - p.window_left, 0)
    hi = np.full(tiles_m, sk) if p.window_right < 0 else np.minimum(last_q + shift + p.window_right + 1, sk)
    n = np.maximum(-(-hi // block_n) - lo // block_n, 0)
    return n + 1


def snake_makespan(work: np.ndarray, ctas: int) -> int:
    """The heaviest CTA's work under flash_fwd.cu's schedule: rounds of ``ctas`` tiles, CTA c
    taking tile c of even rounds and tile ctas - 1 - c of odd ones."""
    rounds = -(-len(work) // ctas)
    padded = np.zeros(rounds * ctas, np.int64)
    padded[: len(work)] = work
    grid = padded.reshape(rounds, ctas)
    grid[1::2] = grid[1::2, ::-1]
    return int(grid.sum(axis=0).max())


def uniform_lengths(problem: AttentionProblem) -> bool:
    """Whether every sequence has the host's max_seqlen_q queries and max_seqlen_k keys (dense
    q and k, no per-sequence lengths on the device).  Only then does the host know each tile's
    work; with cu_seqlens / seqused_k / leftpad static rounds would leave SMs idle behind long
    sequences (they measured varlen at 0.81-1.04x of dense, 0.84x at S = 2k D = 128, where one
    CTA per tile measured 1.00x), so those launches claim tiles dynamically
    (:func:`dynamic_schedule`)."""
    p = problem
    return all(x is None for x in (p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.leftpad_k))


def persistent_grid(problem: AttentionProblem, tr, sm_count: int) -> tuple:
    """The sm90 family's launch grid: (CTAs,) with at most one CTA per SM.  Problems of
    :func:`uniform_lengths` walk their query tiles in static rounds: without a window every tile
    costs the same and every SM gets a CTA; under a causal / local window tile m's work grows
    with m, and the count among the 16 below the SM count whose heaviest CTA has the least work
    (:func:`snake_makespan`, ties to more CTAs) is taken -- within 3% of an even split at
    S = 2k..16k causal, against up to 20% for a plain c, c + CTAs, ... order.  The others get
    one CTA per SM claiming tiles as they free up (:func:`dynamic_schedule`)."""
    tiles_m, heads, batch = prefill_grid(problem, tr)
    total = tiles_m * heads * batch
    if total <= sm_count or not uniform_lengths(problem):
        return (max(min(total, sm_count), 1), 1, 1)
    if problem.window_right < 0 and problem.window_left < 0:
        return (sm_count, 1, 1)
    per_head = tuple(int(w) for w in _tile_work(problem, tiles_m, tr.block_m, tr.block_n))
    return (_balanced_ctas(per_head, heads * batch, sm_count), 1, 1)


@functools.lru_cache(maxsize=256)
def _balanced_ctas(per_head: tuple, repeats: int, sm_count: int) -> int:
    """The CTA count of :func:`persistent_grid` for tiles of work ``per_head`` repeated
    ``repeats`` times (cached: the search costs ~200 us, more than a small call's kernels, and a
    plan built per call -- ``_cuda.run_attention`` without one -- would pay it every time)."""
    work = np.tile(np.array(per_head, np.int64), repeats)
    candidates = range(sm_count, max(sm_count - 16, 1) - 1, -1)
    return min(candidates, key=lambda ctas: (snake_makespan(work, ctas), -ctas))


def sm_count_of(device_id=None) -> int:
    """SMs of a device (default: the current one)."""
    import cupy

    from .decode import _sm_count

    return _sm_count(cupy.cuda.runtime.getDevice() if device_id is None else device_id)


#: Development switch (device A/B runs and tests): "tiles" launches the sm90 kernels with one
#: CTA per query tile (the persistent loop then runs one round per CTA, the hardware
#: schedules); "ctas=N" runs every problem (uniform lengths or not) on at most N persistent
#: CTAs, so that small test problems take many rounds (static) or claims (dynamic) per CTA
#: (tests/gpu/test_sm90_persistent.py).
SM90_GRID_ENV = "CUPY_FLASHATTN_SM90_GRID"


def dynamic_schedule(problem: AttentionProblem, tr, arch: str, grid: tuple) -> bool:
    """Whether an sm90 launch of ``grid`` claims its tiles from a counter (the kernel's dynamic
    schedule): problems whose lengths are on the device (not :func:`uniform_lengths`) with
    fewer CTAs than tiles.  Static rounds serve the rest (one round when every tile has a CTA:
    the "tiles" grid mode, or few tiles)."""
    if arch != "sm90" or uniform_lengths(problem):
        return False
    tiles_m, heads, batch = prefill_grid(problem, tr)
    return int(grid[0]) < tiles_m * heads * batch


def new_tile_counter():
    """A zeroed counter for launches with the dynamic schedule: [next tile - gridDim.x, CTAs
    retired] (sm90/tile_scheduler.cuh; the last CTA to retire zeroes it for the next launch)."""
    import cupy

    return cupy.zeros(2, dtype=np.int32)


def launch_grid(problem: AttentionProblem, tr, arch: str, sm_count=None) -> tuple:
    """The grid a prefill launch uses: sm80, one CTA per query tile (:func:`prefill_grid`);
    sm90, :func:`persistent_grid` on ``sm_count`` SMs (default: the current device's)."""
    if arch != "sm90":
        return prefill_grid(problem, tr)
    mode = os.environ.get(SM90_GRID_ENV, "persistent")
    if mode == "tiles" or mode.startswith("ctas="):
        tiles_m, heads, batch = prefill_grid(problem, tr)
        total = max(tiles_m * heads * batch, 1)
        return (total if mode == "tiles" else min(total, max(1, int(mode[5:]))), 1, 1)
    return persistent_grid(problem, tr, sm_count_of() if sm_count is None else int(sm_count))
