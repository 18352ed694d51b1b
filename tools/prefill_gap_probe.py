"""Why a public prefill call can run slower back to back than its kernel (bench.py, stop 45:
bf16 D = 128 S = 2048, back to back 523 us a call against 470 kernel-only, cuDNN 477 / 477).

Per row (bf16, 16k tokens, H = 2048 / D, dense), ours next to torch SDPA cuDNN:
  * the launches of the public call (flash_attn_func; its problem captured below the front
    end) and of bench.py's kernel-only problem, and the fields in which the two problems differ;
  * times in us a call, medians of interleaved rounds: "x3" events around 3 back-to-back calls
    (bench.py's kernel-only sample), "x10" wall time of 10 back-to-back calls with one
    synchronisation (bench.py's back-to-back sample), for: the kernel-only plan replayed, the
    public call, the public call's own problem replayed through its plan, and cuDNN;
  * with the GPU busy (one kernel-only launch queued first): the wall time until a call
    returns, and events around 3 calls queued behind the busy launch.

    PYTHONPATH=. python3 tools/prefill_gap_probe.py [--rows D,S,causal;...] [--rounds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def _summary(value):
    if hasattr(value, "shape") and hasattr(value, "strides"):
        return f"{type(value).__module__.split('.')[0]} {value.dtype} {tuple(value.shape)} {tuple(value.strides)}"
    return repr(value)


def main(argv=None):
    import cupy
    import torch
    from bench import Case, _kernel_only, kernel_sample, time_interleaved
    from measure import back_to_back

    import cupy_flashattn._calls as calls
    from cupy_flashattn import _cuda

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="128,2048,0;128,4096,1;64,2048,1;256,2048,0")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)

    captured = []
    original = calls._backend_run

    def capture(xp, problem, plan):
        captured.append(problem)
        return original(xp, problem, plan)

    for item in args.rows.split(";"):
        d, s, causal = (int(x) for x in item.split(","))
        case = Case("bf16", d, s, bool(causal), torch)
        ours = case.user_call("dense")
        bench_problem = case.problem("dense")[0]
        calls._backend_run = capture
        try:
            ours()
        finally:
            calls._backend_run = original
        public_problem = captured[-1]
        row = f"D{d} S{s} {'causal' if causal else 'full'}"
        for name, prob in (("public", public_problem), ("kernel-only", bench_problem)):
            print(f"{row} {name}: {_cuda.describe_launches(prob)}", flush=True)
        for f in dataclasses.fields(public_problem):
            a, b = getattr(public_problem, f.name), getattr(bench_problem, f.name)
            if _summary(a) != _summary(b):
                print(f"{row}   field {f.name}: public {_summary(a)} | kernel-only {_summary(b)}")
        fns = {"kernel-only plan": _kernel_only(bench_problem), "public call": ours,
               "public problem's plan": _kernel_only(public_problem), "cudnn": case.torch_fn("cudnn")}
        x3 = time_interleaved(fns, rounds=args.rounds, sample=kernel_sample)
        x10 = time_interleaved(fns, rounds=args.rounds, sample=lambda fn: back_to_back(fn, 10))
        for name in fns:
            print(f"{row} | {name:22s} | x3 {x3[name] * 1e6:7.1f} | x10 {x10[name] * 1e6:7.1f}", flush=True)
        # Does a call block the host, or only add its host time before its first kernel?  With
        # the GPU busy (one kernel-only launch queued first): "returns" is the wall time until
        # the call returns (its host work alone when nothing blocks), "x3 busy" events around
        # 3 calls queued behind the busy launch (GPU time only, when nothing blocks).
        busy = fns["kernel-only plan"]

        def returns(fn, busy=busy):
            cupy.cuda.runtime.deviceSynchronize()
            busy()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            cupy.cuda.runtime.deviceSynchronize()
            return t1 - t0

        def x3_busy(fn, busy=busy):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            cupy.cuda.runtime.deviceSynchronize()
            busy()
            a.record()
            for _ in range(3):
                fn()
            b.record()
            b.synchronize()
            return cupy.cuda.get_elapsed_time(a, b) * 1e-3 / 3

        ret = time_interleaved(fns, rounds=args.rounds, sample=returns)
        xb = time_interleaved(fns, rounds=args.rounds, sample=x3_busy)
        for name in fns:
            print(f"{row} | {name:22s} | returns after {ret[name] * 1e6:7.1f} | x3 busy {xb[name] * 1e6:7.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
