"""Decode benchmark: flash_attn_with_kvcache (one new query token per sequence) on a contiguous
and a paged KV cache, beside PyTorch SDPA (FlashAttention-2 and cuDNN backends) on the same K/V
laid out contiguously, all in one process, plus a device-to-device copy for the bandwidth ceiling.

Every row reports four measurements (docs/performance.md, "The four measurements"), ours next to
the same measurement of each peer, after warm-up:
* one call, start to end (`us_call`): CUDA events recorded around the Python call as a user
  makes it, on an idle GPU with a flushed L2 (measure.L2Flush, waited for: a 1 GiB memset then
  a 256 MB read, so the L2 holds clean lines of other data), so host work and kernels are both inside; median of CALL_REPS with a synchronisation between them.  GB/s,
  `frac` and `ratio_<peer>` (ours time / theirs, below 1 = ours faster) come from it.
* back to back (`us_b2b`): wall time per call of `b2b_calls` calls with one synchronisation
  at the end (no L2 flush in between).
* graph replay (`us_graph`): one call captured in a CUDA graph (ours: CuPy stream capture of
  the flash_attn_with_kvcache call; torch: torch.cuda.CUDAGraph around SDPA), each replay
  timed like one call.  `graph_err` = max|replayed - eager| after poisoning the captured
  output with NaN (0 = the graph recomputes the whole output).
* kernel only (`us_kernel`): ours through the launch plan (no front end), torch's SDPA
  call; the L2 flush before each call keeps the GPU busy while the host prepares the call, so
  host work is not timed.  (--flush memset: the memset alone, the method before stop 36, which
  leaves ~50 MB of dirty lines for the timed call to write back.)

--kv bf16,fp8 adds rows over a float8 e4m3 cache (uint8 bytes with kv_cache_dtype="fp8", made
by our quantizing append from the same bf16 K/V, one scale per tensor): its bytes are half, so
"frac" counts the float8 bytes and `x_bf16` = the bf16 row's one-call time / this row's (the
issue asks ~1.9x).  The peers always read the bf16 K/V (they have no float8 decode here).

Bandwidth = bytes of K and V read / time.  Copy bandwidth = (read + write bytes) / time of a
cudaMemcpy D2D of 1 GiB (DESIGN.md's 4.2 TB/s convention); "frac" = ours / copy bandwidth.

    PYTHONPATH=. python3 benchmarks/bench_decode.py [--quick] [--out DIR]
    PYTHONPATH=. python3 benchmarks/bench_decode.py --rows 1:512,64:4096 --pages 16 --heads 32/8
    PYTHONPATH=. python3 benchmarks/bench_decode.py --smoke     # small shapes for memcheck

--quick: GQA 32/8, B = 1 ctx 512 (host-bound) and B = 64 ctx 4096 (bandwidth-bound), every
cache layout: 6 rows (meant to take well under 2 minutes).
Writes <out>/bench_decode.csv, <out>/bench_decode.md, the decode section of <out>/<gpu>.md
(between <!-- decode:begin --> and <!-- decode:end -->) and <out>/bench_decode_h<H>_hk<Hk>.png.
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

import cupy  # noqa: E402
import ml_dtypes  # noqa: E402

import cupy_flashattn as fa  # noqa: E402
import measure  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
MAX_KV_BYTES = 40 << 30
D = 128
# The full grid; rows whose K+V exceed MAX_KV_BYTES are skipped.
BATCHES, CONTEXTS, HEADS, PAGES = [1, 16, 64, 256], [512, 4096, 32768], [(32, 8), (32, 32)], [0, 16, 256]
QUICK_ROWS, QUICK_HEADS = [(1, 512), (64, 4096)], [(32, 8)]
KERNEL_REPS, CALL_REPS = 10, 15
# Back-to-back samples last about this long (measure.calls_for), judged from the bytes of K
# and V at ~3.5 TB/s plus ~20 us of host work per call.
B2B_BUDGET_S = 0.03
PEERS = ("flash", "cudnn")
MEASURES = ("call", "b2b", "graph", "kernel")  # us_<measure> columns, in CSV/table order
NAN = float("nan")


def fill_random(a, rng_seed=0):
    """Fill a bf16 cupy array with N(0, 1) values chunk by chunk (bounded temporary memory)."""
    flat = a.reshape(-1)
    chunk = 1 << 26
    rs = cupy.random.RandomState(rng_seed)
    for i in range(0, flat.size, chunk):
        n = min(chunk, flat.size - i)
        flat[i : i + n] = rs.standard_normal(n, dtype=np.float32).astype(a.dtype)


class Timer:
    """The timings of one provider (measure.py has the shared primitives).  Owns the L2 flush
    run before a timed call (measure.L2Flush: "clean" by default, "memset" the method before
    stop 36)."""

    def __init__(self, flush: str = "clean"):
        self.flush = measure.L2Flush(flush)

    def kernel(self, fn, reps=KERNEL_REPS, warmup=2):
        """Median seconds of GPU work of fn: events around each call, each call preceded by
        the flush, which keeps the GPU busy while the host prepares the call (so the host work
        of a call shorter than the flush, ~350 us, is not timed)."""
        for _ in range(warmup):
            fn()
        evs = []
        for _ in range(reps):
            self.flush()
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            s.record()
            fn()
            e.record()
            evs.append((s, e))
        evs[-1][1].synchronize()
        return float(np.median([cupy.cuda.get_elapsed_time(s, e) for s, e in evs])) * 1e-3  # s

    def call(self, fn, reps=CALL_REPS, warmup=2):
        """Median seconds of one call start to end (host work included), L2 flushed before."""
        for _ in range(warmup):
            fn()
        return measure.median_one_call(fn, reps, before=self.flush)

    def b2b(self, fn, n, warmup=2):
        for _ in range(warmup):
            fn()
        return measure.back_to_back(fn, n)


def copy_bandwidth(timer):
    n = 1 << 30
    a, b = cupy.empty(n, np.uint8), cupy.empty(n, np.uint8)
    a.fill(1)
    t = timer.kernel(lambda a=a, b=b: cupy.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, n, 3, 0))
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


def measure_provider(timer, call, kernel, capture, n_b2b, label):
    """({measure: seconds}, graph) of one provider: `call` is the call a user makes, `kernel`
    what kernel-only time runs, `capture()` returns (replay, captured output) for the graph
    measurement.  graph is that pair, or None where capture failed (us_graph = NaN)."""
    t = dict(kernel=timer.kernel(kernel), call=timer.call(call), b2b=timer.b2b(call, n_b2b))
    graph = None
    try:
        graph = capture()
        t["graph"] = timer.call(graph[0])
    except Exception as e:  # noqa: BLE001 -- report it, keep the other measurements
        t["graph"] = NAN
        print(f"  {label}: graph capture failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
    return t, graph


def graph_error(replay, output, eager):
    """max|replayed - eager| after filling the captured output with NaN (bf16 NaN bits): 0 when
    the replay recomputes the whole output, NaN when some of it is not written by the graph
    (e.g. a kernel launched outside the captured stream)."""
    output.view(np.uint16).fill(0x7FC0)
    replay()
    measure.synchronize()
    return float(cupy.abs(output.astype(np.float32) - eager.astype(np.float32)).max())


def measure_peers(timer, q, k, v, n_b2b):
    """({backend: {measure: seconds}}, reference output) for torch SDPA on the contiguous K/V;
    the reference is cuDNN's output (flash's where cuDNN fails), None when both fail."""
    peers, ref = {}, None
    for be in PEERS:
        try:
            run, o = torch_sdpa(q, k, v, be)
            peers[be], _ = measure_provider(timer, run, run, lambda run=run: measure.torch_graph(run),
                                            n_b2b, f"torch {be}")  # fmt: skip
            if be == "cudnn" or ref is None:
                ref = cupy.from_dlpack(o.contiguous())
        except Exception as e:  # noqa: BLE001
            peers[be] = dict.fromkeys(MEASURES, NAN)
            print(f"  torch {be} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
    return peers, ref


def random_qkv(B, ctx, H, Hk, D=D):
    """One new query token per sequence and a contiguous K/V cache, bf16 N(0, 1) values:
    q (B, 1, H, D), k / v (B, ctx, Hk, D) -- the inputs of every decode row (the peers read
    k / v as they are; :func:`paged_cache` scatters them for ours).  ``D``: the head dim (the
    rows' 128 unless a probe asks for another)."""
    q = cupy.empty((B, 1, H, D), BF16)
    k = cupy.empty((B, ctx, Hk, D), BF16)
    v = cupy.empty((B, ctx, Hk, D), BF16)
    fill_random(q, 1)
    fill_random(k, 2)
    fill_random(v, 3)
    return q, k, v


def paged_cache(k, v, P):
    """(k pages, v pages, block table): the keys of k/v (B, ctx, Hk, D) scattered over pages of
    P rows in a random order (in k's dtype: bf16, or uint8 float8 bytes)."""
    B, ctx, Hk, D = k.shape
    nb = B * ctx // P
    perm = np.random.default_rng(P).permutation(nb).astype(np.int32)
    table = cupy.asarray(perm.reshape(B, ctx // P))
    kp = cupy.empty((nb, P, Hk, D), k.dtype)
    vp = cupy.empty((nb, P, Hk, D), k.dtype)
    kp[table.reshape(-1)] = k.reshape(nb, P, Hk, D)
    vp[table.reshape(-1)] = v.reshape(nb, P, Hk, D)
    return kp, vp, table


#: The float8 rows' scale (one per tensor): N(0, 1) values / FP8_SCALE stay below e4m3's 448.
FP8_SCALE = 1.0 / 64


def quantized(k, v, fmt="fp8"):
    """k / v (B, ctx, Hk, D) bf16 as float8 bytes (uint8) of ``fmt`` ("fp8" = e4m3fn,
    "fp8_e5m2"), through our quantizing append (fp8(clip(x / FP8_SCALE)), the bytes
    fp8.quantize gives)."""
    from cupy_flashattn.rotary import append_kv_contiguous

    k8, v8 = cupy.empty(k.shape, np.uint8), cupy.empty(v.shape, np.uint8)
    append_kv_contiguous(k8, v8, k, v, cupy.zeros((k.shape[0],), np.int32), k_scale=FP8_SCALE,
                         v_scale=FP8_SCALE, kv_cache_dtype=fmt)
    return k8, v8




def decode_problem(q, kc, vc, seqlens, table, P, ctx, fmt="fp8"):
    """The AttentionProblem our front end would build for the decode call (kernel-only path):
    like the call (no return_softmax_lse), its LSE is not read."""
    from cupy_flashattn import fp8
    from cupy_flashattn.problem import AttentionProblem

    B, _, H, D = q.shape  # (the head dim of these inputs, not the module's D)
    extra = {}
    if kc.dtype == np.uint8:  # float8 bytes
        Hk = kc.shape[-2]
        scale = cupy.full((Hk,), FP8_SCALE, np.float32)
        extra = dict(kv_dtype=fp8.FP8_NAMES[fmt], k_scale=scale, v_scale=scale)
    return AttentionProblem(**extra,
        q=q.reshape(B, H, D), k=kc if P else kc.reshape(B * ctx, -1, D),
        v=vc if P else vc.reshape(B * ctx, -1, D), out=cupy.empty((B, H, D), BF16),
        softmax_lse=cupy.empty((H, B), np.float32), batch_size=B, seqlen_q=1,
        seqlen_k=ctx, max_seqlen_q=1, max_seqlen_k=ctx, seqused_k=seqlens,
        block_table=table, page_block_size=P, softmax_scale=1 / np.sqrt(D), window_right=0,
        lse_unread=True)


def measure_ours(timer, q, kc, vc, seqlens, table, P, ctx, n_b2b, ref, fmt="fp8"):
    """({measure: seconds}, extra row fields) of flash_attn_with_kvcache on one cache layout."""
    from cupy_flashattn import _cuda

    kw = {} if table is None else dict(block_table=table)
    if kc.dtype == np.uint8:
        kw.update(kv_cache_dtype=fmt, k_scale=FP8_SCALE, v_scale=FP8_SCALE)

    def ours():
        return fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, **kw)

    out = ours()
    err = NAN if ref is None else float(cupy.abs(out.astype(np.float32) - ref.astype(np.float32)).max())
    prob = decode_problem(q, kc, vc, seqlens, table, P, ctx, fmt)
    # Kernel only: the launch plan the front end would make for this call (the mma.sync decode
    # kernel, or on 9.0 for MQA the sm90 split kernel: _cuda.route), made once and replayed.
    plan = _cuda.plan_attention(prob)
    t, graph = measure_provider(timer, ours, lambda: _cuda.run_attention(prob, plan),
                                lambda: measure.cupy_graph(ours), n_b2b, "ours")  # fmt: skip
    graph_err = NAN if graph is None else graph_error(*graph, out)
    if graph is not None and graph_err != 0:
        print(f"  ours: graph replay differs from the eager call (max |diff| {graph_err})", flush=True)
    return t, dict(splits=plan[0].splits, max_abs_diff=err, graph_err=graph_err)


def make_row(shape, P, ours, extra, peers, kv_bytes, copy_bw, n_b2b, kv="bf16"):
    """One CSV row.  GB/s, frac and ratio_<peer> (ours time / theirs) come from the one-call
    time (what a user sees); the *_kernel columns from kernel-only time.  ``kv_bytes``: the
    bytes of K and V ours reads (half for float8)."""
    B, ctx, H, Hk = shape
    row = dict(B=B, ctx=ctx, H=H, Hk=Hk, D=D, page=P or "contig", kv=kv, splits=extra["splits"])
    for prefix, t in [("", ours)] + [(f"{be}_", peers[be]) for be in PEERS]:
        for m in MEASURES:
            row[f"{prefix}us_{m}"] = t[m] * 1e6
    row.update(GBs=kv_bytes / ours["call"] / 1e9, frac=kv_bytes / ours["call"] / copy_bw,
               GBs_kernel=kv_bytes / ours["kernel"] / 1e9, frac_kernel=kv_bytes / ours["kernel"] / copy_bw)
    for be in PEERS:
        row[f"{be}_GBs"] = kv_bytes / peers[be]["call"] / 1e9
    for be in PEERS:
        row[f"ratio_{be}"] = ours["call"] / peers[be]["call"]
    for m in ("b2b", "graph", "kernel"):
        row[f"ratio_{m}_cudnn"] = ours[m] / peers["cudnn"][m]
    row.update(b2b_calls=n_b2b, max_abs_diff=extra["max_abs_diff"], graph_err=extra["graph_err"],
               x_bf16=NAN)
    return row


def bench_shape(timer, copy_bw, shape, pages, kvs=("bf16",)):
    """The rows of one (B, ctx, H, Hk): the peers once, then ours on each cache layout and K/V
    format (``kvs``: "bf16", "fp8")."""
    B, ctx, H, Hk = shape
    kv_bytes = 2 * B * ctx * Hk * D * 2
    n_b2b = measure.calls_for(kv_bytes / 3.5e12 + 20e-6, B2B_BUDGET_S)
    q, k, v = random_qkv(B, ctx, H, Hk)
    seqlens = cupy.full((B,), ctx, np.int32)
    peers, ref = measure_peers(timer, q, k, v, n_b2b)
    rows = []
    for kv in kvs:
        kk, vv = quantized(k, v, kv) if kv != "bf16" else (k, v)
        nbytes = kv_bytes // 2 if kv != "bf16" else kv_bytes
        for P in pages:
            kc, vc, table = paged_cache(kk, vv, P) if P else (kk, vv, None)
            ours, extra = measure_ours(timer, q, kc, vc, seqlens, table, P, ctx, n_b2b, ref,
                                       kv if kv != "bf16" else "fp8")
            rows.append(make_row(shape, P, ours, extra, peers, nbytes, copy_bw, n_b2b, kv))
            if kv != "bf16":
                base = [r for r in rows if r["kv"] == "bf16" and r["page"] == rows[-1]["page"]]
                if base:
                    rows[-1]["x_bf16"] = base[0]["us_call"] / rows[-1]["us_call"]
            print(" ".join(f"{k_}={v_:.3g}" if isinstance(v_, float) else f"{k_}={v_}"
                           for k_, v_ in rows[-1].items()), flush=True)  # fmt: skip
            del kc, vc, table
        del kk, vv
    return rows


def shapes(args):
    """The (B, ctx, H, Hk) of the run: --rows / --heads, --quick, or the full grid."""
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")] if args.heads else None
    if args.rows:
        pairs = [tuple(int(x) for x in r.split(":")) for r in args.rows.split(",")]
    elif args.quick:
        pairs, heads = QUICK_ROWS, heads or QUICK_HEADS
    else:
        pairs = [(B, ctx) for B in BATCHES for ctx in CONTEXTS]
    out = [(B, ctx, H, Hk) for H, Hk in (heads or HEADS) for B, ctx in pairs]
    return [s for s in out if 2 * s[0] * s[1] * s[3] * D * 2 <= MAX_KV_BYTES]


def _us(x) -> str:
    return "-" if x != x else (f"{x:.0f}" if x >= 1000 else f"{x:.1f}")


def _trio(r, m) -> str:
    """'ours / flash / cuDNN' microseconds of one measurement."""
    return " / ".join(_us(r[f"{p}us_{m}"]) for p in ("", "flash_", "cudnn_"))


def _ratio(x) -> str:
    return "-" if x != x else f"{x:.2f}"


def decode_table(rows, copy_bw) -> str:
    """bench_decode.md (also the decode section of results/<gpu>.md).  It leads with the
    user-visible one-call numbers; back-to-back, graph-replay and kernel-only times sit beside
    them, never alone."""
    lines = [
        f"Copy bandwidth (read+write, cudaMemcpy D2D 1 GiB): {copy_bw / 1e9:.0f} GB/s\n",
        "**one call**: CUDA events around one Python call as a user makes it (host work + kernels; "
        "L2 flushed, GPU idle before), median; GB/s, frac copy and ours/peer (time ratios, below 1 "
        "= ours faster) come from it.  **back to back**: wall time per call of many calls, one "
        "synchronisation at the end.  **graph**: one call captured in a CUDA graph, one replay "
        "start to end.  **kernel only**: device time with host work hidden (ours: the decode "
        "launcher below the front end).  docs/performance.md explains the columns.\n",
        "| B | ctx | H/Hk | page | K/V | one call us: ours / flash / cuDNN | ours GB/s | frac copy "
        "| ours/cuDNN | ours/flash | back to back us/call: ours / flash / cuDNN | b2b ours/cuDNN "
        "| graph us: ours / flash / cuDNN | graph ours/cuDNN | kernel only us: ours / flash / cuDNN "
        "| kernel ours/cuDNN | splits | bf16 time / this |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['B']} | {r['ctx']} | {r['H']}/{r['Hk']} | {r['page']} | {r['kv']} | {_trio(r, 'call')} | "
            f"{r['GBs']:.0f} | {r['frac']:.2f} | {_ratio(r['ratio_cudnn'])} | {_ratio(r['ratio_flash'])} | "
            f"{_trio(r, 'b2b')} | {_ratio(r['ratio_b2b_cudnn'])} | {_trio(r, 'graph')} | "
            f"{_ratio(r['ratio_graph_cudnn'])} | {_trio(r, 'kernel')} | {_ratio(r['ratio_kernel_cudnn'])} | "
            f"{r['splits']} | {_ratio(r['x_bf16'])} |")
    return "\n".join(lines) + "\n"


def write_outputs(rows, copy_bw, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_decode.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    table = decode_table(rows, copy_bw)
    with open(os.path.join(out, "bench_decode.md"), "w") as f:
        f.write(table)
    print(table)
    update_results_md(os.path.join(out, f"{measure.gpu_slug()}.md"), table)
    plot(rows, copy_bw, out)


def bench(args):
    import torch  # noqa: F401 -- the peers; fail early when torch is missing

    timer = Timer(args.flush)
    copy_bw = copy_bandwidth(timer)
    print(f"copy bandwidth (read+write): {copy_bw / 1e9:.0f} GB/s", flush=True)
    pages = [int(x) for x in args.pages.split(",")]
    rows = []
    for shape in shapes(args):
        rows += bench_shape(timer, copy_bw, shape, pages, args.kv.split(","))
        cupy.get_default_memory_pool().free_all_blocks()
    if rows:
        write_outputs(rows, copy_bw, args.out)


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
    """One PNG per head layout: a panel per batch size, x = context, y = GB/s of K+V read in
    one call start to end (what a user sees), one line per provider (ours per cache layout,
    torch flash, cuDNN), our kernel-only GB/s on the first layout (dotted grey: the gap to
    its solid line is host cost) and the copy ceiling."""
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
            for page, kv in sorted({(str(r["page"]), r["kv"]) for r in rb}):
                pts = sorted((r["ctx"], r["GBs"]) for r in rb
                             if str(r["page"]) == page and r["kv"] == kv)
                where = "page " + page if page != "contig" else "contiguous"
                ax.plot(*zip(*pts), marker="o", label=f"ours ({where}, {kv})")
            first = str(rb[0]["page"])
            pts = sorted((r["ctx"], r["GBs_kernel"]) for r in rb
                         if str(r["page"]) == first and r["kv"] == rb[0]["kv"])
            ax.plot(*zip(*pts), marker=".", linestyle=":", color="grey",
                    label=f"ours ({'page ' + first if first != 'contig' else 'contiguous'}), kernel only")
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
            ax.set_ylabel("GB/s of K+V read, one call")
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
        ro_rows = -(-cap // P) * P if P else cap  # a row per cache position (flash-attn's rule)
        cos = cupy.asarray(np.cos(rng.uniform(0, 6, (ro_rows, 16))).astype(np.float32))
        sin = cupy.asarray(np.sin(rng.uniform(0, 6, (ro_rows, 16))).astype(np.float32))
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="GQA 32/8, B:ctx 1:512 and 64:4096, every cache layout (6 rows)")
    ap.add_argument("--rows", help="B:ctx pairs, e.g. 1:512,64:4096 (instead of the grid)")
    ap.add_argument("--heads", help="H/Hk pairs, e.g. 32/8,32/32 (default: the grid's)")
    ap.add_argument("--pages", default=",".join(map(str, PAGES)),
                    help="cache layouts: 0 = contiguous, else the page size (default %(default)s)")
    ap.add_argument("--kv", default="bf16",
                    help="K/V formats of our rows: bf16, fp8 (e4m3 bytes), fp8_e5m2; e.g. bf16,fp8")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--flush", default="clean", choices=("clean", "memset"),
                    help="L2 flush before a timed call (measure.L2Flush; default %(default)s)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.smoke:
        smoke()
    else:
        bench(args)
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
