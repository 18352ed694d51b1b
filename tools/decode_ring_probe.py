"""Decode kernel time against the L2 flush and the split count (issue 16 / 15 probe).

For each row (B:ctx; --heads H/Hk, 32/8; --dim D, 128; bench_decode.py's paged cache of --page rows, a divisor
of ctx, pages scattered), GPU time of
one decode step (CUDA events around the call; the GPU kept busy by the flush before it, as
bench_decode.py's kernel-only column), ours with the heuristic's split count and each forced
value, and torch SDPA cuDNN on the same K/V (bshd strided views, as bench_decode.py).  Two
flushes before each timed call:

* memset: a 1 GiB memset (bench_decode.py's flush before stop 36).  It leaves the 50 MB L2
  full of dirty lines, so the timed call also pays their write-back while it reads;
* clean: the same memset, then a read-only kernel over 256 MB (measure.L2Flush, bench_decode.py's
  flush since): the L2 holds clean lines of other data, nothing of the flush to write back.

    CUPY_FLASHATTN_SM90_DEFINES=... PYTHONPATH=. python3 tools/decode_ring_probe.py \
        [--rows 64:4096,16:16384,1:4096,1:32768] [--splits 0,8,16,32] [--page 16] [--contig]
        [--kv bf16|fp8] [--layouts nhd,hnd] [--heads 32/8] [--dim 64|128|256] [--splits-all]

--kv fp8: ours over float8 e4m3 bytes (bench_decode.py's quantized cache; cuDNN stays on bf16).
--layouts: the page pool as vLLM lays it out, (pages, P, Hk, D) ("nhd": one key row of a kv
head is D elements, the next row of that head Hk * D further), or FlashInfer's "hnd" layout
(pages, Hk, P, D) passed as its (pages, P, Hk, D) strided view -- a kv head's page is one
contiguous P * D run.  Does the DRAM access pattern of the pool, not the kernel, bound decode?

--splits applies to the rows with fewer CTAs than SMs (B * Hk < 132); the others take the
heuristic's choice only, unless --splits-all (e.g. the wave count of a large batch).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import cupy  # noqa: E402

def main(argv=None):
    import cupy_flashattn as fa
    from bench_decode import FP8_SCALE, Timer, paged_cache, quantized, random_qkv, torch_sdpa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="64:4096,16:16384,1:4096,1:32768")
    ap.add_argument("--splits", default="0,8,16,32")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--contig", action="store_true", help="ours on a contiguous cache, no table")
    ap.add_argument("--kv", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--layouts", default="nhd", help="nhd, hnd or both (comma list); paged only")
    ap.add_argument("--heads", default="32/8", help="H/Hk")
    ap.add_argument("--dim", type=int, default=128, help="head dim (64 / 128 / 256 for --kv fp8)")
    ap.add_argument("--splits-all", action="store_true",
                    help="--splits on every row, not only those of fewer CTAs than SMs")
    args = ap.parse_args(argv)
    (H, Hk), D, P = map(int, args.heads.split("/")), args.dim, args.page
    timers = (Timer("memset"), Timer("clean"))  # bench_decode.py's kernel-only timing

    def kernel_us(fn):
        return [t.kernel(fn) * 1e6 for t in timers]
    tag = os.environ.get("CUPY_FLASHATTN_SM90_DEFINES", "") or "default"
    for row in args.rows.split(","):
        B, ctx = (int(x) for x in row.split(":"))
        q, k, v = random_qkv(B, ctx, H, Hk, D)  # bench_decode.py's inputs and pages
        k8, v8 = quantized(k, v) if args.kv == "fp8" else (k, v)
        fp8_kw = dict(kv_cache_dtype="fp8", k_scale=FP8_SCALE, v_scale=FP8_SCALE) if args.kv == "fp8" else {}
        lens = cupy.full((B,), ctx, dtype=np.int32)
        gbytes = 2 * B * ctx * Hk * D * k8.itemsize / 1e9
        splits = [int(s) for s in args.splits.split(",")] if B * Hk < 132 or args.splits_all else [0]
        ref = None
        cells = []
        for layout in (["contig"] if args.contig else args.layouts.split(",")):
            if layout == "contig":
                kk, vv, tt = k8, v8, None
            else:
                kk, vv, tt = paged_cache(k8, v8, P)
                if layout == "hnd":  # the same pages, each kv head's rows one contiguous run
                    kk, vv = (cupy.ascontiguousarray(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
                              for a in (kk, vv))
            for s in splits:
                def step(s=s, q=q, kk=kk, vv=vv, tt=tt, lens=lens):
                    return fa.flash_attn_with_kvcache(q, kk, vv, cache_seqlens=lens, block_table=tt,
                                                      num_splits=s, **fp8_kw)
                o = step()
                if ref is None:
                    ref = o.astype(np.float32)
                err = float(cupy.abs(o.astype(np.float32) - ref).max())
                tm, tc = kernel_us(step)
                cells.append(f"{layout} s={s or 'auto'}: {tm:.1f}/{tc:.1f} (err {err:.1e})")
            del kk, vv, tt
        if not args.no_peer:
            try:
                run, o = torch_sdpa(q, k, v, "cudnn")  # the contiguous K/V, as bench_decode.py
                tm, tc = kernel_us(run)
                err = float(cupy.abs(cupy.asarray(o.float().contiguous()) - ref).max())
                cells.append(f"cuDNN: {tm:.1f}/{tc:.1f} (err {err:.1e})")
            except Exception as e:  # pragma: no cover -- no torch on this machine
                cells.append(f"cuDNN: n/a ({type(e).__name__}: {str(e)[:80]})")
        print(f"[{tag}] {args.kv} D={D} B={B} ctx={ctx} page={0 if args.contig else P} {gbytes:.3f} GB, us memset/clean flush  "
              + "  ".join(cells), flush=True)
        del q, k, v, k8, v8
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
