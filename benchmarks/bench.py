"""Prefill benchmark: cupy_flashattn vs PyTorch SDPA (flash and cuDNN backends), same process.

python3 benchmarks/bench.py [--out DIR] [--quick] [--sweep] [--dims ..] [--seqs ..] [--dtypes ..]

Rows: bf16/fp16 x D in {64, 128, 256} x S in {512, 2k, 4k, 8k} with 16k tokens per batch
(B = 16k / S, H = 2048 / D), causal and not; then the same work as varlen (mixed lengths
S/2, 3S/2) and paged (page 16 and 256; torch has no paged prefill, so those rows compare with
dense torch).  FLOPs = 4 B H Sq Sk D (half for causal).  CUDA-event timing after warm-up, the
median of interleaved rounds (every layout and provider of a case takes a turn in each round).
Inputs are generated on the GPU; torch runs on the very same bits (DLPack), so every dense row
also checks max|ours - torch flash|, and every paged row checks that the paged output equals the
dense one (the cache holds the same keys, scattered over a random page order).

--sweep: tile-configuration sweep (bf16, S = 4096, dense + paged, causal and not) over the
variants in SWEEP for each bucket of --dims; prints a table and writes <out>/winner.env with
CUPY_FLASHATTN_TRAITS=... (the fastest correct variant per bucket by non-causal dense TFLOP/s).

Writes <out>/bench.csv, <out>/bench_<dtype>_d<D>_<causal|full>.png (x = seqlen, y = TFLOP/s,
one line per provider) and the prefill section of <out>/h200.md (between
<!-- prefill:begin --> and <!-- prefill:end -->; everything else in that file is kept).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKENS = 16384
# Tile variants tried by --sweep: Traits(head_dim, block_m, block_n, warps, min CTAs/SM, Q in regs).
SWEEP = {
    128: [(128, 64, 64, 4, 2, 0), (128, 64, 64, 4, 2, 1), (128, 128, 64, 8, 1, 0),
          (128, 128, 64, 8, 1, 1), (128, 96, 64, 6, 2, 0), (128, 192, 64, 12, 1, 0)],
    64: [(64, 128, 64, 4, 2, 0), (64, 128, 64, 8, 1, 0), (64, 128, 64, 8, 2, 0),
         (64, 128, 128, 8, 1, 0)],
    256: [(256, 64, 32, 4, 2, 0), (256, 128, 64, 8, 1, 0), (256, 64, 64, 4, 1, 0)],
}  # fmt: skip


def time_interleaved(fns, warmup=3, rounds=7, inner=3):
    """{name: median seconds per call} for a dict of callables, timed in interleaved rounds.

    Each round times every callable once (a CUDA-event pair around `inner` back-to-back calls,
    so host-side launch overhead overlaps with GPU work instead of being timed); the median over
    rounds is reported.  Interleaving puts every provider and layout of a case under the same
    clock/thermal state: timing them one after another (v3 and before) let a case's later
    modes read a few percent lower inside a long sweep than alone."""
    import cupy

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    ts = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            ts[name].append(cupy.cuda.get_elapsed_time(a, b) * 1e-3 / inner)
    return {name: float(np.median(t)) for name, t in ts.items()}


class Case:
    """Inputs of one (dtype, D, S, causal) point, shared by every provider."""

    def __init__(self, dt, d, s, causal, torch):
        import cupy
        import ml_dtypes

        self.dt, self.d, self.s, self.causal = dt, d, s, causal
        self.npdt = np.dtype(ml_dtypes.bfloat16) if dt == "bf16" else np.dtype(np.float16)
        self.h, self.b = 2048 // d, TOKENS // s
        b, h = self.b, self.h
        shape = (b * s, h, d)
        self.q, self.k, self.v = (cupy.random.standard_normal(shape, np.float32).astype(self.npdt)
                                  for _ in range(3))  # fmt: skip
        self.flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        self.torch = torch
        if torch is not None:
            tdt = torch.bfloat16 if dt == "bf16" else torch.float16
            self.tq, self.tk, self.tv = (
                torch.from_dlpack(a.view(cupy.int16)).view(tdt).view(b, s, h, d).transpose(1, 2)
                for a in (self.q, self.k, self.v))  # fmt: skip

    def problem(self, mode, out=None):
        import cupy

        from cupy_flashattn.problem import AttentionProblem

        b, s, h, d = self.b, self.s, self.h, self.d
        out = cupy.empty_like(self.q) if out is None else out
        lse = cupy.empty((h, b * s), np.float32)
        base = dict(q=self.q, k=self.k, v=self.v, out=out, softmax_lse=lse, batch_size=b,
                    seqlen_q=s, seqlen_k=s, max_seqlen_q=s, max_seqlen_k=s,
                    softmax_scale=d ** -0.5, window_right=0 if self.causal else -1)  # fmt: skip
        if mode == "dense":
            return AttentionProblem(**base), self.flops
        if mode == "varlen":
            lens = [s // 2, s + s // 2] * (b // 2) if b >= 2 else [s]
            cu = cupy.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
            fl = sum(4.0 * h * L * L * d * (0.5 if self.causal else 1.0) for L in lens)
            return AttentionProblem(**dict(base, seqlen_q=0, seqlen_k=0, max_seqlen_q=max(lens),
                                           max_seqlen_k=max(lens), cu_seqlens_q=cu,
                                           cu_seqlens_k=cu)), fl  # fmt: skip
        # "paged<P>": pages in a random order; "paged<P>i": identity order (diagnostic only).
        page = int(mode.replace("paged", "").rstrip("i"))
        nblk = s // page
        perm = np.random.default_rng(page + s).permutation(b * nblk).astype(np.int32)
        if mode.endswith("i"):
            perm = np.arange(b * nblk, dtype=np.int32)
        permc = cupy.asarray(perm)
        kp, vp = cupy.empty((b * nblk, page, h, d), self.npdt), cupy.empty((b * nblk, page, h, d), self.npdt)
        kp[permc] = self.k.reshape(b * nblk, page, h, d)  # page j of seq i -> slot perm[i*nblk+j]
        vp[permc] = self.v.reshape(b * nblk, page, h, d)
        return AttentionProblem(**dict(base, k=kp, v=vp, block_table=permc.reshape(b, nblk),
                                       page_block_size=page, seqlen_k=nblk * page)), self.flops

    def torch_fn(self, name):
        """A callable running torch SDPA with backend `name` ("flash" or "cudnn")."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]
        f = torch.nn.functional.scaled_dot_product_attention

        def run():
            with sdpa_kernel([be]):
                return f(self.tq, self.tk, self.tv, is_causal=self.causal)

        return run

    def torch_out(self):
        """torch flash's output in our (B*S, H, D) layout, as float32 cupy."""
        import cupy

        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            o = torch.nn.functional.scaled_dot_product_attention(
                self.tq, self.tk, self.tv, is_causal=self.causal)
        o = o.transpose(1, 2).contiguous()
        return cupy.from_dlpack(o.float()).reshape(self.q.shape)


def run_case(case, modes, providers=("flash", "cudnn"), check=True):
    """{mode: (seconds, flops, err)} for ours and {provider: seconds} for torch, every layout and
    provider of the case timed in the same interleaved rounds (time_interleaved)."""
    import cupy

    from cupy_flashattn._cuda import launch as _cuda  # the prefill kernel itself

    ref = None
    if check and case.torch is not None:
        try:
            ref = case.torch_out()
        except Exception as e:  # pragma: no cover
            print(f"# torch flash failed: {e}", file=sys.stderr)
    probs = {mode: case.problem(mode) for mode in modes}
    fns = {mode: (lambda prob=prob: _cuda.run_attention(prob)) for mode, (prob, _) in probs.items()}
    if case.torch is not None:
        for name in providers:
            try:
                fn = case.torch_fn(name)
                fn()  # a backend that cannot run this shape raises here
                fns[f"torch:{name}"] = fn
            except Exception as e:  # backend unavailable
                print(f"# torch {name} failed: {e}", file=sys.stderr)
    times = time_interleaved(fns)
    res, dense_out = {}, None
    for mode, (prob, fl) in probs.items():
        err = float("nan")
        if check:
            o = prob.out.astype(np.float32)
            if mode == "dense":
                dense_out = o
                if ref is not None:
                    err = float(cupy.abs(o - ref).max())
            elif mode.startswith("paged") and dense_out is not None:
                err = float(cupy.abs(o - dense_out).max())  # same keys: expect exactly 0
        res[mode] = (times[mode], fl, err)
    tres = {k.split(":", 1)[1]: t for k, t in times.items() if k.startswith("torch:")}
    del probs
    return res, tres


def sweep(args, torch):
    from cupy_flashattn._cuda import compile as cc

    winners, lines = {}, []
    for d in args.dims:
        best = None
        for v in SWEEP.get(d, []):
            tr = cc.Traits(*v)
            cc.override_traits(d, tr)
            row = {}
            for causal in (False, True):
                case = Case("bf16", d, 4096, causal, torch)
                t0 = time.time()
                try:
                    res, tres = run_case(case, ("dense", "paged16", "paged256"),
                                         providers=("flash",) if not causal else ())
                except Exception as e:
                    print(f"# variant {v} causal={causal} failed: {e}", flush=True)
                    res, tres = None, {}
                if res is None:
                    row = None
                    break
                for mode, (t, fl, err) in res.items():
                    row[(causal, mode)] = (fl / t / 1e12, err)
                if "flash" in tres:
                    row["flash"] = case.flops / tres["flash"] / 1e12
                print(f"# sweep d={d} {v} causal={causal} {time.time() - t0:.1f}s", flush=True)
            if row is None:
                continue
            errs = {k: x[1] for k, x in row.items() if k != "flash"}
            ok = all(e != e or e <= (0.05 if m == "dense" else 1e-6) for (c, m), e in errs.items())
            fl = row.get("flash", float("nan"))
            line = (f"| {d} | {v[1]}x{v[2]} {v[3]}w {v[4]}cta q{v[5]} | "
                    + " | ".join(f"{row[(c, m)][0]:.0f}" for c in (False, True)
                                 for m in ("dense", "paged16", "paged256"))
                    + f" | {fl:.0f} | {row[(False, 'dense')][0] / fl:.2f} | "
                    f"{row[(False, 'dense')][1]:.3g} / {row[(False, 'paged16')][1]:.3g} | {'ok' if ok else 'BAD'} |")
            print(line, flush=True)
            lines.append(line)
            if ok and (best is None or row[(False, "dense")][0] > best[0]):
                best = (row[(False, "dense")][0], v)
        cc.override_traits(d, None)
        if best is not None:
            winners[d] = best[1]
    hdr = ("| D | variant | dense | paged16 | paged256 | causal dense | causal paged16 | causal paged256 "
           "| flash | dense/flash | err vs flash / paged-dense | ok |\n|" + "---|" * 12 + "\n")
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write(hdr + "\n".join(lines) + "\n")
    env = ";".join(f"{d}={','.join(map(str, v[1:]))}" for d, v in winners.items())
    with open(os.path.join(args.out, "winner.env"), "w") as f:
        f.write(f"CUPY_FLASHATTN_TRAITS='{env}'\n")
    print(hdr + "\n".join(lines))
    print("winner:", env)


def paged_diag(args, torch):
    """Paged vs dense on the shipped tiles: bf16 S = 4k, each D of --dims, causal and not; page
    sizes 16 and 32 (pages smaller than a key tile: per-row addresses), 64 and 256 (one page
    per tile), random page order; "paged16i": page 16 in identity order (locality check)."""
    modes = ("dense", "paged16", "paged16i", "paged32", "paged64", "paged256")
    for d in args.dims:
        for causal in (False, True):
            case = Case("bf16", d, 4096, causal, torch)
            res, _ = run_case(case, modes, providers=())
            dense = res["dense"][1] / res["dense"][0]
            print(f"paged-diag d={d} causal={int(causal)}: " + " ".join(
                f"{m}={fl / t / 1e12:.0f}({fl / t / dense:.2f}x,err {e:.2g})"
                for m, (t, fl, e) in res.items()), flush=True)


def write_md_section(path, section, tag="prefill"):
    """Replace the <!-- tag:begin --> ... <!-- tag:end --> part of path (other text kept)."""
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    text = open(path).read() if os.path.exists(path) else ""
    block = f"{begin}\n{section.rstrip()}\n{end}"
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = block + "\n" + (("\n" + text) if text.strip() else "")
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")


def _check_cell(err) -> str:
    """The check column: '-' where no comparison is made (varlen rows have no torch twin)."""
    return "-" if err != err else f"{err:.2g}"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--paged-diag", action="store_true")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="512,2048,4096,8192")
    ap.add_argument("--dtypes", default="bf16,fp16")
    args = ap.parse_args(argv)
    try:
        import torch
    except Exception:  # pragma: no cover
        torch = None
    os.makedirs(args.out, exist_ok=True)
    args.dims = [int(x) for x in args.dims.split(",")]
    seqs = [int(x) for x in args.seqs.split(",")]
    dtypes = args.dtypes.split(",")
    if args.sweep:
        return sweep(args, torch)
    if args.paged_diag:
        return paged_diag(args, torch)
    if args.quick:
        args.dims, seqs, dtypes = [128], [2048, 8192], ["bf16"]
    from cupy_flashattn._cuda import compile as cc

    t_start = time.time()
    rows = []
    for dt in dtypes:
        for d in args.dims:
            for s in seqs:
                for causal in (False, True):
                    case = Case(dt, d, s, causal, torch)
                    res, tres = run_case(case, ("dense", "varlen", "paged16", "paged256"))
                    for mode, (t, fl, err) in res.items():
                        tf = fl / t / 1e12
                        row = dict(dtype=dt, d=d, seqlen=s, batch=case.b, heads=case.h,
                                   causal=int(causal), mode=mode, ms=t * 1e3, tflops=tf,
                                   check_err=err)  # fmt: skip
                        for name, tt in tres.items():
                            row[f"{name}_tflops"] = case.flops / tt / 1e12
                            row[f"ratio_{name}"] = tf / row[f"{name}_tflops"]
                        rows.append(row)
                        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in row.items()), flush=True)
                    del case
    print(f"# bench took {time.time() - t_start:.0f}s", flush=True)
    keys = ["dtype", "d", "seqlen", "batch", "heads", "causal", "mode", "ms", "tflops",
            "flash_tflops", "ratio_flash", "cudnn_tflops", "ratio_cudnn", "check_err"]  # fmt: skip
    with open(os.path.join(args.out, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    nan = float("nan")
    tiles = ", ".join(f"D={d}: {cc.traits(d).block_m}x{cc.traits(d).block_n}, "
                      f"{cc.traits(d).num_warps} warps" for d in args.dims)  # fmt: skip
    md = ["## Prefill (`benchmarks/bench.py`): ours vs torch SDPA, same process\n",
          f"16k tokens per batch (B = 16384 / S, H = 2048 / D).  Tiles: {tiles}.  varlen/paged rows "
          "compare with torch's dense time of the same shape (torch has no paged prefill).  "
          "check: dense = max|ours - torch flash|, paged = max|paged - dense| (expect 0).\n",
          "| dtype | D | S | causal | mode | ours TFLOP/s | flash | cuDNN | ours/flash | ours/cuDNN | check |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        md.append(f"| {r['dtype']} | {r['d']} | {r['seqlen']} | {r['causal']} | {r['mode']} | "
                  f"{r['tflops']:.0f} | {r.get('flash_tflops', nan):.0f} | {r.get('cudnn_tflops', nan):.0f} | "
                  f"{r.get('ratio_flash', nan):.2f} | {r.get('ratio_cudnn', nan):.2f} | {_check_cell(r['check_err'])} |")
    write_md_section(os.path.join(args.out, "h200.md"), "\n".join(md))
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
            for name, label in (("flash", "torch SDPA flash"), ("cudnn", "torch SDPA cuDNN")):
                pts = [(r["seqlen"], r[f"{name}_tflops"]) for r in sel
                       if r["mode"] == "dense" and f"{name}_tflops" in r]  # fmt: skip
                if pts:
                    ax.plot(*zip(*pts), marker="s", linestyle="--", label=label)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length (16k tokens per batch)")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{dt} D={d} {'causal' if causal else 'non-causal'} (H200)")
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(os.path.join(args.out, f"bench_{dt}_d{d}_{'causal' if causal else 'full'}.png"), dpi=100)
            plt.close(fig)
    except Exception as e:  # pragma: no cover
        print(f"# plot skipped: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
