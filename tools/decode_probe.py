"""Where does the decode kernel lose bandwidth?  One device call, kernel-only timings
(CUDA events, L2 flushed by a 1 GiB memset before each call), bf16 D = 128, GQA 32/8.

1. Ceilings: cudaMemcpy D2D (read + write bytes / time) and a read-only kernel that streams
   the same bytes as a decode call in two orders -- the decode layout (B, S, Hk, D), where
   one (sequence, kv head) stream reads 256 B of every 2 KB row, and a head-major layout
   (B, Hk, S, D), where each stream reads 1 MB contiguously.
2. Our decode kernel (below the front end, `run_decode`) on the contiguous cache, on a
   head-major view of the same values, and on pages of 16 / 256, with forced split counts.

    PYTHONPATH=. python3 tools/decode_probe.py [--rows 64:4096,16:16384]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import cupy  # noqa: E402

import bench_decode as bd  # noqa: E402

READ_SRC = r"""
// Each CTA streams the rows of `streams_per_cta` (sequence, kv head) streams: row p of stream
// s is `row_bytes` bytes at base + s_off(s) + p * row_stride.  128 threads, 16 B per thread
// per load, 8 loads in flight per thread; the sum keeps the loads alive.
extern "C" __global__ void __launch_bounds__(128) read_rows(
    const uint4* __restrict__ base, long long stream_stride_b, long long hk_stride, int hk_count,
    long long row_stride, int rows, int row_chunks, unsigned long long* sink) {
  const int hk = blockIdx.x % hk_count, b = blockIdx.x / hk_count;
  const char* s0 = reinterpret_cast<const char*>(base) + b * stream_stride_b + hk * hk_stride;
  const int per_iter = 128 / row_chunks;  // rows per 128-thread step
  const int r0 = threadIdx.x / row_chunks, c = threadIdx.x % row_chunks;
  unsigned acc = 0;
  for (int r = r0; r < rows; r += per_iter * 8) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int rr = r + u * per_iter;
      if (rr < rows) {
        const uint4* ptr = reinterpret_cast<const uint4*>(s0 + (long long)rr * row_stride) + c;
        asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(ptr));
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) atomicAdd(sink, 1ull);
}
"""


def read_ceiling(timer, buf, B, S, Hk, layout):
    """Seconds to read `buf` (K and V of B sequences, S keys, Hk heads, D = 128, bf16) as
    B * Hk streams of 256-byte rows, twice (K then V)."""
    kern = cupy.RawKernel(READ_SRC, "read_rows")
    sink = cupy.zeros(1, np.uint64)
    row = 128 * 2
    half = buf.nbytes // 2
    if layout == "bshd":
        args = (S * Hk * row, row, Hk, Hk * row)
    else:  # bhsd
        args = (Hk * S * row, S * row, Hk, row)

    def run():
        for part in (0, half):
            ptr = cupy.cuda.MemoryPointer(buf.data.mem, buf.data.ptr - buf.data.mem.ptr + part)
            kern((B * Hk,), (128,), (cupy.ndarray((half,), np.uint8, ptr), np.int64(args[0]),
                                     np.int64(args[1]), np.int32(args[2]), np.int64(args[3]),
                                     np.int32(S), np.int32(row // 16), sink))

    return timer.kernel(run)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64:4096,16:16384")
    ap.add_argument("--splits", default="0,1,2")
    ap.add_argument("--layouts", default="contig,headmajor,page16,page256")
    ap.add_argument("--no-ceiling", action="store_true")
    args = ap.parse_args()
    from cupy_flashattn._cuda import decode as dc

    timer = bd.Timer()
    copy_bw = bd.copy_bandwidth(timer)
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write)", flush=True)
    H, Hk, D = 32, 8, 128
    for spec in args.rows.split(","):
        B, ctx = (int(x) for x in spec.split(":"))
        kv_bytes = 2 * B * ctx * Hk * D * 2
        buf = cupy.empty(kv_bytes // 2, np.uint16)
        bd.fill_random(buf.view(bd.BF16), 5)
        for lay in () if args.no_ceiling else ("bshd", "bhsd"):
            t = read_ceiling(timer, buf, B, ctx, Hk, lay)
            print(f"B={B} ctx={ctx} read-only {lay}: {t * 1e6:.1f} us = {kv_bytes / t / 1e9:.0f} GB/s"
                  f" = {kv_bytes / t / copy_bw:.3f} of copy", flush=True)
        del buf
        q = cupy.empty((B, 1, H, D), bd.BF16)
        k = cupy.empty((B, ctx, Hk, D), bd.BF16)
        v = cupy.empty((B, ctx, Hk, D), bd.BF16)
        for a, s in ((q, 1), (k, 2), (v, 3)):
            bd.fill_random(a, s)
        seqlens = cupy.full((B,), ctx, np.int32)
        # head-major storage of the same values, seen through a (B, S, Hk, D) view
        kh = cupy.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        vh = cupy.ascontiguousarray(v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        layouts = [("contig", k, v, None, 0), ("headmajor", kh, vh, None, 0)]
        for P in (16, 256):
            kp, vp, table = bd.paged_cache(k, v, P)
            layouts.append((f"page{P}", kp, vp, table, P))
        ref = None
        for name, kc, vc, table, P in layouts:
            if name not in args.layouts.split(","):
                continue
            for ns in (int(s) for s in args.splits.split(",")):
                if name == "headmajor":
                    prob = _headmajor_problem(q, kc, vc, seqlens, ctx)
                else:
                    prob = bd.decode_problem(q, kc, vc, seqlens, table, P, ctx)
                prob.num_splits = ns
                splits = dc.plan(prob)[2]
                t = timer.kernel(lambda: dc.run_decode(prob))
                out = prob.out.reshape(B, H, D).astype(np.float32)
                if ref is None:
                    ref = out
                err = float(cupy.abs(out - ref).max())
                print(f"B={B} ctx={ctx} {name:9s} splits={splits}: {t * 1e6:.1f} us = "
                      f"{kv_bytes / t / 1e9:.0f} GB/s = {kv_bytes / t / copy_bw:.3f} of copy "
                      f"(max|diff vs contig| {err:.3g})", flush=True)
        del q, k, v, kh, vh, layouts


def _headmajor_problem(q, kc, vc, seqlens, ctx):
    """The decode problem on head-major storage of the same values."""
    from cupy_flashattn.problem import AttentionProblem

    B, _, H, D = q.shape
    # (B, S, Hk, D) view of (B, Hk, S, D) storage: as a flat (B * S, Hk, D) array its row
    # stride is D and head stride S * D, valid within one sequence; row b * S + p of sequence b
    # lands at b * S * D + p * D, which is NOT b's storage (b * Hk * S * D).  So view the whole
    # cache as (B * Hk * S) rows of one head and run Hk * B "sequences" of one kv head each
    # with H / Hk query heads (MQA per head): the same bytes, the same packed tiles.
    Hk = kc.shape[2]
    g = H // Hk
    kf = kc.transpose(0, 2, 1, 3).reshape(B * Hk * ctx, 1, D)
    vf = vc.transpose(0, 2, 1, 3).reshape(B * Hk * ctx, 1, D)
    qf = q.reshape(B * Hk, g, D)
    return AttentionProblem(
        q=qf, k=kf, v=vf, out=cupy.empty((B * Hk, g, D), bd.BF16),
        softmax_lse=cupy.empty((g, B * Hk), np.float32), batch_size=B * Hk, seqlen_q=1,
        seqlen_k=ctx, max_seqlen_q=1, max_seqlen_k=ctx,
        seqused_k=cupy.full((B * Hk,), ctx, np.int32), softmax_scale=1 / np.sqrt(D), window_right=0)


if __name__ == "__main__":
    main()
