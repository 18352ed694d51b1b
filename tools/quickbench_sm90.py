"""Quick prefill comparison on one GPU: our sm80 and sm90 families, torch SDPA flash and cuDNN,
TFLOP/s of back-to-back calls (one sync per 20 calls; host work overlaps the kernels), bf16,
16k tokens per batch, 16 heads (--heads).  A development tool; ``make bench`` is the benchmark of record.

    PYTHONPATH=. python3 tools/quickbench_sm90.py [--rows D,S,causal;...] [--paged 16,256]

--paged: also time each row with K/V in a paged pool of that page size (pages in a random
order, through flash_attn_varlen_func with block_table), as "p<P>" columns of the sm90 path.
--varlen: also time the same batch through flash_attn_varlen_func (equal lengths, but on the
device: the dynamic tile schedule), as a "varlen" column.
--rounds R: time our columns R times each, interleaved (round 1: every column, round 2: every
column, ...), and print each column's median with its range.  One pass of 20 calls is ~8 ms at
D = 256; the columns timed last ran on a card that had been busy longest, so a column-order
effect (clocks, power) shows up as a gap that moves with the order (--paged 256,16).
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

ROWS = "128,4096,0;128,4096,1;64,4096,0;256,4096,0;128,2048,0;128,8192,1"


def per_call(fn, n=20) -> float:
    import cupy

    for _ in range(3):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    cupy.cuda.runtime.deviceSynchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / n * 1e-3


def torch_rates(q, k, v, causal, flops) -> list:
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return ["torch n/a"]
    tq, tk, tv = (torch.as_tensor(x.view(np.uint16), device="cuda").view(torch.bfloat16)
                  .transpose(1, 2) for x in (q, k, v))
    out = []
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def call():
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        try:
            with sdpa_kernel(backend):
                out.append(f"{name} {flops / per_call(call) / 1e12:.0f}")
        except RuntimeError:
            out.append(f"{name} err")
    return out


def paged_call(q, k, v, page, causal, rng, order="random"):
    """A paged-prefill call on the same keys (pool pages in a random order) and its max
    difference from the dense call (expect 0: the same keys in the same order)."""
    import cupy

    import cupy_flashattn as fa

    b, s, h, d = q.shape
    nblk = s // page
    ids = np.arange(b * nblk) if order == "identity" else rng.permutation(b * nblk)
    perm = cupy.asarray(ids.astype(np.int32))
    kp = cupy.empty((b * nblk, page, h, d), k.dtype)
    vp = cupy.empty_like(kp)
    kp[perm] = k.reshape(b * nblk, page, h, d)
    vp[perm] = v.reshape(b * nblk, page, h, d)
    qf = q.reshape(b * s, h, d)
    cu = cupy.asarray(np.arange(0, b * s + 1, s, dtype=np.int32))
    table = perm.reshape(b, nblk)

    def call():
        return fa.flash_attn_varlen_func(qf, kp, vp, cu, cu, s, s, causal=causal, block_table=table)
    dense = fa.flash_attn_func(q, k, v, causal=causal).reshape(b * s, h, d)
    diff = float(cupy.abs(call().astype(np.float32) - dense.astype(np.float32)).max())
    return call, diff


def main(argv=None):
    import cupy
    import ml_dtypes

    import cupy_flashattn as fa
    from cupy_flashattn._cuda.launch import force_prefill_arch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=ROWS)
    ap.add_argument("--archs", default="sm80,sm90")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--paged", default="", help="page sizes, e.g. 16,256")
    ap.add_argument("--varlen", action="store_true", help="a varlen column (equal lengths)")
    ap.add_argument("--heads", type=int, default=16,
                    help="query heads (0: make bench's 2048 / D, e.g. 8 at D = 256)")
    ap.add_argument("--page-order", default="random", choices=("random", "identity"),
                    help="pool pages in a random order, or in the dense layout's order")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time our columns this many times, interleaved; print median [min-max]")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    for item in args.rows.split(";"):
        d, s, causal = (int(x) for x in item.split(","))
        causal = bool(causal)
        b, h = max(1, 16384 // s), args.heads or 2048 // d
        q, k, v = (cupy.asarray(rng.standard_normal((b, s, h, d)).astype(ml_dtypes.bfloat16))
                   for _ in range(3))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        row, outs = [f"D{d} S{s} {'causal' if causal else 'full'}"], {}
        columns = []  # (label, arch forced or None, call); timed after all are built
        archs = args.archs.split(",")
        dense_call = functools.partial(fa.flash_attn_func, q, k, v, causal=causal)
        for arch in archs:
            columns.append((arch, arch, dense_call))
            force_prefill_arch(arch)
            outs[arch] = cupy.asnumpy(dense_call()).astype(np.float32)
        if args.varlen:
            cu = cupy.asarray(np.arange(0, b * s + 1, s, dtype=np.int32))
            qf, kf, vf = (x.reshape(b * s, h, d) for x in (q, k, v))

            columns.append(("varlen", None, functools.partial(
                fa.flash_attn_varlen_func, qf, kf, vf, cu, cu, s, s, causal=causal)))
        notes = {}
        for page in [int(x) for x in args.paged.split(",") if x]:
            if s % page:  # paged_call cuts the dense keys into whole pages
                notes[f"p{page}"] = f"p{page} -- (S % {page} != 0)"
                continue
            force_prefill_arch(None)
            call, check = paged_call(q, k, v, page, causal, rng, args.page_order)
            columns.append((f"p{page}", None, call))
            notes[f"p{page}"] = f"(diff {check:.3g})"
        rates = {label: [] for label, _, _ in columns}
        for _ in range(max(1, args.rounds)):
            for label, arch, call in columns:
                force_prefill_arch(arch)
                rates[label].append(flops / per_call(call) / 1e12)
        for label, _, _ in columns:
            r = sorted(rates[label])
            text = f"{label} {float(np.median(r)):.0f}"
            if len(r) > 1:
                text += f" [{r[0]:.0f}-{r[-1]:.0f}]"
            row.append(text)
            if label in notes:
                row.append(notes[label])
        row += [v for key, v in notes.items() if key not in rates]
        force_prefill_arch(None)
        if len(archs) == 2:
            row.append(f"maxdiff {np.abs(outs[archs[0]] - outs[archs[1]]).max():.3g}")
        print("  ".join(row + ([] if args.no_torch else torch_rates(q, k, v, causal, flops))),
              flush=True)


if __name__ == "__main__":
    main()
