"""Issue 13's benchmark rows: causal prefill with and without candle's ``mm_prefix_ranges``.

Three rows per (path, S), bf16, D=128, 16 heads, 16k tokens per batch:

* ``causal``: plain causal, the baseline;
* ``causal + unused ranges``: the same call with a ``(B, 4, 2)`` ranges array whose entries are
  all unused (start >= end) -- exactly the same visible keys, so the time must stay within 5%
  of the baseline (what the ranges machinery costs when no range touches a tile);
* ``causal + image ranges``: one 576-token range per sequence (a LLaVA-style image) starting
  at S/8 -- more visible keys; TFLOP/s is counted on the pairs actually visible (counted
  exactly on the host), so it compares the kernel's efficiency, not the work.

Each row: one call start to end (``measure.one_call``, host work included), back-to-back calls
(``measure.back_to_back``), and kernel-only time (the launch plan replayed, as bench.py), each
the median over interleaved rounds.  Writes ``results/<gpu>_features.md``.

    PYTHONPATH=. python3 benchmarks/bench_features.py [--seqs 1024,4096] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import measure  # noqa: E402
from bench import _forced, kernel_sample, time_interleaved  # noqa: E402

TOKENS, HEADS, D, IMAGE = 16384, 16, 128, 576


def visible_pairs(s: int, ranges_row) -> int:
    """Visible (query, key) pairs of one causal sequence of length s with these ranges (the
    rule of reference.py: row i sees keys <= i, plus the whole range holding i)."""
    last = np.arange(s)
    for start, end in ranges_row:
        if start < end:
            last[start:end] = np.maximum(last[start:end], min(end, s) - 1)
    return int((last + 1).sum())


def run(seqs, paths, rounds):
    import cupy
    import ml_dtypes

    import cupy_flashattn as fa

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rows = []
    for s in seqs:
        b = TOKENS // s
        q, k, v = (cupy.random.standard_normal((b, s, HEADS, D), np.float32).astype(bf16)
                   for _ in range(3))  # fmt: skip
        unused = cupy.zeros((b, 4, 2), np.int32)
        image = np.zeros((b, 4, 2), np.int32)
        image[:, 0] = (s // 8, min(s, s // 8 + IMAGE))
        image_d = cupy.asarray(image)
        pairs = {"causal": visible_pairs(s, []), "causal + unused ranges": visible_pairs(s, []),
                 "causal + image ranges": visible_pairs(s, image[0])}
        calls = {
            "causal": lambda: fa.flash_attn_func(q, k, v, causal=True),
            "causal + unused ranges": lambda: fa.flash_attn_func(q, k, v, causal=True,
                                                                 mm_prefix_ranges=unused),
            "causal + image ranges": lambda: fa.flash_attn_func(q, k, v, causal=True,
                                                                mm_prefix_ranges=image_d),
        }
        for path in paths:
            fns = {name: _forced(path, fn) for name, fn in calls.items()}
            t_kernel = time_interleaved(fns, rounds=rounds, sample=kernel_sample)
            t_one = time_interleaved(fns, rounds=rounds, sample=measure.one_call)
            t_b2b = time_interleaved(fns, rounds=rounds,
                                     sample=lambda fn: measure.back_to_back(fn, 10))
            base = t_kernel["causal"]
            for name in calls:
                flops = 4.0 * b * HEADS * D * pairs[name]
                rows.append(dict(path=path, s=s, row=name, one_us=t_one[name] * 1e6,
                                 b2b_us=t_b2b[name] * 1e6, kernel_us=t_kernel[name] * 1e6,
                                 tflops=flops / t_kernel[name] * 1e-12,
                                 vs_causal=t_kernel[name] / base))
                r = rows[-1]
                print(f"{path} S={s:5d} {name:24s} one {r['one_us']:8.1f} us  b2b {r['b2b_us']:8.1f} us"
                      f"  kernel {r['kernel_us']:8.1f} us  {r['tflops']:6.1f} TFLOP/s"
                      f"  time/causal {r['vs_causal']:.3f}", flush=True)
    return rows


def table(rows, gpu) -> str:
    out = [f"## Prefix ranges (issue 13): causal prefill, bf16, D={D}, H={HEADS}, {TOKENS} tokens "
           f"per batch ({gpu})", "",
           "Kernel time / causal: the unused-ranges row does exactly the causal work (target "
           "<= 1.05); the image row does more work, so compare its TFLOP/s (counted on the pairs "
           "it sees).", "",
           "| path | S | row | one call (us) | back-to-back (us) | kernel (us) | TFLOP/s | kernel time / causal |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['path']} | {r['s']} | {r['row']} | {r['one_us']:.1f} | {r['b2b_us']:.1f} | "
                   f"{r['kernel_us']:.1f} | {r['tflops']:.1f} | {r['vs_causal']:.3f} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    import cupy

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    cc = int(cupy.cuda.Device().compute_capability)
    paths = ["sm90", "sm80"] if cc == 90 else ["sm80"]
    rows = run([int(x) for x in args.seqs.split(",")], paths, args.rounds)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    gpu = "h200" if "H200" in name else name.lower().replace(" ", "_")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{gpu}_features.md")
    with open(path, "w") as f:
        f.write(table(rows, name))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
