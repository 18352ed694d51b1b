"""Where a prefill call's "one call" time goes beyond its kernel time, ours next to torch SDPA
cuDNN (same process, bf16, 16k tokens, H = 2048 / D).  Per row, medians in microseconds:

  host     wall time of the Python call alone (GPU idle before it; no synchronisation inside)
  call     one call start to end (benchmarks/measure.one_call: L2 flushed, GPU idle, events)
  call-nf  the same without the L2 flush
  launch   ours: events around the plan's launch alone (no validation / planning), L2 flushed;
           torch: same as call (its call is its launch)
  b2b      events around 3 back-to-back launches, per launch (bench.py's "kernel only")
--variants adds the public call with a preallocated out= and two calls in one timed window.

    PYTHONPATH=. python3 tools/one_call_probe.py [--rows D,S,causal;...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def main(argv=None):
    import cupy
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from measure import one_call

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="128,2048,0;128,8192,0;128,8192,1")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--variants", action="store_true",
                    help="also: the call with out= (the caller's array), and two calls in one window")
    args = ap.parse_args(argv)
    flush_buf = cupy.empty(256 * 2**20, dtype=np.uint8)

    def flush():
        flush_buf.fill(1)
        cupy.cuda.runtime.deviceSynchronize()

    def med(f, n=args.reps):
        return float(np.median([f() for _ in range(n)])) * 1e6

    def host_only(fn):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        r = fn()
        t1 = time.perf_counter()
        cupy.cuda.runtime.deviceSynchronize()
        del r
        return t1 - t0

    from bench import Case, _kernel_only, kernel_sample

    def b2b(fn):  # bench.py's kernel-only sample: events around 3 back-to-back calls
        cupy.cuda.runtime.deviceSynchronize()
        return kernel_sample(fn)

    print("row | who | host | call | call-nf | launch | b2b  (us, medians)")
    for item in args.rows.split(";"):
        d, s, causal = (int(x) for x in item.split(","))
        causal = bool(causal)
        case = Case("bf16", d, s, causal, torch)
        ours = case.user_call("dense")
        launch = _kernel_only(case.problem("dense")[0])  # bench.py's kernel-only path
        for _ in range(3):
            ours(), launch()
        row = f"D{d} S{s} {'causal' if causal else 'full'}"
        print(f"{row} | ours | {med(lambda: host_only(ours)):.0f} | {med(lambda: one_call(ours, flush)):.0f}"
              f" | {med(lambda: one_call(ours)):.0f} | {med(lambda: one_call(launch, flush)):.0f}"
              f" | {med(lambda: b2b(launch)):.0f}", flush=True)
        if args.variants:
            import cupy_flashattn as fa

            b, h = case.b, case.h
            q4, k4, v4 = (a.reshape(b, s, h, d) for a in (case.q, case.k, case.v))
            fixed = cupy.empty_like(q4)

            def ours_out():  # the caller's own output array
                return fa.flash_attn_func(q4, k4, v4, causal=causal, out=fixed)

            def twice():  # a second call right after the first, in the same window
                ours()
                return ours()
            ours_out()
            print(f"{row} | ours out= | {med(lambda: host_only(ours_out)):.0f} | "
                  f"{med(lambda: one_call(ours_out, flush)):.0f} | {med(lambda: one_call(ours_out)):.0f}"
                  f" | - | -", flush=True)
            print(f"{row} | ours x2 | - | {med(lambda: one_call(twice, flush)):.0f} | "
                  f"{med(lambda: one_call(twice)):.0f} | - | -", flush=True)
        tq, tk, tv = case.tq, case.tk, case.tv

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        for _ in range(3):
            cudnn()
        torch.cuda.synchronize()
        print(f"{row} | cudnn | {med(lambda: host_only(cudnn)):.0f} | {med(lambda: one_call(cudnn, flush)):.0f}"
              f" | {med(lambda: one_call(cudnn)):.0f} | - | {med(lambda: b2b(cudnn)):.0f}", flush=True)


if __name__ == "__main__":
    main()
