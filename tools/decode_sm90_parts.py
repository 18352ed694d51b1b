"""Where a swapped MQA decode step's GPU time goes (issue 16, B = 1 latency): the split kernel
alone, the combine kernel alone, both (the step), and an empty kernel (the floor of this
measurement: the events, the launch, nothing else).  Stop 44 measured with it that the step
costs ~3.7 us more than its two kernels apart (the kernel boundary), and that neither a
programmatic dependent launch of the combine (slower by 0.4-1.8 us) nor the combine asking
for the split kernel's shared-memory carveout (no change) recovers it (benchmarks/NOTES.md).

Each timed launch follows bench_decode.py's clean L2 flush, which keeps the GPU busy while the
host prepares it (so host work is not timed); medians of bench_decode.py's repetitions.

    PYTHONPATH=. python3 tools/decode_sm90_parts.py [--rows 1:4096,1:32768,4:8192,64:4096]
        [--heads 32/1] [--page 16] [--splits 0] [--lse-read]      (D = 128, bench_decode.py's)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import cupy  # noqa: E402

_EMPTY = r'extern "C" __global__ void fa_probe_empty() {}'


def main(argv=None):
    from bench_decode import Timer, decode_problem, paged_cache, random_qkv

    from cupy_flashattn import _cuda
    from cupy_flashattn._cuda.args import problem_pointers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1:4096,1:32768,4:8192,64:4096")
    ap.add_argument("--heads", default="32/1")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--splits", type=int, default=0)
    ap.add_argument("--lse-read", action="store_true",
                    help="the step's LSE is read (return_softmax_lse): no direct output, so "
                         "partials and the combine at every batch (default: bench_decode.py's "
                         "problem, whose LSE nobody reads)")
    args = ap.parse_args(argv)
    (H, Hk), D, P = map(int, args.heads.split("/")), 128, args.page  # bench_decode.py's D
    timer = Timer("clean")
    empty = cupy.RawKernel(_EMPTY, "fa_probe_empty")
    floor = timer.kernel(lambda: empty((1,), (32,), ())) * 1e6
    print(f"empty kernel (events + one launch): {floor:.1f} us", flush=True)
    for row in args.rows.split(","):
        B, ctx = (int(x) for x in row.split(":"))
        q, k, v = random_qkv(B, ctx, H, Hk, D)
        kc, vc, table = paged_cache(k, v, P)
        lens = cupy.full((B,), ctx, dtype=np.int32)
        prob = decode_problem(q, kc, vc, lens, table, P, ctx, None)
        if args.splits:
            prob = dataclasses.replace(prob, num_splits=args.splits)
        if args.lse_read:
            prob = dataclasses.replace(prob, lse_unread=False)
        plan = _cuda.plan_attention(prob)[0]
        if not hasattr(plan, "combine_launch"):
            print(f"B={B} ctx={ctx}: not the swapped plan ({type(plan).__name__})")
            continue
        oacc, lacc, counter = plan.stream_buffers()
        ptrs = problem_pointers(prob)
        ptrs.update(sinks=None, oaccum=oacc, lse_accum=lacc, tile_counter=counter)
        combine = {"o_in": oacc, "lse_in": lacc, "o_out": prob.out, "lse_out": prob.softmax_lse,
                   "sinks": prob.sinks}
        parts = {
            "step": lambda: plan.run(prob),
            "split kernel": lambda: plan.launch(ptrs),
        }
        if plan.combine_launch is not None:  # None: the direct output (one split, or a cluster's)
            parts["combine"] = lambda: plan.combine_launch(combine)
        cells = [f"{name} {timer.kernel(fn) * 1e6:.1f}" for name, fn in parts.items()]
        print(f"B={B} ctx={ctx} H/Hk={H}/{Hk} D={D} page={P} splits={plan.splits} grid={plan.grid[0]} "
              f"cluster={getattr(plan, 'cluster', 1)}: "
              + ", ".join(cells) + " us", flush=True)
        del q, k, v, kc, vc, table
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
