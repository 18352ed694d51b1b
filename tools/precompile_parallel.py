"""Compile (and load) every shipped kernel (16-bit families and the float32 / float64 one) on the current GPU with parallel NVRTC processes, so
that a device run's tests and benchmarks start with a warm kernel cache ($CUPY_CACHE_DIR).
Used by tools/device_quick.sh and tools/device_verify.sh.

    PYTHONPATH=. python3 tools/precompile_parallel.py [--jobs 14] [--only _split,_d256] [--no-decode]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _prefill(key):
    from cupy_flashattn._cuda import compile as cc

    cc.get_kernel(cc.KernelKey(*key))


def _device_cc():
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def _decode(_):
    from cupy_flashattn._cuda import decode as dc

    return len(dc.precompile_decode())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--only", default="",
                    help="comma list: only the prefill kernels whose name contains one of these "
                         "(e.g. _split,_d256; NAME$: that name exactly), with the decode kernels")
    ap.add_argument("--no-decode", action="store_true", help="the prefill kernels only")
    args = ap.parse_args(argv)
    only = [x for x in args.only.split(",") if x]
    from cupy_flashattn._cuda import compile as cc

    with ProcessPoolExecutor(args.jobs) as ex:
        # Asked in a worker: CUDA initialised in this process would break the forked workers.
        archs = ["sm80", "sm90"] if ex.submit(_device_cc).result() == 90 else ["sm80"]
        shipped = [k for a in archs for k in cc.shipped_keys(a)] + cc.shipped_precise_keys()
        if only:
            shipped = [k for k in shipped
                       if any(k.name == x[:-1] if x.endswith("$") else x in k.name for x in only)]
        # Every field (wide, split included): KernelKey(*fields) rebuilds the very key.
        keys = [dataclasses.astuple(k) for k in shipped]
        futures = [ex.submit(_prefill, k) for k in keys]
        n = 0 if args.no_decode else ex.submit(_decode, 0).result()
        for f in futures:
            f.result()
    print(f"precompiled {len(keys)} prefill + {n} decode kernels")


if __name__ == "__main__":
    main()
