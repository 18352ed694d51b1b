"""Prefill benchmark: cupy_flashattn vs PyTorch SDPA (flash and cuDNN backends), same process.

python3 benchmarks/bench.py [--out DIR] [--quick] [--sweep] [--dims ..] [--seqs ..] [--dtypes ..]

Rows: bf16/fp16 x D in {64, 128, 256} x S in {512, 2k, 4k, 8k} with 16k tokens per batch
(B = 16k / S, H = 2048 / D), causal and not; then the same work as varlen (mixed lengths
S/2, 3S/2) and paged (page 16 and 256; torch has no paged prefill, so those rows compare with
dense torch).  FLOPs = 4 B H Sq Sk D (half for causal).
--quick: bf16, D = 128, S = 512 and 4096 only (16 rows; meant to take well under 2 minutes).

Each row reports three measurements (docs/performance.md, "The four measurements"; the fourth,
CUDA-graph replay, is for decode rows only), ours beside torch's, all after warm-up:
* one call, start to end (`us_call`, `tflops`, `ms`): CUDA events around the Python call as a
  user makes it -- `flash_attn_func` / `flash_attn_varlen_func` (with `block_table` for paged)
  -- on an idle GPU, so host work and kernels are both inside; median of CALL_ROUNDS.
* back to back (`us_b2b`): wall time per call of many calls, one synchronisation at the end.
* kernel only (`us_kernel`, `tflops_kernel`): ours through the launcher below the public API
  (no validation; the launch plan made once, then replayed), torch's SDPA call; each captured
  in a CUDA graph, events around 3 back-to-back replays.  Graphs since stop 46: before, the
  callables themselves were timed, and torch's host work (a call returned after ~200 us on the
  H100 machine) did not always hide behind its kernels -- cuDNN's kernel-only time at D = 128
  S = 2048 read 465 us through its call against 421-435 us replayed, which had put our kernel
  at 1.01x cuDNN where it is ~0.93x (tools/one_call_anatomy.py, NOTES stop 46).
Ratios (`ratio_flash`, `ratio_cudnn`) are throughput ratios of the one-call times, ours /
theirs (above 1 = ours faster); `ratio_kernel_*` the same for kernel-only times.  Every layout
and provider of a case takes a turn in each round of each measurement (interleaved rounds), so
a row's ratios come from one clock/thermal window.  Inputs are generated on the GPU; torch runs
on the very same bits (DLPack), so every dense row also checks max|ours - torch flash|, and
every paged row checks that the paged output equals the dense one (the cache holds the same
keys, scattered over a random page order); the checked outputs are those of the public call.

--sweep: tile-configuration sweep (bf16, S = 4096, dense + paged, causal and not) over the
variants in SWEEP for each bucket of --dims; prints a table and writes <out>/winner.env with
CUPY_FLASHATTN_TRAITS=... (the fastest correct variant per bucket by non-causal dense TFLOP/s).
--sweep and --paged-diag time kernels only.

Writes <out>/bench.csv, <out>/bench_<dtype>_d<D>_<causal|full>.png (x = seqlen, y = TFLOP/s of
one call, start to end, one line per provider) and the prefill section of <out>/<gpu>.md
(measure.gpu_slug: h200.md on an H200, h100.md on an H100, ...)
(between <!-- prefill:begin --> and <!-- prefill:end -->; everything else in that file is kept).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout, run in place (no install needed)
sys.path.insert(0, HERE)  # measure.py, also when this file is loaded from elsewhere

import measure  # noqa: E402

TOKENS = 16384
# Rounds per measurement (each round gives every provider of a case one sample; medians are
# reported).  One call is a single short sample, so it gets more rounds than the others.
KERNEL_ROUNDS, CALL_ROUNDS, B2B_ROUNDS = 7, 9, 3
# Back-to-back samples last about this long (measure.calls_for: at least 10 calls), judged from
# the FLOPs at ~300 TFLOP/s plus ~20 us of host work per call.  Short, because prefill calls
# are long (0.3-4 ms): 10 calls already amortise the final synchronisation to < 1%, and the
# full run (48 cases x 6 providers x B2B_ROUNDS) stays within tools/device_verify.sh's limit.
B2B_BUDGET_S = 0.01
# Tile variants tried by --sweep: Traits(head_dim, block_m, block_n, warps, min CTAs/SM, Q in regs).
SWEEP = {
    128: [(128, 64, 64, 4, 2, 0), (128, 64, 64, 4, 2, 1), (128, 128, 64, 8, 1, 0),
          (128, 128, 64, 8, 1, 1), (128, 96, 64, 6, 2, 0), (128, 192, 64, 12, 1, 0)],
    64: [(64, 128, 64, 4, 2, 0), (64, 128, 64, 8, 1, 0), (64, 128, 64, 8, 2, 0),
         (64, 128, 128, 8, 1, 0)],
    256: [(256, 64, 32, 4, 2, 0), (256, 128, 64, 8, 1, 0), (256, 64, 64, 4, 1, 0)],
}  # fmt: skip


def kernel_sample(fn, inner=3):
    """Seconds per call from a CUDA-event pair around `inner` back-to-back calls: host-side
    launch work overlaps GPU work instead of being timed (the kernel-only measurement)."""
    import cupy

    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    a.record()
    for _ in range(inner):
        fn()
    b.record()
    b.synchronize()
    return cupy.cuda.get_elapsed_time(a, b) * 1e-3 / inner


def graphed(fns):
    """Each callable of ``fns`` captured in a CUDA graph and replaced by its replay -- torch's
    ("torch:" names) with ``torch.cuda.CUDAGraph``, ours with CuPy's stream capture -- so a
    kernel-only sample holds GPU time only; a callable that cannot be captured stays as it is
    (reported on stderr).  The replays keep the graphs (and their outputs) alive."""
    out = {}
    for name, fn in fns.items():
        capture = measure.torch_graph if name.startswith("torch:") else measure.cupy_graph
        try:
            out[name] = capture(fn)[0]
        except Exception as e:  # a capture failure leaves the eager callable
            print(f"# {name}: not captured ({e}); kernel-only times the call itself", file=sys.stderr)
            out[name] = fn
    return out


def time_interleaved(fns, warmup=3, rounds=KERNEL_ROUNDS, sample=kernel_sample):
    """{name: median seconds per call} for a dict of callables, timed in interleaved rounds.

    Each round takes one `sample(fn)` of every callable (by default kernel_sample; the main
    bench also passes measure.one_call and a back-to-back sample); the median over rounds is
    reported.  Interleaving puts every provider and layout of a case under the same
    clock/thermal state: timing them one after another (v3 and before) let a case's later
    modes read a few percent lower inside a long sweep than alone."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    ts = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            ts[name].append(sample(fn))
    return {name: float(np.median(t)) for name, t in ts.items()}


#: Extra layouts that time the dense problem on a forced prefill family (the path column):
#: on a compute capability 9.0 GPU "dense" runs the sm90 family, "dense-sm80" the mma.sync one.
ARCH_MODES = {"dense-sm80": "sm80"}


def _forced(arch, fn):
    """``fn`` run with the prefill family forced to ``arch`` (a cheap switch, see
    ``force_prefill_arch``; the call cache keeps both paths' plans)."""
    from cupy_flashattn._cuda.launch import force_prefill_arch

    def run():
        force_prefill_arch(arch)
        try:
            return fn()
        finally:
            force_prefill_arch(None)

    return run


def _kernel_only(problem, arch=None):
    """Ours below the public API: the launch plan made once (as the call cache would), then
    replayed -- the kernel's launches and the plan's per-call pointer binding, no validation.
    (Until 2026-12-04 this built a plan per call, which put the plan's host work, e.g. the
    causal sm90 CTA-count search, into the kernel-only times.)"""
    from cupy_flashattn import _cuda

    plan = _forced(arch, lambda: _cuda.plan_attention(problem))() if arch else _cuda.plan_attention(problem)
    return lambda: _cuda.run_attention(problem, plan)


def prefill_modes() -> tuple:
    """The layouts of a case: dense (the default path), the sm80 path beside it on a 9.0 GPU,
    varlen, paged 16 and 256."""
    import cupy

    hopper = int(cupy.cuda.Device().compute_capability) == 90
    return ("dense",) + (tuple(ARCH_MODES) if hopper else ()) + ("varlen", "paged16", "paged256")


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
        self._layouts = {}

    def layout(self, mode):
        """The arrays and lengths of one layout of the case's keys, built once per mode (so the
        kernel-only path and the public call read the very same arrays):
        "dense"; "varlen" (sequences of S/2 and 3S/2, packed); "paged<P>" (pages in a random
        order); "paged<P>i" (identity order, diagnostic only)."""
        if mode not in self._layouts:
            self._layouts[mode] = self._make_layout(mode)
        return self._layouts[mode]

    def _make_layout(self, mode):
        import cupy

        b, s, h, d = self.b, self.s, self.h, self.d
        every = cupy.asarray(np.arange(0, b * s + 1, s, dtype=np.int32))  # b sequences of s
        if mode.startswith("dense"):  # "dense" and "dense-sm80" (ARCH_MODES) share arrays
            return dict(k=self.k, v=self.v, cu_q=every, cu_k=every, max_len=s, flops=self.flops,
                        table=None, page=0)  # fmt: skip
        if mode == "varlen":
            lens = [s // 2, s + s // 2] * (b // 2) if b >= 2 else [s]
            cu = cupy.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
            fl = sum(4.0 * h * L * L * d * (0.5 if self.causal else 1.0) for L in lens)
            return dict(k=self.k, v=self.v, cu_q=cu, cu_k=cu, max_len=max(lens), flops=fl,
                        table=None, page=0)  # fmt: skip
        page = int(mode.replace("paged", "").rstrip("i"))
        assert s % page == 0, f"paged rows need pages that divide S (S = {s}, page {page})"
        nblk = s // page
        perm = np.random.default_rng(page + s).permutation(b * nblk).astype(np.int32)
        if mode.endswith("i"):
            perm = np.arange(b * nblk, dtype=np.int32)
        permc = cupy.asarray(perm)
        kp, vp = cupy.empty((b * nblk, page, h, d), self.npdt), cupy.empty((b * nblk, page, h, d), self.npdt)
        kp[permc] = self.k.reshape(b * nblk, page, h, d)  # page j of seq i -> slot perm[i*nblk+j]
        vp[permc] = self.v.reshape(b * nblk, page, h, d)
        return dict(k=kp, v=vp, cu_q=every, cu_k=every, max_len=s, flops=self.flops,
                    table=permc.reshape(b, nblk), page=page)  # fmt: skip

    def problem(self, mode, out=None):
        """(AttentionProblem, flops) of `mode` for the launcher (the kernel-only path)."""
        import cupy

        from cupy_flashattn.problem import AttentionProblem

        b, s, h, d = self.b, self.s, self.h, self.d
        lay = self.layout(mode)
        out = cupy.empty_like(self.q) if out is None else out
        lse = cupy.empty((h, b * s), np.float32)
        base = dict(q=self.q, k=lay["k"], v=lay["v"], out=out, softmax_lse=lse, batch_size=b,
                    seqlen_q=s, seqlen_k=s, max_seqlen_q=s, max_seqlen_k=s,
                    softmax_scale=d ** -0.5, window_right=0 if self.causal else -1)  # fmt: skip
        if mode == "varlen":
            base.update(seqlen_q=0, seqlen_k=0, max_seqlen_q=lay["max_len"],
                        max_seqlen_k=lay["max_len"], cu_seqlens_q=lay["cu_q"], cu_seqlens_k=lay["cu_k"])
        elif lay["page"]:
            base.update(block_table=lay["table"], page_block_size=lay["page"], seqlen_k=s)
        return AttentionProblem(**base), lay["flops"]

    def user_call(self, mode):
        """A callable making the public call a user would make for `mode` and returning its
        output as is (reshape it to q's shape to compare): `flash_attn_func` on (B, S, H, D)
        views for dense,
        `flash_attn_varlen_func` for varlen, and `flash_attn_varlen_func` with `block_table`
        (the vLLM-style paged prefill) for paged."""
        import cupy_flashattn as fa

        b, s, h, d = self.b, self.s, self.h, self.d
        lay, causal = self.layout(mode), self.causal
        if mode in ARCH_MODES:
            return _forced(ARCH_MODES[mode], self.user_call("dense"))
        if mode == "dense":
            q4, k4, v4 = (a.reshape(b, s, h, d) for a in (self.q, self.k, self.v))
            return lambda: fa.flash_attn_func(q4, k4, v4, causal=causal)
        q, k, v, cu_q, cu_k, n = self.q, lay["k"], lay["v"], lay["cu_q"], lay["cu_k"], lay["max_len"]
        table = lay["table"]
        return lambda: fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, n, n, causal=causal,
                                                 block_table=table)  # fmt: skip

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


def torch_peers(case, providers):
    """{"torch:<backend>": callable} for the torch SDPA backends that can run this case."""
    fns = {}
    if case.torch is None:
        return fns
    for name in providers:
        try:
            fn = case.torch_fn(name)
            fn()  # a backend that cannot run this shape raises here
            fns[f"torch:{name}"] = fn
        except Exception as e:  # backend unavailable
            print(f"# torch {name} failed: {e}", file=sys.stderr)
    return fns


def check_errors(case, probs, call_fns, ref):
    """{mode: max abs difference}: dense vs torch flash (`ref`), paged vs dense (the same keys:
    expect exactly 0), NaN where no comparison is made (varlen).  Checks the public call's
    output where the public call was timed, else the launcher's (`prob.out`)."""
    import cupy

    errs, dense_out = {}, None
    for mode, (prob, _) in probs.items():
        o = call_fns[mode]() if mode in call_fns else prob.out
        o = o.reshape(case.q.shape).astype(np.float32)
        err = float("nan")
        if mode.startswith("dense"):
            dense_out = o if mode == "dense" else dense_out
            if ref is not None:
                err = float(cupy.abs(o - ref).max())
        elif mode.startswith("paged") and dense_out is not None:
            err = float(cupy.abs(o - dense_out).max())
        errs[mode] = err
    return errs


def run_case(case, modes, providers=("flash", "cudnn"), check=True, measures=("kernel",)):
    """Time the layouts `modes` of one case (ours) and the torch `providers` on it.

    Returns (res, tres): res[mode] = {"flops", "err", <measure>: seconds, ...} and
    tres[provider] = {<measure>: seconds, ...} for each of `measures`:
    "kernel" (ours through the launcher, kernel_sample of CUDA-graph replays: graphed), "call" (one public call start to end,
    measure.one_call) and "b2b" (back to back, measure.back_to_back; res also gets
    "b2b_calls").  Torch's callable is its public SDPA call in every measure.  Within a
    measure, every layout and provider takes a turn in each round (time_interleaved)."""
    ref = None
    if check and case.torch is not None:
        try:
            ref = case.torch_out()
        except Exception as e:  # pragma: no cover
            print(f"# torch flash failed: {e}", file=sys.stderr)
    probs = {mode: case.problem(mode) for mode in modes}
    kernel_fns = {mode: _kernel_only(prob, ARCH_MODES.get(mode)) for mode, (prob, _) in probs.items()}
    user_facing = "call" in measures or "b2b" in measures
    call_fns = {mode: case.user_call(mode) for mode in modes} if user_facing else {}
    peers = torch_peers(case, providers)
    times, n_b2b = {}, 0
    if "kernel" in measures:
        times["kernel"] = time_interleaved(graphed({**kernel_fns, **peers}))
    if "call" in measures:
        times["call"] = time_interleaved({**call_fns, **peers}, rounds=CALL_ROUNDS,
                                         sample=measure.one_call)  # fmt: skip
    if "b2b" in measures:
        # The same number of calls for every provider of the case, from its FLOPs.
        n_b2b = measure.calls_for(case.flops / 300e12 + 20e-6, B2B_BUDGET_S)
        times["b2b"] = time_interleaved({**call_fns, **peers}, rounds=B2B_ROUNDS,
                                        sample=lambda fn: measure.back_to_back(fn, n_b2b))  # fmt: skip
    errs = check_errors(case, probs, call_fns, ref) if check else {}
    res = {}
    for mode, (_, fl) in probs.items():
        res[mode] = dict(flops=fl, err=errs.get(mode, float("nan")),
                         **{m: t[mode] for m, t in times.items()})  # fmt: skip
        if n_b2b:
            res[mode]["b2b_calls"] = n_b2b
    tres = {key.split(":", 1)[1]: {m: t[key] for m, t in times.items()} for key in peers}
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
                for mode, r in res.items():
                    row[(causal, mode)] = (r["flops"] / r["kernel"] / 1e12, r["err"])
                if "flash" in tres:
                    row["flash"] = case.flops / tres["flash"]["kernel"] / 1e12
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
            tf = {m: r["flops"] / r["kernel"] for m, r in res.items()}  # kernel-only FLOP/s
            print(f"paged-diag d={d} causal={int(causal)}: " + " ".join(
                f"{m}={tf[m] / 1e12:.0f}({tf[m] / tf['dense']:.2f}x,err {r['err']:.2g})"
                for m, r in res.items()), flush=True)


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


PEERS = ("flash", "cudnn")
MEASURES = ("call", "b2b", "kernel")  # us_<measure> columns, in the order of the CSV and table
CSV_KEYS = (["dtype", "d", "seqlen", "batch", "heads", "causal", "mode"]
            + [f"{p}us_{m}" for p in ("", "flash_", "cudnn_") for m in MEASURES]
            + ["ms", "tflops", "flash_tflops", "ratio_flash", "cudnn_tflops", "ratio_cudnn",
               "tflops_kernel", "flash_tflops_kernel", "ratio_kernel_flash",
               "cudnn_tflops_kernel", "ratio_kernel_cudnn", "b2b_calls", "check_err"])  # fmt: skip


def make_rows(case, res, tres):
    """CSV rows of one case (one per layout).  `tflops` and the `ratio_<peer>` columns come
    from the one-call time (what a user sees); `*_kernel` columns from kernel-only time.
    Metric columns are named so that examples/05_performance.ipynb plots only the
    user-visible TFLOP/s (`tflops`, `<peer>_tflops`; `*_tflops_kernel` is not a metric there)."""
    rows = []
    for mode, r in res.items():
        row = dict(dtype=case.dt, d=case.d, seqlen=case.s, batch=case.b, heads=case.h,
                   causal=int(case.causal), mode=mode)  # fmt: skip
        for m in MEASURES:
            row[f"us_{m}"] = r[m] * 1e6
            for name, t in tres.items():
                row[f"{name}_us_{m}"] = t[m] * 1e6
        row["ms"] = r["call"] * 1e3
        row["tflops"] = r["flops"] / r["call"] / 1e12
        row["tflops_kernel"] = r["flops"] / r["kernel"] / 1e12
        for name, t in tres.items():  # torch's dense time of the same shape (case.flops)
            row[f"{name}_tflops"] = case.flops / t["call"] / 1e12
            row[f"ratio_{name}"] = row["tflops"] / row[f"{name}_tflops"]
            row[f"{name}_tflops_kernel"] = case.flops / t["kernel"] / 1e12
            row[f"ratio_kernel_{name}"] = row["tflops_kernel"] / row[f"{name}_tflops_kernel"]
        row["b2b_calls"] = r["b2b_calls"]
        row["check_err"] = r["err"]
        rows.append(row)
    return rows


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, CSV_KEYS, extrasaction="ignore")  # absent peer: empty cells
        w.writeheader()
        w.writerows(rows)


def _num(x, digits=0) -> str:
    """A table cell: '-' for a missing or NaN value."""
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def _us(x) -> str:
    """Microseconds for a table cell: 3 significant-ish digits, '-' when missing."""
    return _num(x, 0 if x is not None and x >= 100 else 1)


def _trio(r, measure_name) -> str:
    """'ours / flash / cuDNN' microseconds of one measurement."""
    return " / ".join(_us(r.get(f"{p}us_{measure_name}")) for p in ("", "flash_", "cudnn_"))


def results_table(rows, tiles) -> str:
    """The prefill section of results/<gpu>.md.  It leads with the user-visible one-call
    numbers; back-to-back and kernel-only times sit beside them, never alone."""
    md = ["## Prefill (`benchmarks/bench.py`): ours vs torch SDPA, same process\n",
          f"16k tokens per batch (B = 16384 / S, H = 2048 / D).  Tiles: {tiles}.  "
          "**one call**: CUDA events around one Python call as a user makes it (host work + "
          "kernels), median; TFLOP/s and ours/flash, ours/cuDNN (throughput ratios, above 1 = "
          "ours faster) come from it.  **back to back**: wall time per call of many calls, one "
          "synchronisation at the end.  **kernel only**: ours through the launcher below the "
          "public API, torch's SDPA call, events around 3 back-to-back calls.  varlen/paged rows "
          "compare with torch's dense time of the same shape (torch has no paged prefill).  "
          "check (on the public call's output): dense = max|ours - torch flash|, "
          "paged = max|paged - dense| (expect 0).  docs/performance.md explains the columns.\n",
          "| dtype | D | S | causal | mode | one call us: ours / flash / cuDNN | ours TFLOP/s "
          "| ours/flash | ours/cuDNN | back to back us/call: ours / flash / cuDNN "
          "| kernel only us: ours / flash / cuDNN | kernel ours TFLOP/s | kernel ours/flash "
          "| kernel ours/cuDNN | check |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        md.append(f"| {r['dtype']} | {r['d']} | {r['seqlen']} | {r['causal']} | {r['mode']} | "
                  f"{_trio(r, 'call')} | {_num(r['tflops'])} | {_num(r.get('ratio_flash'), 2)} | "
                  f"{_num(r.get('ratio_cudnn'), 2)} | {_trio(r, 'b2b')} | {_trio(r, 'kernel')} | "
                  f"{_num(r['tflops_kernel'])} | {_num(r.get('ratio_kernel_flash'), 2)} | "
                  f"{_num(r.get('ratio_kernel_cudnn'), 2)} | {_check_cell(r['check_err'])} |")
    return "\n".join(md)


def plot_rows(rows, out):
    """One PNG per (dtype, D, causal): x = seqlen, y = TFLOP/s of one call start to end, a line
    per provider (ours per layout, torch's backends on the dense problem), plus our dense
    kernel-only TFLOP/s dotted, so the host cost shows as the gap between the two."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        print("# matplotlib not installed: no prefill plots", file=sys.stderr)
        return
    groups = sorted({(r["dtype"], r["d"], r["causal"]) for r in rows})
    for dt, d, causal in groups:
        sel = [r for r in rows if (r["dtype"], r["d"], r["causal"]) == (dt, d, causal)]
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode in ("dense", *ARCH_MODES, "varlen", "paged16", "paged256"):
            pts = [(r["seqlen"], r["tflops"]) for r in sel if r["mode"] == mode]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"cupy_flashattn {mode}")
        pts = [(r["seqlen"], r["tflops_kernel"]) for r in sel if r["mode"] == "dense"]
        if pts:
            ax.plot(*zip(*pts), marker=".", linestyle=":", color="grey",
                    label="cupy_flashattn dense, kernel only")  # fmt: skip
        for name, label in (("flash", "torch SDPA flash"), ("cudnn", "torch SDPA cuDNN")):
            pts = [(r["seqlen"], r[f"{name}_tflops"]) for r in sel
                   if r["mode"] == "dense" and f"{name}_tflops" in r]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts), marker="s", linestyle="--", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (16k tokens per batch)")
        ax.set_ylabel("TFLOP/s, one call start to end")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{dt} D={d} {'causal' if causal else 'non-causal'} (H200)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"bench_{dt}_d{d}_{'causal' if causal else 'full'}.png"), dpi=100)
        plt.close(fig)


def _print_row(row):
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in row.items()), flush=True)  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--quick", action="store_true",
                    help="bf16, D = 128, S = 512 and 4096 only (16 rows)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--paged-diag", action="store_true")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384")
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
        # S = 512: host-bound end (and issue 15's paged S = 512 row); S = 4096: README's row.
        args.dims, seqs, dtypes = [128], [512, 4096], ["bf16"]
    from cupy_flashattn._cuda import compile as cc

    t_start = time.time()
    rows = []
    for dt in dtypes:
        for d in args.dims:
            for s in seqs:
                for causal in (False, True):
                    case = Case(dt, d, s, causal, torch)
                    res, tres = run_case(case, prefill_modes(), providers=PEERS,
                                         measures=MEASURES)
                    for row in make_rows(case, res, tres):
                        rows.append(row)
                        _print_row(row)
                    del case
    print(f"# bench took {time.time() - t_start:.0f}s", flush=True)
    write_csv(rows, os.path.join(args.out, "bench.csv"))
    from cupy_flashattn._cuda.launch import prefill_arch

    arch, paged_arch = prefill_arch(128, False, False), prefill_arch(128, False, True)
    tiles = f"dense / varlen rows on the {arch} family, paged on {paged_arch}" + (
        " (dense-sm80: the mma.sync family on the same problem)" if arch == "sm90" else "") + "; "
    def tile(d):
        tr, wide = cc.traits(d, arch), cc.traits(d, arch, wide=True)
        alt = (f" ({wide.block_m}x{wide.block_n} without a causal / local window, keys >= "
               f"{cc.SM90_WIDE_MIN_KEYS})"
               if arch == "sm90" and wide.block_n != tr.block_n else "")
        return f"D={d}: {tr.block_m}x{tr.block_n}{alt}, {tr.num_warps} warps"
    tiles += ", ".join(tile(d) for d in args.dims)
    write_md_section(os.path.join(args.out, f"{measure.gpu_slug()}.md"), results_table(rows, tiles))
    try:
        plot_rows(rows, args.out)
    except Exception as e:  # pragma: no cover -- the CSV and table are written already
        print(f"# plot skipped: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
