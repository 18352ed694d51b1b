"""CPU decode cost vs the size of the PagedKVCache pool (issue 10, defect 5).

A decode step must cost what its sequences hold, not what the pool holds: the CPU backend
converts (bfloat16/float16 -> float32) only the pages a call reads.  This times one
``flash_attn_with_kvcache`` decode step (append one token per sequence, then attend) with the
same sequences in pools of 64, 1024 and 16384 pages (by default), for bfloat16 and float32, and
prints one row per pool plus the ratio largest / smallest pool (about 1.0 when the cost does not
depend on the pool).

    PYTHONPATH=. python3 benchmarks/bench_cpu_pool.py [--pages 64 1024 16384] [--steps 20]

The same rows are part of ``python -m cupy_flashattn bench --cpu`` (``--pool-pages``).
Numba runs on all cores by default; on a busy machine set NUMBA_NUM_THREADS=1 for stable numbers.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cupy_flashattn.cli import POOL_PAGES, pool_decode_rows  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, nargs="+", default=list(POOL_PAGES))
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per pool")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args(argv)
    if min(args.pages) < 1 or args.steps < 1 or args.batch < 1 or args.context < 0:
        ap.error("--pages and --steps/--batch must be >= 1, --context >= 0")

    threads = os.environ.get("NUMBA_NUM_THREADS", "all cores")
    print(f"CPU decode step vs pool size (NUMBA_NUM_THREADS={threads}), median of "
          f"{args.steps} steps")
    print("| dtype | pool pages | ms per decode step | setup |")
    print("| --- | ---: | ---: | --- |")
    for name in args.dtypes:
        rows = pool_decode_rows([name], args.pages, steps=args.steps, batch=args.batch,
                                context=args.context)
        times = [t for _, _, t, _ in rows if not math.isnan(t)]
        for (case, _, t, note), n in zip(rows, args.pages):
            shown = "-" if math.isnan(t) else f"{t * 1e3:.3f}"
            print(f"| {name} | {n} | {shown} | {note} |")
        if len(times) >= 2:
            print(f"| {name} | ratio largest / smallest pool | {times[-1] / times[0]:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
