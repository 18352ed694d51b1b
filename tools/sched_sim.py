"""The sm90 dynamic schedule's makespan on paper: each persistent CTA claims the next tile in
index order as soon as it is free (sm90/tile_scheduler.cuh), a causal query tile costing its key
tiles plus one (fill / epilogue), as schedule._tile_work counts them.  Prints, for make bench's
causal shapes (16k tokens, 2048 / D heads; and B = 1 / 3), the makespan efficiency -- total
work / CTAs over the heaviest CTA's -- of the head-major order (i = m + tiles_m hb) and of
FA_SM90_LPT_GROUPS's grouped order (TileScheduler::coords, mirrored here).  No GPU.

    python3 tools/sched_sim.py [--ctas 132]
"""

from __future__ import annotations

import argparse
import heapq
import os
import sys
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cupy_flashattn._cuda.schedule import _tile_work  # noqa: E402


def tile_work(s: int, block_m: int, block_n: int) -> np.ndarray:
    """Key tiles + 1 of each query tile of a causal S x S problem in the schedule's order,
    heaviest first: the host's own count (schedule._tile_work), which the static schedule's
    CTA-count search uses."""
    problem = SimpleNamespace(max_seqlen_q=s, max_seqlen_k=s, window_left=-1, window_right=0)
    return _tile_work(problem, -(-s // block_m), block_m, block_n)


def makespan(work_in_claim_order, ctas: int) -> float:
    """Greedy claims: the next tile goes to the CTA that frees up first."""
    heap = [0.0] * ctas
    for w in work_in_claim_order:
        heapq.heappush(heap, heapq.heappop(heap) + w)
    return max(heap)


def grouped_coords(i: int, tiles_m: int, pairs: int, ctas: int) -> tuple:
    """TileScheduler::coords with `grouped` (kept equal to the CUDA code): (m, hb) of tile i."""
    ng = max(1, pairs * tiles_m // (2 * ctas))
    g = ((i // tiles_m) * ng + ng - 1) // pairs
    first = pairs * g // ng
    count = pairs * (g + 1) // ng - first
    r = i - tiles_m * first
    return r // count, first + r % count


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctas", type=int, default=132)
    args = ap.parse_args(argv)
    for d, block_n in ((256, 80), (128, 128), (64, 128)):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            for b in sorted({max(1, 16384 // s), 1, 3}):
                w = tile_work(s, 128, block_n)
                tiles_m, pairs = len(w), (2048 // d) * b
                ideal = w.sum() * pairs / args.ctas
                head_major = np.tile(w, pairs)
                grouped = [w[grouped_coords(i, tiles_m, pairs, args.ctas)[0]] for i in range(tiles_m * pairs)]
                print(f"D{d} S{s} B{b}: {tiles_m * pairs} tiles on {args.ctas} CTAs, efficiency "
                      f"head-major {ideal / makespan(head_major, args.ctas):.3f}, "
                      f"grouped {ideal / makespan(grouped, args.ctas):.3f}")


if __name__ == "__main__":
    main()
