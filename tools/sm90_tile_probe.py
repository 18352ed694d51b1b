"""Correctness probe for an sm90 tile variant ($CUPY_FLASHATTN_SM90_DEFINES, e.g.
FA_SM90_BLOCKN_128=176) before its benchmark: dense and varlen (non-paged) problems with awkward
lengths, causal / local / softcap / ALiBi / GQA, checked against the float64 reference with the
test suite's bound (tests/gpu/test_gpu_kernels.py: check).  Compiles only the kernels it needs,
in parallel.  A development tool: the GPU suite is the verification of record.

    PYTHONPATH=. python3 tools/sm90_tile_probe.py [--dims 64,128,256]
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "gpu")]


def _compile(key):
    from cupy_flashattn._cuda import compile as cc

    cc.get_kernel(cc.KernelKey(*key))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    args = ap.parse_args(argv)
    dims = [int(x) for x in args.dims.split(",")]
    with ProcessPoolExecutor(8) as ex:
        keys = [(dt, d, tf, False, "sm90") for dt in ("bf16", "f16") for d in dims for tf in (False, True)]
        for f in [ex.submit(_compile, k) for k in keys]:
            f.result()

    import numpy as np

    from cupy_flashattn._cuda.launch import force_prefill_arch
    from test_gpu_kernels import check, make_problem

    force_prefill_arch("sm90")
    cases = [
        dict(lens_q=[97, 97], lens_k=[131, 131]),
        dict(lens_q=[1025], lens_k=[1025], causal=True),
        dict(lens_q=[1025], lens_k=[1025]),
        dict(lens_q=[300], lens_k=[1000], causal=True),
        dict(lens_q=[1], lens_k=[2048]),
        dict(lens_q=[2048], lens_k=[1], causal=True),
        dict(lens_q=[113, 700, 1], lens_k=[203, 900, 177], causal=True),  # varlen
        dict(lens_q=[777], lens_k=[777], window=(200, 0)),
        dict(lens_q=[513], lens_k=[999], softcap=30.0, alibi=True, causal=True),
        dict(lens_q=[640], lens_k=[640], h=8, hk=2),
        dict(lens_q=[4096], lens_k=[4096], h=2),
    ]
    failed = 0
    for d in dims:
        for i, kw in enumerate(cases):
            for dtype in ("bf16", "f16") if i == 0 else ("bf16",):
                kw2 = dict(kw)
                kw2.setdefault("h", 4)
                rng = np.random.default_rng(1000 * d + i)
                try:
                    check(make_problem(rng, dtype=dtype, d=d, **kw2))
                    status = "ok"
                except AssertionError as e:
                    failed += 1
                    status = "FAIL " + str(e).splitlines()[0][:160]
                print(f"D{d} {dtype} case {i} {kw}: {status}", flush=True)
    force_prefill_arch(None)
    print(f"probe: {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
