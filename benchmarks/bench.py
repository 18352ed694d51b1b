"""Prefill benchmark: cupy_flashattn vs PyTorch SDPA (flash and cuDNN backends), same process.

python3 benchmarks/bench.py [--out DIR] [--quick]

Rows: bf16/fp16 x D in {64, 128, 256} x S in {512, 2k, 8k} with 16k tokens per batch
(B = 16k / S, H = 2048 / D), causal and not; then the same work as varlen (mixed lengths) and
paged (page 16 and 256; torch has no paged prefill, so those rows compare with dense torch).
FLOPs = 4 B H Sq Sk D (half for causal).  CUDA-event timing after warm-up, median of reps.
Writes <out>/bench.csv, <out>/bench_<dtype>_d<D>_<mask>.png and <out>/h200.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def timeit(fn, warmup=3, reps=10):
    import cupy

    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(a, b) * 1e-3)
    return float(np.median(ts))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="512,2048,8192")
    ap.add_argument("--dtypes", default="bf16,fp16")
    args = ap.parse_args(argv)
    import cupy
    import ml_dtypes

    from cupy_flashattn import _cuda
    from cupy_flashattn.problem import AttentionProblem

    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:  # pragma: no cover
        torch = None
    os.makedirs(args.out, exist_ok=True)
    dims = [int(x) for x in args.dims.split(",")]
    seqs = [int(x) for x in args.seqs.split(",")]
    dtypes = args.dtypes.split(",")
    if args.quick:
        dims, seqs, dtypes = [128], [2048, 8192], ["bf16"]
    tokens = 16384
    rows = []
    rng = np.random.default_rng(0)
    for dt in dtypes:
        npdt = np.dtype(ml_dtypes.bfloat16) if dt == "bf16" else np.dtype(np.float16)
        tdt = None if torch is None else (torch.bfloat16 if dt == "bf16" else torch.float16)
        for d in dims:
            h = 2048 // d
            for s in seqs:
                b = tokens // s
                for causal in (False, True):
                    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                    q = cupy.asarray(rng.standard_normal((b * s, h, d), np.float32)).astype(npdt)
                    k = cupy.asarray(rng.standard_normal((b * s, h, d), np.float32)).astype(npdt)
                    v = cupy.asarray(rng.standard_normal((b * s, h, d), np.float32)).astype(npdt)
                    out = cupy.empty_like(q)
                    lse = cupy.empty((h, b * s), np.float32)
                    wr = 0 if causal else -1
                    base = dict(q=q, k=k, v=v, out=out, softmax_lse=lse, batch_size=b,
                                seqlen_q=s, seqlen_k=s, max_seqlen_q=s, max_seqlen_k=s,
                                softmax_scale=d ** -0.5, window_right=wr)  # fmt: skip
                    res = {}
                    res["dense"] = timeit(lambda: _cuda.run_attention(AttentionProblem(**base)))
                    # varlen: same tokens, mixed lengths (s/2, 3s/2 pairs) -> same FLOPs approx
                    lens = [s // 2, s + s // 2] * (b // 2) if b >= 2 else [s]
                    cu = cupy.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
                    vflops = sum(4.0 * h * L * L * d * (0.5 if causal else 1.0) for L in lens)
                    pv = dict(base, seqlen_q=0, seqlen_k=0, max_seqlen_q=max(lens),
                              max_seqlen_k=max(lens), cu_seqlens_q=cu, cu_seqlens_k=cu)  # fmt: skip
                    res["varlen"] = timeit(lambda: _cuda.run_attention(AttentionProblem(**pv)))
                    for page in (16, 256):
                        nblk = s // page
                        perm = rng.permutation(b * nblk).astype(np.int32).reshape(b, nblk)
                        kp = k.reshape(b * nblk, page, h, d)
                        vp = v.reshape(b * nblk, page, h, d)
                        pp = dict(base, k=kp, v=vp, block_table=cupy.asarray(perm),
                                  page_block_size=page, seqlen_k=nblk * page)  # fmt: skip
                        res[f"paged{page}"] = timeit(lambda: _cuda.run_attention(AttentionProblem(**pp)))
                    tres = {}
                    if torch is not None:
                        tq = torch.randn(b, h, s, d, device="cuda", dtype=tdt)
                        tk, tv = torch.randn_like(tq), torch.randn_like(tq)
                        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                            try:
                                with sdpa_kernel([be]):
                                    f = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
                                    tres[name] = timeit(f)
                            except Exception as e:  # backend unavailable
                                print(f"# torch {name} failed: {e}", file=sys.stderr)
                    for mode, t in res.items():
                        fl = vflops if mode == "varlen" else flops
                        tf = fl / t / 1e12
                        row = dict(dtype=dt, d=d, seqlen=s, batch=b, heads=h, causal=int(causal),
                                   mode=mode, ms=t * 1e3, tflops=tf)  # fmt: skip
                        for name, tt in tres.items():
                            row[f"{name}_tflops"] = flops / tt / 1e12
                            row[f"ratio_{name}"] = tf / (flops / tt / 1e12)
                        rows.append(row)
                        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    keys = ["dtype", "d", "seqlen", "batch", "heads", "causal", "mode", "ms", "tflops",
            "flash_tflops", "ratio_flash", "cudnn_tflops", "ratio_cudnn"]  # fmt: skip
    with open(os.path.join(args.out, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(args.out, "h200.md"), "w") as f:
        f.write("| dtype | D | S | causal | mode | ours TFLOP/s | flash | cuDNN | ours/flash | ours/cuDNN |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['dtype']} | {r['d']} | {r['seqlen']} | {r['causal']} | {r['mode']} | {r['tflops']:.0f} | "
                    f"{r.get('flash_tflops', float('nan')):.0f} | {r.get('cudnn_tflops', float('nan')):.0f} | "
                    f"{r.get('ratio_flash', float('nan')):.2f} | {r.get('ratio_cudnn', float('nan')):.2f} |\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        groups = sorted({(r["dtype"], r["d"], r["causal"]) for r in rows})
        for dt, d, causal in groups:
            sel = [r for r in rows if (r["dtype"], r["d"], r["causal"]) == (dt, d, causal)]
            fig, ax = plt.subplots(figsize=(6, 4))
            for mode in ("dense", "varlen", "paged16", "paged256"):
                pts = [(r["seqlen"], r["tflops"]) for r in sel if r["mode"] == mode]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"cupy_flashattn {mode}")
            for name in ("flash", "cudnn"):
                pts = [(r["seqlen"], r[f"{name}_tflops"]) for r in sel if r["mode"] == "dense" and f"{name}_tflops" in r]
                if pts:
                    ax.plot(*zip(*pts), marker="s", linestyle="--", label=f"torch SDPA {name}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.set_title(f"{dt} D={d} {'causal' if causal else 'non-causal'}")
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(os.path.join(args.out, f"bench_{dt}_d{d}_{'causal' if causal else 'full'}.png"), dpi=100)
            plt.close(fig)
    except Exception as e:  # pragma: no cover
        print(f"# plot skipped: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
