"""``python -m cupy_flashattn bench``: a quick side-by-side timing on this machine.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from ._common import (
    _flops,
    _host,
    _ms,
    _np_dtype,
    _out,
    pick_backend,
)

# -- bench ------------------------------------------------------------------------------------


def _median_time(fn, sync, repeats: int) -> float:
    fn()  # warm-up: compiles on first use
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _torch_cuda():
    try:
        import torch

        if torch.cuda.is_available():
            return torch
    except Exception:
        pass
    return None


#: The CPU comparisons materialise the (H, Sq, Sk) score matrix; above this they are skipped.
_MAX_SCORE_BYTES = 2 << 30
#: Default pool sizes (pages) of the CPU decode rows whose cost must not depend on the pool.
POOL_PAGES = (64, 1024, 16384)


def numpy_attention_f32(q, k, v, causal: bool = False):
    """Plain NumPy float32 attention, the same work as a dense ``flash_attn_func`` call: per
    (batch, kv head) one matmul for the scores, a softmax, one matmul for the output; GQA by
    grouping the query heads of each kv head; the causal mask bottom-right aligned.

    q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hk, D)``; returns float32 ``(B, Sq, H, D)``.  This is
    what a user would write in NumPy (BLAS matmuls), so it is the fair CPU peer of ours; the
    float64 :func:`~cupy_flashattn.reference.attention_ref` is the accuracy oracle."""
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    qt = np.asarray(q, np.float32).transpose(0, 2, 1, 3).reshape(B, Hk, g * Sq, D)
    kt = np.asarray(k, np.float32).transpose(0, 2, 3, 1)  # (B, Hk, D, Sk)
    vt = np.asarray(v, np.float32).transpose(0, 2, 1, 3)  # (B, Hk, Sk, D)
    s = np.matmul(qt, kt).reshape(B, Hk, g, Sq, Sk)
    s *= np.float32(1.0 / math.sqrt(D))
    if causal:
        i = np.arange(Sq)[:, None]
        j = np.arange(Sk)[None, :]
        s[..., j > i + (Sk - Sq)] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    o = np.matmul(s.reshape(B, Hk, g * Sq, Sk), vt).reshape(B, H, Sq, D)
    return o.transpose(0, 2, 1, 3)


def pool_decode_rows(dtype_names, pages=POOL_PAGES, steps: int = 5, batch: int = 4,
                     context: int = 128, page_block_size: int = 16, num_heads: int = 8,
                     num_heads_k: int = 2, head_dim: int = 64, seed: int = 0):
    """CPU decode steps against a :class:`PagedKVCache` whose pool grows while the sequences do
    not: ``[(case, provider, seconds per step, note)]``, one row per (dtype, pool size).

    Each step is one ``flash_attn_with_kvcache`` call appending one token per sequence (so the
    sequences grow by ``steps + 1`` tokens, which the smallest pool must hold).  The time
    should be flat across ``pages``: a call works on the pages its sequences own, never the
    whole pool."""
    import cupy_flashattn as fa

    rng = np.random.default_rng(seed)
    B, P, H, Hk, D = batch, page_block_size, num_heads, num_heads_k, head_dim
    need = B * -(-(context + steps + 1) // P)
    rows = []
    for name in dtype_names:
        dt = _np_dtype(name)
        for n in pages:
            if n < need:
                rows.append((f"decode PagedKVCache {name}, pool {n} pages", "cupy_flashattn",
                             math.nan, f"skipped: {B} x {context + steps + 1} tokens need "
                                       f"{need} pages"))
                continue
            cache = fa.PagedKVCache(n, P, Hk, D, dt)
            ids = [cache.add_sequence() for _ in range(B)]
            cache.append(ids, rng.standard_normal((B, context, Hk, D)).astype(dt),
                         rng.standard_normal((B, context, Hk, D)).astype(dt))
            new = [tuple(rng.standard_normal((B, 1, h, D)).astype(dt) for h in (H, Hk, Hk))
                   for _ in range(steps + 1)]
            it = iter(new)

            def step():
                q1, k1, v1 = next(it)
                fa.flash_attn_with_kvcache(q1, cache, None, k=k1, v=v1, causal=True,
                                           seq_ids=ids)

            t = _median_time(step, lambda: None, steps)
            pool_mib = 2 * cache.k_pages.nbytes / 2**20
            rows.append((f"decode PagedKVCache {name}, pool {n} pages ({pool_mib:.0f} MiB k+v)",
                         "cupy_flashattn", t,
                         f"B={B} ctx {context}+{steps + 1} P={P} H={H}/{Hk} D={D}"))
    return rows


def cmd_bench(args) -> int:
    import cupy_flashattn as fa

    from ..reference import attention_ref

    be = pick_backend(args.cpu, args.dtype)
    rng = np.random.default_rng(0)
    gpu = be.on_gpu
    torch = _torch_cuda() if gpu else None
    B, S, H, Hk, D = (2, 2048, 16, 4, 128) if gpu else (1, 512, 8, 2, 64)
    S = S if args.seqlen is None else args.seqlen
    D = D if args.head_dim is None else args.head_dim
    Bd, Sd, P = (16, 4096, 64) if gpu else (8, 1024, 16)
    _out(f"bench: backend {be.label}, dtype {be.dtype_name}; median of {args.repeats} runs "
         "after 1 warm-up (the warm-up compiles)")
    rows = []
    notes = []
    slow_repeats = max(1, args.repeats // 2)
    fits = B * H * S * S * 8 <= _MAX_SCORE_BYTES  # the float64 reference's score matrix

    # prefill: dense causal, Sq = Sk
    q = be.asarray(rng.standard_normal((B, S, H, D)).astype(be.dtype))
    k = be.asarray(rng.standard_normal((B, S, Hk, D)).astype(be.dtype))
    v = be.asarray(rng.standard_normal((B, S, Hk, D)).astype(be.dtype))
    flops = 4 * B * H * S * S * D / 2
    case = f"prefill causal B={B} S={S} H={H}/{Hk} D={D}"
    t_ours = _median_time(lambda: fa.flash_attn_func(q, k, v, causal=True), be.sync, args.repeats)
    rows.append((case, "cupy_flashattn", t_ours, _flops(flops / t_ours)))
    if torch is not None:
        tq, tk, tv = (torch.from_dlpack(a).transpose(1, 2) for a in (q, k, v))  # (B, H, S, D)
        tk, tv = tk.repeat_interleave(H // Hk, 1), tv.repeat_interleave(H // Hk, 1)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        t = _median_time(lambda: sdpa(tq, tk, tv, is_causal=True), torch.cuda.synchronize,
                         args.repeats)
        rows.append(("", f"torch {torch.__version__} SDPA", t, _flops(flops / t)))
    elif not gpu and fits:
        t = _median_time(lambda: numpy_attention_f32(q, k, v, causal=True), be.sync,
                         args.repeats)
        rows.append(("", "NumPy float32 (matmul + softmax)", t,
                     f"{_flops(flops / t)}; ours {t_ours / t:.2f}x its time"))
        diff = float(np.abs(_host(fa.flash_attn_func(q, k, v, causal=True)).astype(np.float64)
                            - numpy_attention_f32(q, k, v, causal=True)).max())
        notes.append(f"prefill: max |ours - NumPy float32| = {diff:.2g}")
        t = _median_time(lambda: attention_ref(q, k, v, causal=True), be.sync, slow_repeats)
        rows.append(("", "reference (NumPy float64)", t, _flops(flops / t)))
    elif not gpu:
        rows.append(("", "NumPy float32 / reference", math.nan,
                     f"skipped: the {H} x {S} x {S} score matrix would exceed "
                     f"{_MAX_SCORE_BYTES >> 30} GiB"))
    else:
        rows.append(("", "torch SDPA", math.nan, "skipped: torch with CUDA is not importable"))

    # decode: one query token per sequence against a paged cache of Sd tokens each
    num_blocks = Bd * (Sd // P)
    k_pages = be.asarray(rng.standard_normal((num_blocks, P, Hk, D)).astype(be.dtype))
    v_pages = be.asarray(rng.standard_normal((num_blocks, P, Hk, D)).astype(be.dtype))
    table = be.asarray(rng.permutation(num_blocks).astype(np.int32).reshape(Bd, Sd // P))
    lens = be.asarray(np.full(Bd, Sd, np.int32))
    q1 = be.asarray(rng.standard_normal((Bd, 1, H, D)).astype(be.dtype))
    kv_bytes = 2 * Bd * Sd * Hk * D * be.dtype.itemsize
    case = f"decode paged B={Bd} Sk={Sd} P={P} H={H}/{Hk} D={D}"
    t = _median_time(lambda: fa.flash_attn_with_kvcache(q1, k_pages, v_pages, cache_seqlens=lens,
                                                        block_table=table),
                     be.sync, args.repeats)
    rows.append((case, "cupy_flashattn", t, f"{kv_bytes / t / 1e9:.1f} GB/s"))
    # peers read a contiguous copy of the same keys (they have no paged layout)
    tab_h = _host(table)
    kd = k_pages[be.asarray(tab_h)].reshape(Bd, Sd, Hk, D)
    vd = v_pages[be.asarray(tab_h)].reshape(Bd, Sd, Hk, D)
    if torch is not None:
        tq = torch.from_dlpack(q1).transpose(1, 2)
        tk = torch.from_dlpack(kd).transpose(1, 2).repeat_interleave(H // Hk, 1)
        tv = torch.from_dlpack(vd).transpose(1, 2).repeat_interleave(H // Hk, 1)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        t = _median_time(lambda: sdpa(tq, tk, tv), torch.cuda.synchronize, args.repeats)
        rows.append(("", "torch SDPA (contiguous, kv repeated)", t,
                     f"{kv_bytes / t / 1e9:.1f} GB/s"))
    elif not gpu:
        t_d = t
        t = _median_time(lambda: numpy_attention_f32(q1, kd, vd), be.sync, args.repeats)
        rows.append(("", "NumPy float32 (matmul + softmax, contiguous)", t,
                     f"{kv_bytes / t / 1e9:.1f} GB/s; ours {t_d / t:.2f}x its time"))
        t = _median_time(lambda: attention_ref(q1, kd, vd), be.sync, slow_repeats)
        rows.append(("", "reference (NumPy float64, contiguous)", t,
                     f"{kv_bytes / t / 1e9:.1f} GB/s"))

    if not gpu:
        # A decode step's cost follows the sequences, not the pool (bf16 pools are converted
        # only where the call reads them).
        names = ["bfloat16"] + ([be.dtype_name] if be.dtype_name != "bfloat16" else [])
        rows.extend(pool_decode_rows(names, args.pool_pages, steps=min(args.repeats, 64)))

    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    _out(f"{'case':<{w0}}  {'provider':<{w1}}  {'time':>10}  throughput")
    for case, provider, t, thr in rows:
        ts = "-" if math.isnan(t) else _ms(t)
        _out(f"{case:<{w0}}  {provider:<{w1}}  {ts:>10}  {thr}")
    for note in notes:
        _out(note)
    _out("FLOPs = 4*B*H*Sq*Sk*D / 2 (causal); decode bandwidth = bytes of K and V read / time. "
         "Full benchmarks: make bench (benchmarks/bench.py).")
    if not gpu:
        _out("CPU backend: Numba loops, no BLAS; it never builds the Sq x Sk score matrix "
             "(memory O(S), not O(S^2)). For long dense prefill NumPy's BLAS matmul + softmax "
             "can be faster (about 2-3x at S=2048 non-causal, about even when causal); the CPU "
             "backend is for portability, paged/varlen/decode calls and testing, the GPU for "
             "speed.")
    return 0
