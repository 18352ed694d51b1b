"""B = 1 decode latency against the split count (issue 16: B = 1 at most cuDNN's time).  For
each context, GPU time of one decode step (events around the call, the GPU kept busy by an L2
flush before it, as bench_decode.py's kernel-only column) with ``num_splits`` = the heuristic's
choice (0) and each forced value, next to torch SDPA cuDNN on the same K/V laid out
contiguously.  Tells whether more, smaller splits (more CTAs, fewer key tiles each, a bigger
combine) buy latency, and where the heuristic should stop.

    PYTHONPATH=. python3 tools/decode_split_sweep.py [--ctx 4096,32768] [--splits 0,8,16,...]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def main(argv=None):
    import cupy
    import ml_dtypes

    import cupy_flashattn as fa
    from bench_decode import Timer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", default="4096,32768")
    ap.add_argument("--splits", default="0,4,8,14,20,28,40,56,80")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--heads", default="32/8")
    args = ap.parse_args(argv)
    H, Hk = (int(x) for x in args.heads.split("/"))
    D, P = 128, args.page
    rng = np.random.default_rng(0)
    timer = Timer()
    bf16 = ml_dtypes.bfloat16
    for ctx in (int(x) for x in args.ctx.split(",")):
        nblk = -(-ctx // P)
        k = cupy.asarray(rng.standard_normal((nblk, P, Hk, D)).astype(bf16))
        v = cupy.asarray(rng.standard_normal((nblk, P, Hk, D)).astype(bf16))
        table = cupy.asarray(rng.permutation(nblk).astype(np.int32).reshape(1, nblk))
        lens = cupy.asarray(np.array([ctx], np.int32))
        q = cupy.asarray(rng.standard_normal((1, 1, H, D)).astype(bf16))
        cells = []
        for s in (int(x) for x in args.splits.split(",")):
            def step(s=s):
                return fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                                  causal=True, num_splits=s)
            cells.append(f"splits={s or 'auto'}: {timer.kernel(step) * 1e6:.1f}")
        try:
            import torch
            import torch.nn.functional as F
            from torch.nn.attention import SDPBackend, sdpa_kernel

            kc = torch.randn(1, Hk, ctx, D, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn(1, Hk, ctx, D, device="cuda", dtype=torch.bfloat16)
            tq = torch.randn(1, H, 1, D, device="cuda", dtype=torch.bfloat16)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(tq, kc, vc, enable_gqa=True)
            cells.append(f"cuDNN: {timer.kernel(cudnn) * 1e6:.1f}")
        except Exception as e:  # pragma: no cover -- no torch on this machine
            cells.append(f"cuDNN: n/a ({type(e).__name__})")
        print(f"B=1 ctx={ctx} H/Hk={H}/{Hk} page={P} (us of GPU time)  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
