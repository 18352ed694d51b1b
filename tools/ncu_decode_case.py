"""One decode case for a profiler run: a few back-to-back flash_attn_with_kvcache calls (one new
query token per sequence, bf16, D = 128, bench_decode.py's scattered paged cache), so that
``ncu --launch-skip`` can pick a warm launch of the kernel it profiles (on a 9.0 GPU the MQA
rows run the sm90 split kernel with swapped rows, then the combine kernel).

    python3 tools/ncu_decode_case.py --b 64 --ctx 4096 [--heads 32/1] [--page 16] [--calls 5]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--heads", default="32/1")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args(argv)
    import cupy
    import numpy as np
    from bench_decode import paged_cache, random_qkv

    import cupy_flashattn as fa

    H, Hk = map(int, args.heads.split("/"))
    q, k, v = random_qkv(args.b, args.ctx, H, Hk, 128)
    kc, vc, table = paged_cache(k, v, args.page)
    del k, v
    lens = cupy.full((args.b,), args.ctx, dtype=np.int32)
    for _ in range(args.calls):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
