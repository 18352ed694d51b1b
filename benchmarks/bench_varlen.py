"""Varlen prefill as a serving batch has it: B sequences of mixed lengths, packed, causal.

Issue 15's row: 16 sequences of 256-1024 tokens (fixed seed), D = 128, bf16, GQA 32/8 and MHA
16/16.  Ours is ``flash_attn_varlen_func``; the peer is torch's own varlen entry point,
``torch.ops.aten._flash_attention_forward`` with ``cum_seq_q/k`` (the FlashAttention-2 kernel
torch ships; SDPA itself has no varlen form).  Both are timed as a user calls them
(``measure.py``): one call start to end, and back-to-back calls.  The attention work counts
only the visible (causal) pairs of each sequence.

    PYTHONPATH=. python3 benchmarks/bench_varlen.py [--out DIR]   (also run by `make bench`)
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import measure  # noqa: E402

import cupy_flashattn as fa  # noqa: E402


def lengths(batch: int, lo: int, hi: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(lo, hi + 1, batch)


def causal_flops(lens, heads: int, d: int) -> float:
    """4 D flops per visible (query, key) pair (two matmuls), causal pairs per sequence."""
    pairs = sum(int(n) * (int(n) + 1) // 2 for n in lens)
    return 4.0 * d * heads * pairs


def run_row(torch, lens, H, Hk, D, reps=30):
    import cupy

    total = int(lens.sum())
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    max_len = int(lens.max())
    tq = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16)
    tk = torch.randn(total, Hk, D, device="cuda", dtype=torch.bfloat16)
    tv = torch.randn(total, Hk, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (cupy.from_dlpack(t) for t in (tq, tk, tv))
    cu_dev = cupy.asarray(cu)
    tcu = torch.as_tensor(cu, device="cuda")

    def ours():
        return fa.flash_attn_varlen_func(q, k, v, cu_dev, cu_dev, max_len, max_len, causal=True)

    # aten's flash kernel needs k/v with H heads (no GQA in this entry point before 2.5);
    # expanded views cost a copy, made once outside the timed call.
    tk_full = tk.repeat_interleave(H // Hk, dim=1) if Hk != H else tk
    tv_full = tv.repeat_interleave(H // Hk, dim=1) if Hk != H else tv

    def aten():
        return torch.ops.aten._flash_attention_forward(
            tq, tk_full, tv_full, tcu, tcu, max_len, max_len, 0.0, True, False)

    row = {"B": len(lens), "total": total, "H": H, "Hk": Hk, "D": D}
    flops = causal_flops(lens, H, D)
    for name, fn in (("ours", ours), ("aten", aten)):
        try:
            fn()
            measure.synchronize()
            t_call = measure.median_one_call(fn, reps)
            t_b2b = measure.back_to_back(fn, measure.calls_for(t_call))
        except Exception as exc:  # a peer missing on this torch build: say so, keep going
            print(f"  {name}: unavailable ({type(exc).__name__}: {exc})")
            t_call = t_b2b = float("nan")
        row[f"{name}_us_call"] = t_call * 1e6
        row[f"{name}_us_b2b"] = t_b2b * 1e6
        row[f"{name}_tflops"] = flops / t_call / 1e12
    # Same math: compare ours with aten on the output (bf16 both; loose bound).
    try:
        o_ours = cupy.asnumpy(ours()).astype(np.float32)
        o_aten = aten()[0].float().cpu().numpy()
        row["max_diff_vs_aten"] = float(np.abs(o_ours - o_aten).max())
    except Exception:
        row["max_diff_vs_aten"] = float("nan")
    row["ratio_call"] = row["aten_us_call"] / row["ours_us_call"]
    row["ratio_b2b"] = row["aten_us_b2b"] / row["ours_us_b2b"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results"),
                    help="directory for varlen.csv (default: benchmarks/results)")
    args = ap.parse_args(argv)
    import torch

    rows = []
    for H, Hk in ((32, 8), (16, 16)):
        for B, lo, hi in ((16, 256, 1024), (64, 64, 512)):
            r = run_row(torch, lengths(B, lo, hi), H, Hk, 128)
            rows.append(r)
            print(f"varlen causal B={r['B']} total={r['total']} H={H} Hk={Hk} D=128: "
                  f"ours {r['ours_us_call']:.0f} us/call ({r['ours_tflops']:.0f} TFLOP/s), "
                  f"b2b {r['ours_us_b2b']:.0f} | aten varlen {r['aten_us_call']:.0f} us/call "
                  f"({r['aten_tflops']:.0f} TFLOP/s), b2b {r['aten_us_b2b']:.0f} | "
                  f"ratio (aten/ours) call {r['ratio_call']:.2f} b2b {r['ratio_b2b']:.2f} | "
                  f"max|ours-aten| {r['max_diff_vs_aten']:.3g}")
    if args.out:
        import csv

        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "varlen.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
