"""float32 / float64 prefill: cupy_flashattn vs torch SDPA in the same process (issue 14).

    PYTHONPATH=. python3 benchmarks/bench_precise.py [--out DIR] [--dims 64,128]
        [--seqs 1024,4096,16384] [--dtypes f32,f64]     (also run by `make bench`)

Rows: float32 and float64, D in {64, 128}, S in {1k, 4k, 16k} with 16k tokens per batch
(B = 16k / S, H = 16), causal and not.  float32 peers: torch SDPA's memory-efficient backend
(its only fused float32 path; CUTLASS 3xTF32 on sm_80+) and, for S <= 4k, the math backend
(unfused, O(S^2) memory); ours at "highest" (the default: on a 9.0 GPU the sm90 kernel over
float16 hi / lo planes, elsewhere 3xTF32 on sm80 -- on a 9.0 GPU also forced to sm80 as
"ours-sm80-3xtf32") and "high" (TF32 on sm80, "ours-tf32").  float64:
torch's math backend (S <= 4k; the only float64 path) against ours (DMMA).
Per row: one call start to end (CUDA events around the public call, host work included;
`ms`, `tflops`), back to back (`us_b2b`: wall time per call of many calls, one sync), ours
kernel-only (`ms_kernel`: the launch plan replayed), and the measured error of each provider:
max|out - ref| / max|ref| on the first sequence's last 512 queries of its first two heads,
against the float64 reference (NumPy, in the same run).  FLOPs = 4 B H S^2 D (half for causal).
Writes <out>/bench_precise.csv and the precise section of <out>/<gpu>.md
(between <!-- precise:begin --> and <!-- precise:end -->).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import measure  # noqa: E402
from bench import kernel_sample, time_interleaved, write_md_section  # noqa: E402

import cupy_flashattn as fa  # noqa: E402

TOKENS, HEADS = 16384, 16
MATH_MAX_S = 4096  # torch's math backend materialises B H S^2 scores: 16 GB at S = 16k
ERR_HEADS = 2      # error measured on sequence 0, heads 0..1, its last ERR_ROWS queries
ERR_ROWS = 512     # (the float64 reference is NumPy; the last rows keep the causal alignment)


def reference(q, k, v, causal):
    """float64 attention of sequence 0's last ERR_ROWS queries, heads [0, ERR_HEADS)."""
    from cupy_flashattn.reference import attention_ref

    kv = (0, slice(None), slice(0, ERR_HEADS))
    qq = np.asarray(q[0, -ERR_ROWS:, :ERR_HEADS].get(), np.float64)
    return attention_ref(qq, *(np.asarray(a[kv].get(), np.float64) for a in (k, v)), causal=causal)


def rel_err(out, ref) -> float:
    o = np.asarray(out[0, -ERR_ROWS:, :ERR_HEADS].get(), np.float64)
    return float(np.abs(o - ref).max() / np.abs(ref).max())


def ours(q, k, v, causal, mode, arch=None):
    """(public call, kernel-only callable) of ours at float32 precision `mode`; `arch` forces
    the prefill family ("sm80": the 3xTF32 kernel where the default is sm90's planes)."""
    from cupy_flashattn import _cuda
    from cupy_flashattn._cuda.launch import force_prefill_arch
    from cupy_flashattn.problem import AttentionProblem

    import cupy

    B, S, H, D = q.shape

    def call():
        fa.set_float32_precision(mode)
        force_prefill_arch(arch)
        return fa.flash_attn_func(q, k, v, causal=causal)

    fa.set_float32_precision(mode)
    force_prefill_arch(arch)
    rows = (B * S, H, D)
    lse_dtype = np.float64 if q.dtype == np.float64 else np.float32
    prob = AttentionProblem(q=q.reshape(rows), k=k.reshape(rows), v=v.reshape(rows),
                            out=cupy.empty(rows, q.dtype), softmax_lse=cupy.empty((H, B * S), lse_dtype),
                            batch_size=B, seqlen_q=S, seqlen_k=S, max_seqlen_q=S, max_seqlen_k=S,
                            softmax_scale=D ** -0.5, window_right=0 if causal else -1)
    plan = _cuda.plan_attention(prob)
    force_prefill_arch(None)

    def kernel():
        return _cuda.run_attention(prob, plan)

    return call, kernel


def torch_call(torch, q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    tq, tk, tv = (torch.from_dlpack(a).transpose(1, 2) for a in (q, k, v))
    f = torch.nn.functional.scaled_dot_product_attention

    def run():
        with sdpa_kernel([be]):
            return f(tq, tk, tv, is_causal=causal)

    return run


def torch_err(fn, ref):
    import cupy

    o = fn().transpose(1, 2)
    return rel_err(cupy.from_dlpack(o.contiguous()), ref)


def run_row(torch, dt, D, S, causal):
    import cupy

    npdt = np.dtype(np.float32 if dt == "f32" else np.float64)
    B = max(1, TOKENS // S)
    q, k, v = (cupy.random.standard_normal((B, S, HEADS, D), np.float32).astype(npdt) for _ in range(3))
    flops = 4.0 * B * HEADS * S * S * D * (0.5 if causal else 1.0)
    ref = reference(q, k, v, causal)
    calls, kernels, errs = {}, {}, {}
    # "high" forced to sm80: TF32 on mma.sync (a 9.0 GPU would run it on the planes kernel).
    variants = ((("highest", None), ("highest", "sm80"), ("high", "sm80")) if dt == "f32"
                else (("highest", None),))
    on_hopper = int(cupy.cuda.Device().compute_capability) == 90
    for mode, arch in variants:
        if (mode, arch) == ("highest", "sm80") and not on_hopper:
            continue  # the default there
        name = {("highest", None): "ours", ("highest", "sm80"): "ours-sm80-3xtf32",
                ("high", "sm80"): "ours-tf32"}[(mode, arch)]
        calls[name], kernels[name] = ours(q, k, v, causal, mode, arch)
        errs[name] = rel_err(calls[name](), ref)
    from cupy_flashattn._cuda.launch import force_prefill_arch

    force_prefill_arch(None)
    fa.set_float32_precision("highest")
    peers = ("efficient", "math") if dt == "f32" else ("math",)
    if torch is not None:
        for be in peers:
            if be == "math" and S > MATH_MAX_S:
                continue
            try:
                fn = torch_call(torch, q, k, v, causal, be)
                errs[f"torch:{be}"] = torch_err(fn, ref)
                calls[f"torch:{be}"] = fn
            except Exception as e:  # backend cannot run this case
                print(f"# torch {be} failed: {type(e).__name__}: {e}"[:200], file=sys.stderr)
    slow = S > 4096 or dt == "f64"
    t_call = time_interleaved(calls, warmup=1, rounds=3 if slow else 5, sample=measure.one_call)
    n = measure.calls_for(t_call["ours"], 0.05, lo=3, hi=50)
    t_b2b = time_interleaved(calls, warmup=0, rounds=2, sample=lambda fn: measure.back_to_back(fn, n))
    t_kernel = time_interleaved(kernels, warmup=1, rounds=3 if slow else 5,
                                sample=lambda fn: kernel_sample(fn, inner=2))
    fa.set_float32_precision("highest")
    rows = []
    for name in calls:
        rows.append(dict(dtype=dt, d=D, s=S, causal=int(causal), provider=name,
                         ms=t_call[name] * 1e3, tflops=flops / t_call[name] / 1e12,
                         us_b2b=t_b2b[name] * 1e6, ms_kernel=t_kernel[name] * 1e3 if name in t_kernel else float("nan"),
                         rel_err=errs[name]))
    base = {r["provider"]: r for r in rows}
    peer = base.get("torch:efficient") or base.get("torch:math")
    for r in rows:
        r["ratio_peer"] = peer["ms"] / r["ms"] if peer else float("nan")
    del q, k, v
    cupy.get_default_memory_pool().free_all_blocks()
    return rows


def markdown(rows) -> str:
    lines = ["## float32 / float64 prefill (`benchmarks/bench_precise.py`)", "",
             "One call start to end (host work included), 16k tokens, H = 16; ratio = peer's time / "
             "this provider's (peer: torch SDPA memory-efficient for float32, math for float64); "
             "error = max|out - ref| / max|ref| vs the float64 reference.", "",
             "| dtype | D | S | causal | provider | ms | TFLOP/s | us b2b | kernel ms | ratio vs peer | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['d']} | {r['s']} | {r['causal']} | {r['provider']} | "
                     f"{r['ms']:.2f} | {r['tflops']:.1f} | {r['us_b2b']:.0f} | {r['ms_kernel']:.2f} | "
                     f"{r['ratio_peer']:.2f} | {r['rel_err']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--dtypes", default="f32,f64")
    args = ap.parse_args(argv)
    try:
        import torch
    except Exception:
        torch = None
    rows = []
    for dt in args.dtypes.split(","):
        for D in map(int, args.dims.split(",")):
            for S in map(int, args.seqs.split(",")):
                for causal in (False, True):
                    for r in run_row(torch, dt, D, S, causal):
                        rows.append(r)
                        print(f"{r['dtype']} d={r['d']} s={r['s']} causal={r['causal']} {r['provider']:16s} "
                              f"{r['ms']:8.2f} ms {r['tflops']:6.1f} TFLOP/s b2b {r['us_b2b']:8.0f} us "
                              f"kernel {r['ms_kernel']:7.2f} ms x{r['ratio_peer']:.2f} err {r['rel_err']:.1e}",
                              flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_precise.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_md_section(os.path.join(args.out, f"{measure.gpu_slug()}.md"), markdown(rows), tag="precise")


if __name__ == "__main__":
    main()
