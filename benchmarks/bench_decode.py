"""Decode benchmark: flash_attn_with_kvcache (one new query token per sequence) on a contiguous
and a paged KV cache, beside PyTorch SDPA (FlashAttention-2 and cuDNN backends) on the same K/V
laid out contiguously, all in one process, plus a device-to-device copy for the bandwidth ceiling.

Bandwidth = bytes of K and V read / time.  Copy bandwidth = (read + write bytes) / time of a
cudaMemcpy D2D of 1 GiB (DESIGN.md's 4.2 TB/s convention); "frac" = ours / copy bandwidth.
Timing: CUDA events around each call, a 1 GiB memset before each call (flushes the 60 MB L2 and
keeps the GPU busy while the host prepares the call, so host overhead is not timed), median.

    PYTHONPATH=. python3 benchmarks/bench_decode.py [--quick] [--out DIR]
    PYTHONPATH=. python3 benchmarks/bench_decode.py --smoke     # small shapes for memcheck
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cupy  # noqa: E402
import ml_dtypes  # noqa: E402

import cupy_flashattn as fa  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
MAX_KV_BYTES = 40 << 30


def fill_random(a, rng_seed=0):
    """Fill a bf16 cupy array with N(0, 1) values chunk by chunk (bounded temporary memory)."""
    flat = a.reshape(-1)
    chunk = 1 << 26
    rs = cupy.random.RandomState(rng_seed)
    for i in range(0, flat.size, chunk):
        n = min(chunk, flat.size - i)
        flat[i : i + n] = rs.standard_normal(n, dtype=np.float32).astype(a.dtype)


class Timer:
    def __init__(self):
        self.flush = cupy.empty(1 << 30, dtype=np.uint8)

    def __call__(self, fn, reps=10, warmup=2):
        for _ in range(warmup):
            fn()
        evs = []
        for _ in range(reps):
            cupy.cuda.runtime.memsetAsync(self.flush.data.ptr, 0, self.flush.nbytes, 0)
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            s.record()
            fn()
            e.record()
            evs.append((s, e))
        evs[-1][1].synchronize()
        return float(np.median([cupy.cuda.get_elapsed_time(s, e) for s, e in evs])) * 1e-3  # s


def copy_bandwidth(timer):
    n = 1 << 30
    a, b = cupy.empty(n, np.uint8), cupy.empty(n, np.uint8)
    a.fill(1)
    t = timer(lambda a=a, b=b: cupy.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, n, 3, 0), reps=10)
    del a, b
    return 2 * n / t


def torch_sdpa(q, k, v, backend):
    """SDPA on q (B, 1, H, D), k/v (B, S, Hk, D) cupy arrays, zero-copy (bshd strided views)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    qt = torch.from_dlpack(q).transpose(1, 2)
    kt = torch.from_dlpack(k).transpose(1, 2)
    vt = torch.from_dlpack(v).transpose(1, 2)
    gqa = qt.shape[1] != kt.shape[1]

    def run():
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa)

    out = run()  # raises if the backend refuses
    return run, out.transpose(1, 2)


def bench(args):
    import torch  # noqa: F401

    timer = Timer()
    copy_bw = copy_bandwidth(timer)
    print(f"copy bandwidth (read+write): {copy_bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    Bs = [1, 16, 64, 256]
    ctxs = [512, 4096, 32768]
    heads = [(32, 8), (32, 32)]
    pages = [0, 16, 256]
    if args.quick:
        Bs, ctxs, heads = [64], [4096], [(32, 8)]
    D = 128
    for H, Hk in heads:
        for B in Bs:
            for ctx in ctxs:
                kv_bytes = 2 * B * ctx * Hk * D * 2
                if kv_bytes > MAX_KV_BYTES:
                    continue
                q = cupy.empty((B, 1, H, D), BF16)
                fill_random(q, 1)
                k = cupy.empty((B, ctx, Hk, D), BF16)
                v = cupy.empty((B, ctx, Hk, D), BF16)
                fill_random(k, 2)
                fill_random(v, 3)
                seqlens = cupy.full((B,), ctx, np.int32)
                peer = {}
                ref_out = None
                for be in ("flash", "cudnn"):
                    try:
                        run, o = torch_sdpa(q, k, v, be)
                        peer[be] = timer(run)
                        if be == "cudnn" or ref_out is None:
                            ref_out = cupy.from_dlpack(o.contiguous())
                    except Exception as e:  # noqa: BLE001
                        peer[be] = float("nan")
                        print(f"  torch {be} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                for P in pages:
                    if P:
                        nb = B * ctx // P
                        perm = np.random.default_rng(P).permutation(nb).astype(np.int32)
                        table = cupy.asarray(perm.reshape(B, ctx // P))
                        kp = cupy.empty((nb, P, Hk, D), BF16)
                        vp = cupy.empty((nb, P, Hk, D), BF16)
                        kp[table.reshape(-1)] = k.reshape(nb, P, Hk, D)
                        vp[table.reshape(-1)] = v.reshape(nb, P, Hk, D)
                        kw = dict(block_table=table)
                        kc, vc = kp, vp
                    else:
                        kw, kc, vc = {}, k, v

                    def ours(kc=kc, vc=vc, kw=kw, q=q):
                        return fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, **kw)

                    out = ours()
                    err = float(cupy.abs(out.astype(np.float32) - ref_out.astype(np.float32)).max()) if ref_out is not None else float("nan")
                    t = timer(ours)
                    from cupy_flashattn._cuda import decode as dc
                    from cupy_flashattn.problem import AttentionProblem

                    prob = AttentionProblem(
                        q=q.reshape(B, H, D), k=kc if P else k.reshape(B * ctx, Hk, D),
                        v=vc if P else v.reshape(B * ctx, Hk, D), out=cupy.empty((B, H, D), BF16),
                        softmax_lse=cupy.empty((H, B), np.float32), batch_size=B, seqlen_q=1,
                        seqlen_k=ctx, max_seqlen_q=1, max_seqlen_k=ctx, seqused_k=seqlens,
                        block_table=kw.get("block_table"), page_block_size=P,
                        softmax_scale=1 / np.sqrt(D), window_right=0)
                    splits = dc.plan(prob)[2]
                    t_core = timer(lambda: dc.run_decode(prob))
                    row = dict(
                        B=B, ctx=ctx, H=H, Hk=Hk, D=D, page=P or "contig", splits=splits,
                        us=t * 1e6, us_core=t_core * 1e6, GBs=kv_bytes / t / 1e9,
                        GBs_core=kv_bytes / t_core / 1e9, frac=kv_bytes / t / copy_bw,
                        frac_core=kv_bytes / t_core / copy_bw,
                        flash_us=peer["flash"] * 1e6, cudnn_us=peer["cudnn"] * 1e6,
                        flash_GBs=kv_bytes / peer["flash"] / 1e9, cudnn_GBs=kv_bytes / peer["cudnn"] / 1e9,
                        ratio_cudnn=t / peer["cudnn"], ratio_core_cudnn=t_core / peer["cudnn"],
                        ratio_flash=t / peer["flash"], max_abs_diff=err,
                    )
                    rows.append(row)
                    print(" ".join(f"{k_}={v_:.3g}" if isinstance(v_, float) else f"{k_}={v_}" for k_, v_ in row.items()), flush=True)
                    if P:
                        del kp, vp
                del q, k, v
                cupy.get_default_memory_pool().free_all_blocks()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_decode.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(args.out, "bench_decode.md"), "w") as f:
        f.write(f"Copy bandwidth (read+write, cudaMemcpy D2D 1 GiB): {copy_bw / 1e9:.0f} GB/s\n\n")
        f.write("| B | ctx | H/Hk | page | splits | ours us | ours GB/s | frac copy | core us | torch flash us | cuDNN us | ours/cuDNN | core/cuDNN | ours/flash |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['B']} | {r['ctx']} | {r['H']}/{r['Hk']} | {r['page']} | {r['splits']} | {r['us']:.1f} | "
                    f"{r['GBs']:.0f} | {r['frac']:.2f} | {r['us_core']:.1f} | {r['flash_us']:.1f} | {r['cudnn_us']:.1f} | "
                    f"{r['ratio_cudnn']:.2f} | {r['ratio_core_cudnn']:.2f} | {r['ratio_flash']:.2f} |\n")
    table = open(os.path.join(args.out, "bench_decode.md")).read()
    print(table)
    update_results_md(os.path.join(args.out, "h200.md"), table)
    plot(rows, copy_bw, args.out)


def update_results_md(path, table):
    """Replace the decode section of the per-GPU results file (between its markers)."""
    begin, end = "<!-- decode:begin -->", "<!-- decode:end -->"
    text = open(path).read() if os.path.exists(path) else ""
    section = f"{begin}\n## Decode (`benchmarks/bench_decode.py`)\n\n{table}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)


def plot(rows, copy_bw, out):
    """One PNG per head layout: a panel per batch size, x = context, y = GB/s of K+V read,
    one line per provider (ours per cache layout, torch flash, cuDNN) and the copy ceiling."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no decode plots")
        return
    for H, Hk in sorted({(r["H"], r["Hk"]) for r in rows}):
        sel = [r for r in rows if (r["H"], r["Hk"]) == (H, Hk)]
        batches = sorted({r["B"] for r in sel})
        fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), squeeze=False)
        for ax, B in zip(axes[0], batches):
            rb = [r for r in sel if r["B"] == B]
            for page in sorted({str(r["page"]) for r in rb}):
                pts = sorted((r["ctx"], r["GBs"]) for r in rb if str(r["page"]) == page)
                ax.plot(*zip(*pts), marker="o", label=f"ours ({'page ' + page if page != 'contig' else 'contiguous'})")
            peers = {}
            for r in rb:
                peers[r["ctx"]] = (r["flash_GBs"], r["cudnn_GBs"])
            ctxs = sorted(peers)
            ax.plot(ctxs, [peers[c][0] for c in ctxs], "k--", label="torch SDPA flash")
            ax.plot(ctxs, [peers[c][1] for c in ctxs], "k:", label="torch SDPA cuDNN")
            ax.axhline(copy_bw / 1e9, color="grey", lw=0.8, label="copy bandwidth")
            ax.set_xscale("log", base=2)
            ax.set_title(f"B={B}, H/Hk={H}/{Hk}, D=128")
            ax.set_xlabel("context (keys)")
            ax.set_ylabel("GB/s of K+V read")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"bench_decode_h{H}_hk{Hk}.png"), dpi=90)
        plt.close(fig)


def smoke():
    """Small shapes touching every path (for compute-sanitizer): paged 1/16/48, splits 1/3,
    GQA/MQA, append with dropped positions, rotary, merge."""
    rng = np.random.default_rng(0)
    for P, splits, (H, Hk), Sq in [(1, 3, (8, 2), 1), (16, 0, (8, 1), 2), (48, 3, (6, 3), 3), (0, 1, (4, 4), 1)]:
        B, D, cap = 3, 64, 100
        q = cupy.asarray(rng.standard_normal((B, Sq, H, D)).astype(np.float16))
        kn = cupy.asarray(rng.standard_normal((B, Sq, Hk, D)).astype(np.float16))
        vn = cupy.asarray(rng.standard_normal((B, Sq, Hk, D)).astype(np.float16))
        lens = cupy.asarray(np.array([0, 50, 100 - Sq], np.int32))
        cos = cupy.asarray(np.cos(rng.uniform(0, 6, (cap, 16))).astype(np.float32))
        sin = cupy.asarray(np.sin(rng.uniform(0, 6, (cap, 16))).astype(np.float32))
        if P:
            mb = -(-cap // P)
            table = cupy.asarray(rng.permutation(B * mb).reshape(B, mb).astype(np.int32))
            kc = cupy.zeros((B * mb, P, Hk, D), np.float16)
            out = fa.flash_attn_with_kvcache(q, kc, cupy.zeros_like(kc), kn, vn, rotary_cos=cos, rotary_sin=sin,
                                             cache_seqlens=lens, block_table=table, causal=True, num_splits=splits)
        else:
            kc = cupy.zeros((B, cap, Hk, D), np.float16)
            out = fa.flash_attn_with_kvcache(q, kc, cupy.zeros_like(kc), kn, vn, rotary_cos=cos, rotary_sin=sin,
                                             cache_seqlens=lens, causal=True, num_splits=splits)
        assert not bool(cupy.isnan(out).any())
    # dropped appends (past capacity / bad page)
    from cupy_flashattn import rotary

    kc = cupy.zeros((4, 16, 2, 40), np.float16)
    new = cupy.ones((2, 4, 2, 40), np.float16)
    rotary.append_kv_paged(kc, kc.copy(), cupy.asarray(np.array([[0, 9], [1, 2]], np.int32)), new, new,
                           cupy.asarray(np.array([14, 30], np.int32)))
    oa = cupy.asarray(rng.standard_normal((5, 4, 59)).astype(np.float16))
    la = cupy.asarray(rng.standard_normal((4, 5)).astype(np.float32))
    fa.merge_attention_states(oa, la, oa.copy(), la.copy())
    cupy.cuda.Device().synchronize()
    print("smoke ok")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    a = ap.parse_args()
    t0 = time.time()
    if a.smoke:
        smoke()
    else:
        bench(a)
    print(f"done in {time.time() - t0:.1f} s")
