"""cupy_flashattn quickstart: three attention calls, each checked against the float64 reference.

    python examples/quickstart.py          # or: make demo

Runs on the GPU (CuPy, bfloat16) when a CUDA device is usable, else on the Numba CPU backend
(NumPy, float32).  For each case it prints the backend, the shapes, the time of the first call
(which includes compiling the kernel, once per configuration: CuPy caches it on disk in
CUPY_CACHE_DIR, Numba in __pycache__) and of a second call, and the largest error against
``cupy_flashattn.reference.attention_ref`` next to flash-attn's bound
``2 * (error of a naive attention in the same precision) + eps``.

1. dense causal GQA      flash_attn_func
2. varlen batch          flash_attn_varlen_func (packed sequences of lengths 1 .. a few hundred)
3. paged prefill+decode  PagedKVCache + flash_attn_varlen_func, then flash_attn_with_kvcache
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import cupy_flashattn as fa  # noqa: E402
from cupy_flashattn.reference import attention_ref  # noqa: E402

# Slack on top of 2x the naive error (the final rounding of the output to its dtype).
EPS = {"bfloat16": 1.6e-2, "float16": 2e-3, "float32": 2e-5}


def pick_backend():
    """(xp, dtype name, sync) for CuPy on a usable GPU, else NumPy on the CPU."""
    if os.environ.get("CUPY_FLASHATTN_DEMO_CPU"):
        return np, "float32", lambda: None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy, "bfloat16", cupy.cuda.Device().synchronize
    except Exception:  # no cupy, no driver, no device: fall back to the CPU
        pass
    return np, "float32", lambda: None


XP, DTYPE_NAME, SYNC = pick_backend()
ON_GPU = XP is not np
if DTYPE_NAME == "bfloat16":
    import ml_dtypes

    DTYPE = np.dtype(ml_dtypes.bfloat16)
else:
    DTYPE = np.dtype(DTYPE_NAME)
RNG = np.random.default_rng(0)


def randn(*shape):
    """Random normal array in the demo dtype, on the demo backend."""
    return XP.asarray(RNG.standard_normal(shape).astype(DTYPE))


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def timed(fn):
    """(result, "first call .. ms (includes compile), second .. ms")."""
    t0 = time.perf_counter()
    result = fn()
    SYNC()
    t1 = time.perf_counter()
    fn()
    SYNC()
    t2 = time.perf_counter()
    return result, f"first call {ms(t1 - t0)} (compiles on first use), second {ms(t2 - t1)}"


def ms(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.3f} ms"


class Errors:
    """Accumulates max |out - ref64| and max |naive_lowp - ref64| over pieces of a result."""

    def __init__(self):
        self.err = 0.0
        self.naive = 0.0

    def add(self, out, q, k, v, causal):
        ref = attention_ref(q, k, v, causal=causal)  # float64
        naive = attention_ref(q, k, v, causal=causal, upcast=False)  # rounded like a naive kernel
        out = host(out).astype(np.float64)
        self.err = max(self.err, float(np.abs(out - ref).max(initial=0.0)))
        self.naive = max(self.naive, float(np.abs(naive.astype(np.float64) - ref).max(initial=0.0)))

    def report(self, name, shapes, times):
        bound = 2 * self.naive + EPS[DTYPE_NAME]
        verdict = "ok" if self.err <= bound else "ABOVE BOUND"
        print(f"{name}")
        print(f"  backend  {'cupy (GPU)' if ON_GPU else 'numpy (CPU, Numba)'}, {DTYPE_NAME}")
        print(f"  shapes   {shapes}")
        print(f"  time     {times}")
        print(f"  error    max|out - ref| = {self.err:.3g}  <=  bound {bound:.3g} "
              f"(2 x naive {self.naive:.3g} + {EPS[DTYPE_NAME]:g}): {verdict}")
        return self.err <= bound


def dense_causal_gqa():
    """1. Dense causal attention with grouped-query heads: 16 query heads share 4 kv heads."""
    B, S, H, Hk, D = (2, 1024, 16, 4, 128) if ON_GPU else (2, 256, 8, 2, 64)
    q, k, v = randn(B, S, H, D), randn(B, S, Hk, D), randn(B, S, Hk, D)
    out, times = timed(lambda: fa.flash_attn_func(q, k, v, causal=True))
    errors = Errors()
    errors.add(out, host(q), host(k), host(v), causal=True)
    shapes = f"q {tuple(q.shape)}, k/v {tuple(k.shape)} -> out {tuple(out.shape)}"
    return errors.report("1. dense causal GQA: flash_attn_func", shapes, times)


def varlen_batch():
    """2. Sequences of different lengths packed back to back, no padding."""
    lengths = [1, 97, 384, 1025, 13] if ON_GPU else [1, 97, 200, 13]
    H, Hk, D = (8, 2, 128) if ON_GPU else (4, 2, 64)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(cu[-1])
    q, k, v = randn(total, H, D), randn(total, Hk, D), randn(total, Hk, D)
    cu_x = XP.asarray(cu)
    out, times = timed(lambda: fa.flash_attn_varlen_func(
        q, k, v, cu_x, cu_x, max(lengths), max(lengths), causal=True))
    errors = Errors()
    qh, kh, vh = host(q), host(k), host(v)
    for b in range(len(lengths)):
        s, e = cu[b], cu[b + 1]
        errors.add(host(out)[s:e], qh[s:e], kh[s:e], vh[s:e], causal=True)
    shapes = (f"lengths {lengths}: q {tuple(q.shape)}, k/v {tuple(k.shape)}, "
              f"cu_seqlens {cu.tolist()}")
    return errors.report("2. varlen batch: flash_attn_varlen_func", shapes, times)


def paged_prefill_decode():
    """3. A paged KV cache: prefill prompts of different lengths, then decode token by token."""
    prompts = [45, 300, 7] if ON_GPU else [45, 120, 7]
    decode_steps = 4
    P = 16  # page_block_size: chosen once, here; the kernels read it from the cache
    H, Hk, D = (8, 2, 128) if ON_GPU else (4, 2, 64)
    cache = fa.PagedKVCache(num_blocks=64, page_block_size=P, num_heads_k=Hk, head_dim=D,
                            dtype=DTYPE, xp=XP)
    seqs = [cache.add_sequence() for _ in prompts]
    cu = np.concatenate([[0], np.cumsum(prompts)]).astype(np.int32)
    total = int(cu[-1])
    q, k, v = randn(total, H, D), randn(total, Hk, D), randn(total, Hk, D)
    cache.append(seqs, k, v, cu_seqlens=cu)

    # Prefill: the cache supplies k/v pages, block table, lengths and page size.
    t0 = time.perf_counter()
    out = fa.flash_attn_varlen_func(q, cache, None, XP.asarray(cu), None, max(prompts), None,
                                    causal=True)
    SYNC()
    prefill_time = time.perf_counter() - t0
    errors = Errors()
    keys = {b: [host(k)[cu[b]:cu[b + 1]]] for b in range(len(prompts))}
    vals = {b: [host(v)[cu[b]:cu[b + 1]]] for b in range(len(prompts))}
    for b in range(len(prompts)):
        s, e = cu[b], cu[b + 1]
        errors.add(host(out)[s:e], host(q)[s:e], keys[b][0], vals[b][0], causal=True)

    # Decode: one new token per sequence per step; flash_attn_with_kvcache appends it to the
    # cache (allocating a page when a sequence crosses a page boundary) and attends.
    decode_times = []
    for _ in range(decode_steps):
        B = len(seqs)
        q1, k1, v1 = randn(B, 1, H, D), randn(B, 1, Hk, D), randn(B, 1, Hk, D)
        t0 = time.perf_counter()
        out1 = fa.flash_attn_with_kvcache(q1, cache, None, k=k1, v=v1, causal=True,
                                          seq_ids=seqs)
        SYNC()
        decode_times.append(time.perf_counter() - t0)
        for b in range(B):
            keys[b].append(host(k1)[b])
            vals[b].append(host(v1)[b])
            errors.add(host(out1)[b], host(q1)[b], np.concatenate(keys[b]),
                       np.concatenate(vals[b]), causal=True)

    lengths = host(cache.seqlens(seqs)).tolist()
    shapes = (f"prompts {prompts} + {decode_steps} decode steps -> lengths {lengths}; "
              f"pages (num_blocks, P, Hk, D) = {tuple(cache.k_pages.shape)}, "
              f"block_table {tuple(cache.block_table(seqs).shape)}")
    return errors.report("3. paged prefill + decode: PagedKVCache, flash_attn_varlen_func, "
                         "flash_attn_with_kvcache", shapes,
                         f"prefill {ms(prefill_time)} (first call); decode "
                         f"step {ms(float(np.median(decode_times[1:])))} (median after the first)")


def main() -> int:
    print(f"cupy_flashattn {getattr(fa, '__version__', '?')}: "
          f"{'GPU via CuPy' if ON_GPU else 'no usable CUDA GPU, CPU backend (Numba)'}\n")
    results = [dense_causal_gqa(), varlen_batch(), paged_prefill_decode()]
    print("\nall within bound" if all(results) else "\nSOME RESULTS ABOVE BOUND")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
