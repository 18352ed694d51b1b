"""Where the time of one prefill call goes, ours next to torch SDPA cuDNN (issue 12: rows whose
one-call ratio sits 5-10% below their kernel-only ratio, stop 45 `first_bench_prefill.txt`).

Per row (bf16, 16k tokens, H = 2048 / D, dense, the inputs of bench.py's Case), interleaved
rounds, medians in us:
  * "call": bench.py's one-call sample (L2 flush, sync, events around the public call);
  * "graph": the same with the call captured in a CUDA graph and replayed (no Python work: the
    cold kernel plus one graph launch);
  * "x3": bench.py's kernel-only sample (3 calls back to back, warm L2); "x10" / "x30": wall
    time per call of 10 / 30 back-to-back calls (sustained load: clocks and power);
  * ours only, "to launch" / "launch to end": events recorded around the public call and just
    before its kernel launch (the Launch object of the plan), so one call splits into the
    host latency before the kernel and the kernel's own time in the one-call state;
  * "host idle" / "host busy": wall time of the public call with the GPU idle / with a kernel
    queued ahead (a call that blocks on the GPU shows here).
Then a cProfile of 20 back-to-back public calls of the first row (GPU busy), by internal time.
With --smi, nvidia-smi samples SM clock and power every 20 ms into <out>/smi.csv during the run.

    PYTHONPATH=. python3 tools/one_call_anatomy.py [--rows D,S,causal;...] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.append(ROOT)  # after PYTHONPATH: an A/B run can put another checkout's package first


def main(argv=None):
    import cupy_flashattn  # before bench.py, which puts this checkout first on sys.path

    print(f"cupy_flashattn from {os.path.dirname(cupy_flashattn.__file__)}", flush=True)
    import cupy
    import numpy as np
    import torch
    from bench import Case, kernel_sample, time_interleaved
    from measure import L2Flush, back_to_back, cupy_graph, one_call, torch_graph

    from cupy_flashattn._cuda import launcher

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="128,2048,0;64,2048,1;256,2048,0;128,8192,0")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default="/tmp/anatomy")
    ap.add_argument("--smi", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="one call and x3 only (no graphs, no sustained runs, no cProfile)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    smi = None
    if args.smi:
        smi_log = open(os.path.join(args.out, "smi.csv"), "w")  # noqa: SIM115 -- until the end
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
             "--format=csv", "-lms", "20"], stdout=smi_log, stderr=subprocess.DEVNULL)
    flush = L2Flush()
    # An event recorded just before every launch of our plans (the first one of a call is the
    # moment the kernel is handed to the driver).
    marks = []
    original_call = launcher.Launch.__call__

    def marked_call(self, pointers):
        if marks is not None and marks and marks[-1] is None:
            ev = cupy.cuda.Event()
            ev.record()
            marks[-1] = ev
        return original_call(self, pointers)

    launcher.Launch.__call__ = marked_call

    def split_call(fn):
        """(start -> first launch, first launch -> end) of one flushed call, in seconds."""
        flush()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        cupy.cuda.runtime.deviceSynchronize()
        marks.append(None)
        start.record()
        r = fn()
        end.record()
        end.synchronize()
        del r
        pre = marks.pop()
        return (cupy.cuda.get_elapsed_time(start, pre) * 1e-3,
                cupy.cuda.get_elapsed_time(pre, end) * 1e-3)

    lines = []
    first_public = None
    for item in args.rows.split(";"):
        d, s, causal = (int(x) for x in item.split(","))
        case = Case("bf16", d, s, bool(causal), torch)
        row = f"D{d} S{s} {'causal' if causal else 'full'}"
        ours, cudnn = case.user_call("dense"), case.torch_fn("cudnn")
        first_public = first_public or ours
        fns = {"ours": ours, "cudnn": cudnn}
        for name, capture, fn in () if args.quick else (("ours graph", cupy_graph, ours), ("cudnn graph", torch_graph, cudnn)):
            try:
                fns[name] = capture(fn)[0]
            except Exception as exc:  # noqa: BLE001 -- report it, go on without that column
                print(f"{row}: {name} not captured: {exc!r}", flush=True)
        res = {}
        res["call"] = time_interleaved(fns, rounds=args.rounds, sample=lambda fn: one_call(fn, flush))
        res["x3"] = time_interleaved(fns, rounds=args.rounds, sample=kernel_sample)
        for n in () if args.quick else (10, 30):
            res[f"x{n}"] = time_interleaved(fns, rounds=3, sample=lambda fn, n=n: back_to_back(fn, n))
        parts = [split_call(ours) for _ in range(args.rounds)]
        to_launch = float(np.median([p[0] for p in parts]))
        launch_to_end = float(np.median([p[1] for p in parts]))

        def host(fn, ahead=None):
            cupy.cuda.runtime.deviceSynchronize()
            if ahead is not None:
                ahead()  # a kernel queued ahead
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            cupy.cuda.runtime.deviceSynchronize()
            return t1 - t0

        ahead = fns.get("ours graph", cudnn)
        h_idle = float(np.median([host(ours) for _ in range(args.rounds)]))
        h_busy = float(np.median([host(ours, ahead) for _ in range(args.rounds)]))
        for name in fns:
            lines.append(f"{row} | {name:12s} | " + " | ".join(
                f"{m} {res[m][name] * 1e6:7.1f}" for m in res))
        lines.append(f"{row} | ours split   | to launch {to_launch * 1e6:6.1f} | launch to end "
                     f"{launch_to_end * 1e6:7.1f} | host idle {h_idle * 1e6:6.1f} | host busy "
                     f"{h_busy * 1e6:6.1f}")
        print("\n".join(lines[-5:]), flush=True)
        fns = case = ahead = None  # free the row's arrays and graphs before the next row
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    launcher.Launch.__call__ = original_call
    marks = None
    if args.quick:
        with open(os.path.join(args.out, "anatomy.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        return

    # cProfile of back-to-back public calls with the GPU busy: a call that waits on the GPU
    # shows its wait as a builtin's internal time.
    prof = cProfile.Profile()
    case = Case("bf16", 128, 2048, False, torch)
    fn = case.user_call("dense")
    fn()
    cupy.cuda.runtime.deviceSynchronize()
    prof.enable()
    for _ in range(20):
        fn()
    prof.disable()
    cupy.cuda.runtime.deviceSynchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    with open(os.path.join(args.out, "anatomy.txt"), "w") as f:
        f.write("\n".join(lines) + "\n\n" + buf.getvalue())
    print(buf.getvalue())
    if smi is not None:
        smi.terminate()
        smi_log.close()


if __name__ == "__main__":
    main()
