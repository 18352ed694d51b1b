"""Issue 13's benchmark rows: causal prefill with and without candle's ``mm_prefix_ranges``,
and head dim 512 (prefill and decode, the sm80 V-split kernels).

Three rows per (path, S), bf16, D=128, 16 heads, 16k tokens per batch:

* ``causal``: plain causal, the baseline;
* ``causal + unused ranges``: the same call with a ``(B, 4, 2)`` ranges array whose entries are
  all unused (start >= end) -- exactly the same visible keys, so the time must stay within 5%
  of the baseline (what the ranges machinery costs when no range touches a tile);
* ``causal + image ranges``: one 576-token range per sequence (a LLaVA-style image) starting
  at S/8 -- more visible keys; TFLOP/s is counted on the pairs actually visible (counted
  exactly on the host), so it compares the kernel's efficiency, not the work.

Head dim 512 (bf16, H=8, Hk=8): prefill S = 1k / 4k (16k tokens per batch, causal and not) and a
decode step (B=16, ctx 4096, one query, GQA 32/8 -> H=32 Hk=8), ours against torch SDPA's
memory-efficient backend (its flash and cuDNN backends stop at D=256), same process.

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


def large_head_dim_rows(rounds):
    """D=512 rows: ours vs torch SDPA efficient (the torch backend that takes D=512)."""
    import cupy
    import ml_dtypes

    import cupy_flashattn as fa

    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:  # torch missing: ours alone
        torch = None
    bf16 = np.dtype(ml_dtypes.bfloat16)
    d, rows = 512, []
    cases = [("prefill", s, c) for s in (1024, 4096) for c in (False, True)] + [("decode", 4096, True)]
    for kind, s, causal in cases:
        if kind == "prefill":
            b, h, hk, sq = TOKENS // s, 8, 8, s
        else:
            b, h, hk, sq = 16, 32, 8, 1
        q = cupy.random.standard_normal((b, sq, h, d), np.float32).astype(bf16)
        k, v = (cupy.random.standard_normal((b, s, hk, d), np.float32).astype(bf16) for _ in range(2))
        if kind == "prefill":
            ours = lambda q=q, k=k, v=v, c=causal: fa.flash_attn_func(q, k, v, causal=c)  # noqa: E731
            flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        else:
            lens = cupy.full((b,), s, np.int32)
            ours = lambda q=q, k=k, v=v, lens=lens: fa.flash_attn_with_kvcache(  # noqa: E731
                q, k, v, cache_seqlens=lens, causal=True)
            flops = 4.0 * b * h * s * d
        fns = {"ours": ours}
        if torch is not None:
            tq, tk, tv = (torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16).transpose(1, 2)
                          for a in (q, k, v))  # fmt: skip
            if kind == "decode":  # torch SDPA has no GQA on this backend: repeat the kv heads
                tk, tv = (t.repeat_interleave(h // hk, dim=1) for t in (tk, tv))

            def peer(tq=tq, tk=tk, tv=tv, c=causal and kind == "prefill"):
                with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=c)

            try:
                peer()
                fns["torch:efficient"] = peer
            except Exception as e:  # noqa: BLE001
                print(f"# torch efficient failed: {e}", file=sys.stderr)
        t_one = time_interleaved(fns, rounds=rounds, sample=measure.one_call)
        t_kernel = time_interleaved(fns, rounds=rounds, sample=kernel_sample)
        for name in fns:
            r = dict(kind=kind, s=s, causal=causal, who=name, one_us=t_one[name] * 1e6,
                     kernel_us=t_kernel[name] * 1e6, tflops=flops / t_kernel[name] * 1e-12)
            rows.append(r)
            print(f"D=512 {kind} S={s} causal={int(causal)} {name:16s} one {r['one_us']:9.1f} us"
                  f"  kernel {r['kernel_us']:9.1f} us  {r['tflops']:6.1f} TFLOP/s", flush=True)
    return rows


def large_table(rows) -> str:
    out = ["", "## Head dim 512 (issue 13): bf16, ours (sm80 V-split kernels) vs torch SDPA efficient",
           "", "Prefill: H=8, 16k tokens per batch; decode: B=16, ctx 4096, H=32, Hk=8 (torch: kv "
           "heads repeated), one query. TFLOP/s from kernel time (decode: 4 B H ctx D).", "",
           "| kind | S / ctx | causal | who | one call (us) | kernel (us) | TFLOP/s |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['kind']} | {r['s']} | {int(r['causal'])} | {r['who']} | {r['one_us']:.1f} | "
                   f"{r['kernel_us']:.1f} | {r['tflops']:.1f} |")
    return "\n".join(out) + "\n"


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
    big = large_head_dim_rows(args.rounds)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    gpu = measure.gpu_slug(name)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{gpu}_features.md")
    with open(path, "w") as f:
        f.write(table(rows, name) + large_table(big))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
