"""Why one public prefill call runs ~40 us longer on the GPU timeline than its CUDA-graph replay
(`tools/one_call_anatomy.py`, stop 46: D = 128 S = 2048, x3 506 vs 461 us a call; torch cuDNN
465 vs 421) -- which step of the public call makes the difference.

One row (bf16, 16k tokens, H = 2048 / D, dense; bench.py's Case), variants timed in
interleaved rounds, medians in us: "x3" (bench.py's kernel-only sample: events around 3
back-to-back calls) and "call" (one flushed call, start to end):
  graph          the public call captured in a CUDA graph, replayed
  public         flash_attn_func as a user calls it
  public out=    the same with a preallocated output (no cupy.empty per call)
  own plan       the public call's own cached plan replayed on the problem it saw
  new plan       a plan made from that problem and replayed (bench.py's kernel-only path)
  spin+plan      ``--spin`` us of busy host waiting, then the own-plan replay
  spin+graph     the same wait, then the graph
  cudnn / cudnn graph   torch SDPA, directly and replayed
The graph's output is checked against the public call's.  Then, with --host, where the host
time of the x3 pattern goes: wall time of each of 3 back-to-back public calls (and of
``cupy.empty`` of the output's size alone), and a cProfile of 20 such triples by internal time.

    PYTHONPATH=. python3 tools/launch_gap_probe.py [--row D,S,causal] [--spin US] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, ROOT)


def main(argv=None):
    import cupy
    import torch
    from bench import Case, _kernel_only, kernel_sample, time_interleaved
    from measure import L2Flush, cupy_graph, one_call, torch_graph

    import cupy_flashattn as fa
    import cupy_flashattn._calls as calls
    from cupy_flashattn import _cuda

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="128,2048,0")
    ap.add_argument("--spin", type=float, default=35.0)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--host", action="store_true")
    args = ap.parse_args(argv)
    d, s, causal = (int(x) for x in args.row.split(","))
    case = Case("bf16", d, s, bool(causal), torch)
    public = case.user_call("dense")
    seen = []
    original = calls._backend_run

    def capture(xp, problem, plan):
        plan = original(xp, problem, plan)
        seen.append((problem, plan))
        return plan

    calls._backend_run = capture
    try:
        first = public()
    finally:
        calls._backend_run = original
    problem, own_plan = seen[-1]
    q4, k4, v4 = (a.reshape(case.b, s, case.h, d) for a in (case.q, case.k, case.v))
    out = cupy.empty_like(q4)

    def spin():
        t = time.perf_counter() + args.spin * 1e-6
        while time.perf_counter() < t:
            pass

    graph, graph_out = cupy_graph(public)
    fns = {
        "graph": graph,
        "public": public,
        "public out=": lambda: fa.flash_attn_func(q4, k4, v4, causal=bool(causal), out=out),
        "own plan": lambda: _cuda.run_attention(problem, own_plan),
        "new plan": _kernel_only(problem),
        "spin+plan": lambda: (spin(), _cuda.run_attention(problem, own_plan)),
        "spin+graph": lambda: (spin(), graph()),
        "cudnn": case.torch_fn("cudnn"),
        "cudnn graph": torch_graph(case.torch_fn("cudnn"))[0],
    }
    graph()
    cupy.cuda.runtime.deviceSynchronize()
    err = float(abs(graph_out.astype(cupy.float32) - first.astype(cupy.float32)).max())
    print(f"graph output vs public output: max |diff| = {err}")
    flush = L2Flush()
    x3 = time_interleaved(fns, rounds=args.rounds, sample=kernel_sample)
    call = time_interleaved(fns, rounds=args.rounds, sample=lambda fn: one_call(fn, flush))
    print(f"D{d} S{s} {'causal' if causal else 'full'}, spin {args.spin} us")
    for name in fns:
        print(f"  {name:12s} | x3 {x3[name] * 1e6:7.1f} | call {call[name] * 1e6:7.1f}")
    if args.host:
        host_section(public, q4, fns["public out="])


def host_section(public, q4, public_out):
    """Host wall time (us) of each call of a back-to-back triple, and its cProfile."""
    import cProfile
    import io
    import pstats

    import cupy
    import numpy as np

    print(f"allocator: {cupy.cuda.get_allocator()!r}")

    def triple(fn):
        cupy.cuda.runtime.deviceSynchronize()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        cupy.cuda.runtime.deviceSynchronize()
        return ts

    def alloc():
        return cupy.empty(q4.shape, q4.dtype)

    for name, fn in (("public", public), ("public out=", public_out), ("cupy.empty", alloc)):
        t = np.median(np.array([triple(fn) for _ in range(15)]), axis=0) * 1e6
        print(f"  host us of calls 1 / 2 / 3 of a triple, {name:12s}: "
              + " / ".join(f"{x:6.1f}" for x in t))
    prof = cProfile.Profile()
    for _ in range(20):
        cupy.cuda.runtime.deviceSynchronize()
        prof.enable()
        for _ in range(3):
            public()
        prof.disable()
    cupy.cuda.runtime.deviceSynchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(16)
    print(buf.getvalue())


if __name__ == "__main__":
    main()
