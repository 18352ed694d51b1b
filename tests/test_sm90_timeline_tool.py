"""tools/sm90_timeline.py's arithmetic on a synthetic timeline (no GPU): the phases between two
query tiles come out in nanoseconds through each CTA's own clock-to-time ratio, tiles with a
missing event are left out, and CTAs that did not run are skipped."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import sm90_timeline as tl  # noqa: E402


def _timeline(ns_per_clk_by_cta):
    t = np.zeros((tl.CTAS, tl.ROLES, tl.TILES, tl.EVENTS), np.uint64)
    span = np.zeros((tl.CTAS, 4), np.uint64)
    rng = np.random.default_rng(7)
    for cta, ratio in ns_per_clk_by_cta.items():
        base = int(rng.integers(1_000, 10_000_000))  # clocks of different SMs do not agree
        span[cta] = (base, 5_000, base + 1_000_000, 5_000 + int(1_000_000 * ratio))
        for role in (1, 2):
            clk = base + 100 + role
            for tile in range(3):  # three tiles, phases in clocks: 10 / 40 / 300 / 20 / 5 / 7 / 9
                ev = t[cta, role, tile]
                ev[tl.C_START] = clk
                ev[tl.C_Q_FULL] = clk + 10
                ev[tl.C_FIRST_S] = clk + 50
                ev[tl.C_LOOP_END] = clk + 350
                ev[tl.C_PV_DONE] = clk + 370
                ev[tl.C_STORED] = clk + 375
                if cta != 3:  # the epilogue's inner marks (CTA 3: a build without them)
                    ev[tl.C_FINAL] = clk + 371
                    ev[tl.C_STAGED] = clk + 373
                clk += 382  # the next tile is known 7 clocks after the stores
        for tile in range(3):
            t[cta, 0, tile, tl.P_Q_EMPTY] = base + 90 + 382 * tile
            t[cta, 0, tile, tl.P_LAST_V] = base + 60 + 382 * tile
    return t, span


def test_phases_in_ns_through_each_ctas_clock_ratio():
    t, span = _timeline({0: 0.5, 3: 0.5})
    rows = tl.summarise(t, span, n_k_tiles=4)
    # 2 CTAs x 2 consumer warpgroups x 2 tile boundaries
    assert len(rows["between tiles"]) == 8
    assert np.allclose(rows["epilogue"], 5 * 0.5)
    assert np.allclose(rows["to next tile"], 7 * 0.5)
    assert np.allclose(rows["wait for Q"], 10 * 0.5)
    assert np.allclose(rows["first S"], 40 * 0.5)
    assert np.allclose(rows["between tiles"], (5 + 7 + 10 + 40) * 0.5)
    assert np.allclose(rows["key tiles"], 300 / 3 * 0.5)  # first S -> loop end over 3 tiles
    # the epilogue's parts 1 / 2 / 2 clocks, from CTA 0 only
    assert len(rows["  epilogue: O / l, LSE"]) == 4
    assert np.allclose(rows["  epilogue: O / l, LSE"], 1 * 0.5)
    assert np.allclose(rows["  epilogue: stage O, barrier"], 2 * 0.5)
    assert np.allclose(rows["  epilogue: copy out"], 2 * 0.5)
    # producer, next tile: last V of the tile before at +60, Q free at +90 + 382
    assert np.allclose(rows["producer: last V issued -> Q free"], (382 + 30) * 0.5)


def test_a_tile_with_a_missing_event_and_idle_ctas_are_left_out():
    t, span = _timeline({1: 1.0})
    t[1, 2, 1, tl.C_STORED] = 0  # warpgroup 1's second tile never wrote its epilogue's mark
    rows = tl.summarise(t, span, n_k_tiles=0)
    assert len(rows["between tiles"]) == 3  # 2 + 1 boundaries; CTAs 0, 2.. never ran
    assert len(rows["key tiles"]) == 0     # causal / unknown key-tile counts: not computed
