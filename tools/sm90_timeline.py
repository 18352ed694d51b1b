"""Where a persistent sm90 CTA's time goes between its query tiles: one prefill call of a
build with FA_SM90_DIAG_TIMELINE=1 (cuda_src/sm90/diag_timeline.cuh), its per-tile clocks read
back and summarised (GPU machine, repo root).

    python3 tools/sm90_timeline.py --d 128 --s 2048 [--causal] [--paged P] [--defines A=1,B=0]

Prints, over every CTA's query tiles after its first (ns, median and 90th percentile):
  key tiles       the tile's key tiles (its first S to its last P V), per key tile;
  epilogue        last P V complete -> stores issued;
  to next tile    stores issued -> the next tile known (scheduler);
  wait for Q      next tile known -> its Q landed;
  first S         Q landed -> the first S complete (no P V of the same warpgroup under it);
  between tiles   last P V complete -> the next tile's first S complete (the sum of the four);
and for the producer: from its last V load of a tile to the consumers' release of Q (how
long the next tile's loads wait for Q's buffer), and from that release to the consumers
having the next Q (the load's latency, as the consumers see it).  "between tiles" against "key
tiles" x (key tiles a query tile) is the share of a query tile that is not matrix products.

The defines (CUPY_FLASHATTN_SM90_DEFINES) must be set before cupy_flashattn compiles anything,
so this script sets them itself; the kernel cache is its own (CUPY_CACHE_DIR is left to the
caller; a timeline build's text differs, so its cache entries never collide with the default).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# cuda_src/sm90/diag_timeline.cuh
CTAS, ROLES, TILES, EVENTS = 160, 3, 48, 8
P_CLAIMED, P_Q_EMPTY, P_LAST_V = 0, 1, 2
C_START, C_Q_FULL, C_FIRST_S, C_LOOP_END, C_PV_DONE, C_STORED, C_FINAL, C_STAGED = range(8)


def summarise(tl, span, n_k_tiles: int):
    """Per-phase durations (ns) from the timeline arrays (numpy, uint64): tl of shape
    (CTAS, ROLES, TILES, EVENTS), span (CTAS, 4).  Returns {phase: array of ns}."""
    import numpy as np

    rows = {k: [] for k in ("key tiles", "epilogue", "  epilogue: O / l, LSE",
                            "  epilogue: stage O, barrier", "  epilogue: copy out",
                            "to next tile", "wait for Q", "first S",
                            "between tiles", "producer: last V issued -> Q free",
                            "producer: Q free -> consumer has Q")}
    for cta in range(CTAS):
        c0, g0, c1, g1 = (int(x) for x in span[cta])
        if c1 <= c0 or g1 <= g0:
            continue  # this CTA did not run (or ran no tile)
        ns_per_clk = (g1 - g0) / (c1 - c0)
        t = tl[cta].astype(np.int64)
        for role in (1, 2):
            c = t[role]
            for i in range(TILES - 1):
                cur, nxt = c[i], c[i + 1]
                if not (cur[C_PV_DONE] and cur[C_STORED] and nxt[C_START] and nxt[C_FIRST_S]):
                    continue
                d = lambda a, b: (b - a) * ns_per_clk  # noqa: E731
                if cur[C_LOOP_END] and n_k_tiles > 1:
                    rows["key tiles"].append(d(cur[C_FIRST_S], cur[C_LOOP_END]) / (n_k_tiles - 1))
                rows["epilogue"].append(d(cur[C_PV_DONE], cur[C_STORED]))
                if cur[C_FINAL] and cur[C_STAGED]:  # marked since stop 49
                    rows["  epilogue: O / l, LSE"].append(d(cur[C_PV_DONE], cur[C_FINAL]))
                    rows["  epilogue: stage O, barrier"].append(d(cur[C_FINAL], cur[C_STAGED]))
                    rows["  epilogue: copy out"].append(d(cur[C_STAGED], cur[C_STORED]))
                rows["to next tile"].append(d(cur[C_STORED], nxt[C_START]))
                rows["wait for Q"].append(d(nxt[C_START], nxt[C_Q_FULL]))
                rows["first S"].append(d(nxt[C_Q_FULL], nxt[C_FIRST_S]))
                rows["between tiles"].append(d(cur[C_PV_DONE], nxt[C_FIRST_S]))
                p, p_prev = t[0][i + 1], t[0][i]
                if p[P_Q_EMPTY] and p_prev[P_LAST_V]:
                    rows["producer: last V issued -> Q free"].append(d(p_prev[P_LAST_V], p[P_Q_EMPTY]))
                if p[P_Q_EMPTY]:
                    rows["producer: Q free -> consumer has Q"].append(d(p[P_Q_EMPTY], nxt[C_Q_FULL]))
    return {k: np.asarray(v) for k, v in rows.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--paged", type=int, default=0, help="page size (0: dense)")
    ap.add_argument("--defines", default="", help="more sm90 switches, e.g. FA_SM90_EARLY_Q=1")
    args = ap.parse_args(argv)
    defines = ",".join(x for x in ("FA_SM90_DIAG_TIMELINE=1", args.defines.strip(",")) if x)
    os.environ["CUPY_FLASHATTN_SM90_DEFINES"] = defines

    import cupy
    import ml_dtypes
    import numpy as np

    import cupy_flashattn as fa
    from cupy_flashattn._cuda import compile as cc

    b = max(1, 16384 // args.s)
    shape = (b, args.s, args.heads, args.d)
    q, k, v = (cupy.random.standard_normal(shape, dtype=cupy.float32).astype(ml_dtypes.bfloat16)
               for _ in range(3))
    if args.paged:
        from quickbench_sm90 import paged_call

        call, _ = paged_call(q, k, v, args.paged, args.causal, np.random.default_rng(0))
    else:
        def call():
            return fa.flash_attn_func(q, k, v, causal=args.causal)
    call()  # compile, plan, warm
    cupy.cuda.runtime.deviceSynchronize()
    modules = [m for (cache_key, _defines, _device), m in cc._MODULES.items()
               if cache_key[0] == "fwd" and getattr(cache_key[1], "arch", "") == "sm90"]
    if len(modules) != 1:
        sys.exit(f"expected one sm90 module in this process, found {len(modules)}")
    module = modules[0]
    tl_ptr = module.get_global("fa_sm90_timeline")
    span_ptr = module.get_global("fa_sm90_timeline_span")
    n_tl, n_span = CTAS * ROLES * TILES * EVENTS, CTAS * 4
    tl_dev = cupy.ndarray((n_tl,), cupy.uint64, tl_ptr)
    span_dev = cupy.ndarray((n_span,), cupy.uint64, span_ptr)
    tl_dev.fill(0)
    span_dev.fill(0)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    call()
    end.record()
    end.synchronize()
    ms = cupy.cuda.get_elapsed_time(start, end)
    tl = cupy.asnumpy(tl_dev).reshape(CTAS, ROLES, TILES, EVENTS)
    span = cupy.asnumpy(span_dev).reshape(CTAS, 4)
    bn = _key_tile(args)
    n_k = -(-args.s // bn)
    print(f"{shape} causal={args.causal} paged={args.paged} defines={defines}: one call "
          f"{ms * 1e3:.0f} us (events), key tile {bn} ({n_k} a query tile without a window)")
    rows = summarise(tl, span, 0 if args.causal else n_k)
    print(f"{'phase':38s} {'n':>6s} {'median ns':>10s} {'p90 ns':>8s}")
    for name, vals in rows.items():
        if len(vals):
            print(f"{name:38s} {len(vals):6d} {np.median(vals):10.0f} {np.percentile(vals, 90):8.0f}")
        else:
            print(f"{name:38s} {0:6d}")


def _key_tile(args) -> int:
    """The key-tile width of the kernel this call runs (the shipped traits)."""
    from cupy_flashattn._cuda import compile as cc

    wide = (not args.causal and not args.paged and args.d == 128
            and args.s >= cc.SM90_WIDE_MIN_KEYS)
    return cc.traits(args.d, "sm90", paged=bool(args.paged), wide=wide).block_n


if __name__ == "__main__":
    main()
