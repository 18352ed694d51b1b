"""Where a decode step's time goes, phase by phase (issue 16: B = 1 at cuDNN's time).

Builds the decode kernel with the FA_DECODE_TIMELINE probe switch (flash_decode.cu: thread 0 of
each CTA stamps %globaltimer at entry, lengths known, first tile landed, loop done, output
stored, split counter answered, last CTA's merge done, exit), runs one decode step per row
after a clean L2 flush (bench_decode.py's kernel-only timing), and prints, per row, the span
from the first CTA's entry to the last CTA's exit next to the CUDA-event time of the launch, and
the median time of each phase after the CTA's own entry.  GQA 32/8, D = 128, bf16, paged
(--page, a divisor of every ctx: bench_decode.py's scattered pages; 0: contiguous cache).

    PYTHONPATH=. python3 tools/decode_timeline.py [--rows 1:512,1:4096,1:32768,64:4096] [--page 16]
        [--splits 0]

The switch is a tuning define: this tool sets $CUPY_FLASHATTN_SM90_DEFINES itself, so the
kernels it builds are cached apart from the shipped ones.  %globaltimer ticks in ns on
Hopper (its update period is ~32 ns); read phase differences below ~0.1 us as noise.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

PHASES = ("entry", "lengths", "first tile", "loop done", "stored", "counter", "merged", "exit")
TIMELINE_CTAS = 8192  # flash_decode.cu kTimelineCtas


def timeline_array(key):
    """The loaded decode module's fa_decode_timeline as a (kTimelineCtas, 8) uint64 CuPy view."""
    import cupy

    from cupy_flashattn._cuda import compile as cc

    for fkey, module in cc._MODULES.items():
        if fkey[0] == ("decode", key):
            ptr = module.get_global("fa_decode_timeline")
            return cupy.ndarray((TIMELINE_CTAS, 8), dtype=np.uint64, memptr=ptr)
    raise RuntimeError(f"no loaded decode module for {key}: was the kernel launched?")


def summarize(stamps: np.ndarray) -> dict:
    """Per-phase medians (us) after each CTA's own entry, the entry spread and the span."""
    rows = stamps[stamps[:, 0] > 0].astype(np.int64)
    entry = rows[:, 0]
    out = {"ctas": len(rows), "span": (rows[:, 7].max() - entry.min()) / 1e3,
           "entry spread": (entry.max() - entry.min()) / 1e3}
    for i, name in enumerate(PHASES[1:], start=1):
        have = rows[:, i] > 0
        if have.any():
            out[name] = float(np.median(rows[have, i] - entry[have])) / 1e3
    merged = rows[:, 6] > 0
    if merged.any():  # the merging CTAs: counter answered -> merge done
        out["merge alone"] = float(np.median(rows[merged, 6] - rows[merged, 5])) / 1e3
    return out


def main(argv=None):
    # The probe switch, read by the kernel builds (and their caches' keys) from here on.
    prev = os.environ.get("CUPY_FLASHATTN_SM90_DEFINES", "")
    if "FA_DECODE_TIMELINE=1" not in prev:
        os.environ["CUPY_FLASHATTN_SM90_DEFINES"] = ",".join(x for x in (prev, "FA_DECODE_TIMELINE=1") if x)
    import cupy
    import cupy_flashattn as fa
    from bench_decode import Timer, paged_cache, random_qkv
    from cupy_flashattn._cuda import decode as dc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1:512,1:4096,1:32768,64:4096")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--splits", type=int, default=0, help="num_splits (0: the heuristic's)")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args(argv)
    H, Hk, P = 32, 8, args.page  # D = 128: bench_decode.D
    timer = Timer("clean")
    key = dc.DecodeKey("bf16", 128)
    print(f"# defines: {os.environ['CUPY_FLASHATTN_SM90_DEFINES']}; times in us", flush=True)
    for row in args.rows.split(","):
        B, ctx = (int(x) for x in row.split(":"))
        q, k, v = random_qkv(B, ctx, H, Hk)
        if P:  # bench_decode.py's cache: the keys scattered over pages in a random order
            k, v, table = paged_cache(k, v, P)
        else:
            table = None
        lens = cupy.full((B,), ctx, dtype=np.int32)

        def step(q=q, k=k, v=v, lens=lens, table=table):
            return fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              num_splits=args.splits)
        event_us = timer.kernel(step) * 1e6
        stamps = timeline_array(key)
        runs = []
        for _ in range(args.reps):
            stamps.fill(0)
            timer.flush()
            step()
            cupy.cuda.runtime.deviceSynchronize()
            runs.append(summarize(stamps.get()))
        med = {name: float(np.median([r[name] for r in runs if name in r]))
               for name in runs[0] if name != "ctas"}
        phases = "  ".join(f"{name} {med[name]:.2f}" for name in PHASES[1:] + ("merge alone",)
                           if name in med)
        print(f"B={B} ctx={ctx} page={P} CTAs={runs[0]['ctas']}: event {event_us:.1f}, span "
              f"{med['span']:.2f}, entry spread {med['entry spread']:.2f} | after entry: {phases}",
              flush=True)
        del q, k, v, table
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
