"""tools/sched_sim.py's arithmetic (no GPU): the grouped claim order it mirrors from
sm90/tile_scheduler.cuh TileScheduler::coords visits every (m, pair) tile exactly once, and the
greedy-claim simulation scores it above the head-major order on make bench's D = 256 causal
shape, where the head-major tail was measured (paged causal 0.89 of dense one call)."""

import itertools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import sched_sim as sim  # noqa: E402


@pytest.mark.parametrize("tiles_m, pairs, ctas",
                         list(itertools.product((1, 3, 16, 33), (1, 2, 7, 64, 129), (1, 60, 132))))
def test_grouped_order_is_a_permutation_of_the_tiles(tiles_m, pairs, ctas):
    seen = {sim.grouped_coords(i, tiles_m, pairs, ctas) for i in range(tiles_m * pairs)}
    assert seen == {(m, hb) for m in range(tiles_m) for hb in range(pairs)}


def test_grouped_order_claims_each_groups_heaviest_tiles_first():
    # 64 pairs x 16 tiles on 132 CTAs: 3 groups (64 * 16 // 264), of 21 / 21 / 22 pairs
    order = [sim.grouped_coords(i, 16, 64, 132) for i in range(16 * 64)]
    assert [m for m, _ in order[:21]] == [0] * 21
    assert sorted(hb for _, hb in order[:21]) == list(range(21))
    assert order[21] == (1, 0)


def test_simulated_makespan_of_the_d256_causal_shape():
    w = sim.tile_work(2048, 128, 80)  # D = 256: 80-key tiles; heaviest first
    assert w[0] == -(-2048 // 80) + 1 and w[-1] == 2 + 1
    pairs, ctas = 64, 132
    ideal = w.sum() * pairs / ctas
    head_major = ideal / sim.makespan(np.tile(w, pairs), ctas)
    grouped = ideal / sim.makespan([w[sim.grouped_coords(i, 16, pairs, ctas)[0]]
                                    for i in range(16 * pairs)], ctas)
    assert head_major < 0.9 < 0.97 < grouped
