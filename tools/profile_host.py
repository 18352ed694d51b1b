"""Host cost of one call, as a user pays it: wall time per call of N back-to-back calls (one sync
at the end), CUDA events around one call, and a cProfile of the small decode step.  Also the
cost of the CuPy primitives a call is made of (allocation, an elementwise op, a RawKernel launch
with many scalar arguments vs one struct argument), and torch SDPA's host cost in the same
process.

    PYTHONPATH=. python3 tools/profile_host.py [--profile] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import numpy as np

# After PYTHONPATH: an A/B run can put another checkout's package first.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cupy  # noqa: E402
import ml_dtypes  # noqa: E402

import cupy_flashattn as fa  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


def host_us(fn, n=300, warmup=20):
    """Wall µs per call of n back-to-back calls with one synchronisation at the end."""
    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t) / n * 1e6


def one_call_us(fn, reps=50):
    """CUDA events around one call (its host work and its kernels), median µs."""
    fn()
    cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
    return float(np.median(ts))


def rnd(shape, dt=BF16):
    return cupy.random.standard_normal(shape, dtype=np.float32).astype(dt)


def cases():
    H, Hk, D, P = 32, 8, 128, 16
    out = {}
    # small decode step, paged, append one token (issue 15's row)
    B, ctx = 1, 512
    nblk = 64
    kp, vp = rnd((nblk, P, Hk, D)), rnd((nblk, P, Hk, D))
    table = cupy.arange(B * (ctx // P + 2), dtype=cupy.int32).reshape(B, -1)
    lens = cupy.full((B,), ctx, dtype=cupy.int32)
    q1, k1, v1 = rnd((B, 1, H, D)), rnd((B, 1, Hk, D)), rnd((B, 1, Hk, D))
    out["decode_paged_append B=1"] = lambda: fa.flash_attn_with_kvcache(
        q1, kp, vp, k=k1, v=v1, cache_seqlens=lens, block_table=table, causal=True)
    out["decode_paged_noappend B=1"] = lambda: fa.flash_attn_with_kvcache(
        q1, kp, vp, cache_seqlens=lens, block_table=table, causal=True)
    kc, vc = rnd((B, ctx + 16, Hk, D)), rnd((B, ctx + 16, Hk, D))
    out["decode_contig_append B=1"] = lambda: fa.flash_attn_with_kvcache(
        q1, kc, vc, k=k1, v=v1, cache_seqlens=lens, causal=True)
    cache = fa.PagedKVCache(num_blocks=4096, page_block_size=P, num_heads_k=Hk, head_dim=D,
                            dtype=BF16, xp=cupy)
    sid = cache.add_sequence()
    cache.append([sid], rnd((ctx, Hk, D)), rnd((ctx, Hk, D)), cu_seqlens=[0, ctx])

    def cache_step():
        fa.flash_attn_with_kvcache(q1, cache, None, k=k1, v=v1, causal=True, seq_ids=[sid])
    out["PagedKVCache step B=1 (grows)"] = cache_step
    # MQA decode, no append: bench_decode.py's call; on a 9.0 GPU the swapped sm90 plan
    # (decode_sm90.py: the split kernel and the combine)
    Hm, ctx_m = 32, 4096
    pages_m = ctx_m // P
    km, vm = rnd((pages_m + 8, P, 1, D)), rnd((pages_m + 8, P, 1, D))
    table_m = cupy.arange(pages_m, dtype=cupy.int32).reshape(1, -1)
    lens_m = cupy.full((1,), ctx_m, dtype=cupy.int32)
    qm = rnd((1, 1, Hm, D))
    out["decode_mqa_paged_noappend B=1"] = lambda: fa.flash_attn_with_kvcache(
        qm, km, vm, cache_seqlens=lens_m, block_table=table_m, causal=True)
    # small dense prefill
    qd, kd = rnd((1, 128, H, D)), rnd((1, 128, Hk, D))
    out["dense B=1 S=128"] = lambda: fa.flash_attn_func(qd, kd, kd, causal=True)
    attn = fa.FlashAttention(causal=True)
    out["FlashAttention obj dense"] = lambda: attn(qd, kd, kd)
    # small varlen
    cu = cupy.asarray([0, 64, 128], dtype=cupy.int32)
    qv, kv = rnd((128, H, D)), rnd((128, Hk, D))
    out["varlen 2x64"] = lambda: fa.flash_attn_varlen_func(qv, kv, kv, cu, cu, 64, 64, causal=True)
    out["varlen paged 2x64"] = lambda: fa.flash_attn_varlen_func(
        qv, kp, vp, cu, cu, 64, 64, causal=True, block_table=table[:1].repeat(2, 0))
    return out, (q1, kc, vc)


def torch_rows(q1, kc, vc):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt = torch.from_dlpack(q1).transpose(1, 2)
    kt = torch.from_dlpack(kc).transpose(1, 2)
    vt = torch.from_dlpack(vc).transpose(1, 2)
    rows = {}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def f(be=be):
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        try:
            f()
            rows[f"torch sdpa {name} decode B=1"] = f
        except Exception as exc:  # pragma: no cover
            print(f"torch {name}: {exc!r}")
    return rows


def primitives():
    rows = {}
    rows["cupy.empty (1,32,128) bf16"] = lambda: cupy.empty((1, 32, 128), dtype=BF16)
    a = cupy.zeros(4, dtype=cupy.int32)
    rows["cupy a + 1 (int32, 4)"] = lambda: a + 1
    rows["cupy.full (1,)"] = lambda: cupy.full((1,), 5, dtype=cupy.int32)
    src = r"""
    struct P { const float* a; float* b; long long s[12]; int i[20]; float f[2]; };
    extern "C" __global__ void flat(const float* a, float* b,
      long long s0, long long s1, long long s2, long long s3, long long s4, long long s5,
      long long s6, long long s7, long long s8, long long s9, long long s10, long long s11,
      int i0, int i1, int i2, int i3, int i4, int i5, int i6, int i7, int i8, int i9,
      int i10, int i11, int i12, int i13, int i14, int i15, int i16, int i17, int i18, int i19,
      float f0, float f1) { if (threadIdx.x == 0 && i0 == 12345) b[0] = a[0]; }
    extern "C" __global__ void packed(P p) { if (threadIdx.x == 0 && p.i[0] == 12345) p.b[0] = p.a[0]; }
    """
    mod = cupy.RawModule(code=src)
    flat, packed = mod.get_function("flat"), mod.get_function("packed")
    x = cupy.zeros(4, dtype=cupy.float32)
    y = cupy.zeros(4, dtype=cupy.float32)
    args = (x, y) + tuple(np.int64(i) for i in range(12)) + tuple(np.int32(i) for i in range(20)) + (
        np.float32(1), np.float32(2))
    rows["RawKernel launch, 36 flat args"] = lambda: flat((1,), (32,), args)
    dt = np.dtype([("a", np.uint64), ("b", np.uint64), ("s", np.int64, 12), ("i", np.int32, 20),
                   ("f", np.float32, 2)], align=True)
    buf = np.zeros((), dtype=dt)
    try:
        buf["a"], buf["b"] = x.data.ptr, y.data.ptr
        buf["i"][0] = 12345
        x[0] = 7.0
        packed((1,), (32,), (buf[()],))
        cupy.cuda.Device().synchronize()
        ok = float(y[0]) == 7.0
        print(f"struct argument through numpy void scalar: {'works' if ok else 'WRONG VALUE'}")

        def launch_packed():
            b = buf.copy()
            b["a"] = x.data.ptr
            b["b"] = y.data.ptr
            packed((1,), (32,), (b[()],))
        rows["RawKernel launch, 1 struct arg (+2 ptr writes)"] = launch_packed
    except Exception as exc:
        print(f"struct argument through numpy void scalar: FAILS {exc!r}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    print(f"cupy {cupy.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}, "
          f"cupy_flashattn from {os.path.dirname(fa.__file__)}")
    rows, (q1, kc, vc) = cases()
    try:
        rows.update(torch_rows(q1, kc, vc))
    except Exception as exc:  # pragma: no cover
        print(f"torch unavailable: {exc!r}")
    rows.update(primitives())
    print(f"{'row':48s} {'host us/call':>13s} {'one call us':>12s}")
    for name, fn in rows.items():
        print(f"{name:48s} {host_us(fn):13.1f} {one_call_us(fn):12.1f}", flush=True)
    if a.profile:
        for row, fname, order in (("decode_paged_append B=1", "profile_decode.txt", "tottime"),
                                  ("decode_mqa_paged_noappend B=1", "profile_mqa.txt", "tottime"),
                                  ("PagedKVCache step B=1 (grows)", "profile_cache_step.txt",
                                   "cumulative")):
            fn = rows[row]
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(300):
                fn()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats(order).print_stats(40)
            text = s.getvalue()
            print(f"-- cProfile of {row} (300 calls, by {order})")
            print(text[:3000])
            if a.out:
                with open(os.path.join(a.out, fname), "w") as f:
                    f.write(text)

if __name__ == "__main__":
    main()
