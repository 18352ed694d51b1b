"""One prefill case for a profiler run: a few back-to-back public calls of bf16 dense attention
(16k tokens, 16 heads of D), so that ``ncu --launch-skip`` can pick a warm launch.

    python3 tools/ncu_case.py --d 128 --s 2048 [--causal] [--calls 5] [--paged P]

--paged P: the same keys in a paged pool of page size P (pages in a random order), through
flash_attn_varlen_func with block_table (tools/quickbench_sm90.py's paged case).
--torch cudnn|flash: torch SDPA with that backend on the same bits instead of ours (the peer's
kernel under the same profiler, e.g. ``ncu --kernel-name regex:.``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--paged", type=int, default=0, help="page size (0: dense)")
    ap.add_argument("--torch", choices=("cudnn", "flash"), default=None)
    args = ap.parse_args(argv)
    import cupy
    import ml_dtypes

    import cupy_flashattn as fa

    b = max(1, 16384 // args.s)
    shape = (b, args.s, args.heads, args.d)
    q, k, v = (cupy.random.standard_normal(shape, dtype=cupy.float32).astype(ml_dtypes.bfloat16)
               for _ in range(3))
    if args.torch:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
        tq, tk, tv = (torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16).transpose(1, 2)
                      for a in (q, k, v))

        def call():
            with sdpa_kernel([backend[args.torch]]):
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv,
                                                                        is_causal=args.causal)
    elif args.paged:
        import numpy as np

        from quickbench_sm90 import paged_call

        call, _ = paged_call(q, k, v, args.paged, args.causal, np.random.default_rng(0))
        cupy.cuda.runtime.deviceSynchronize()
    else:
        def call():
            return fa.flash_attn_func(q, k, v, causal=args.causal)
    for _ in range(args.calls):
        call()
    cupy.cuda.runtime.deviceSynchronize()
    print(f"ran {args.calls} calls of {shape} causal={args.causal} paged={args.paged} "
          f"torch={args.torch}")


if __name__ == "__main__":
    main()
