"""Every CUDA kernel of cupy_flashattn once, at tiny sizes, for compute-sanitizer
(``tools/sanitize.sh`` runs it under memcheck, racecheck, initcheck and synccheck).

Covered (22 kernels, plus the float32 / float64 prefill): the prefill kernel dense / varlen / paged, float16 and bfloat16, head-dim
buckets 64 and 128, plain (causal, local window) and transform (softcap + ALiBi) instantiations;
page sizes 16 and 48 with partial last pages and junk pages; the decode kernel (4
instantiations) with and without split-KV (so the combine kernel runs), contiguous and paged;
the rotary/append kernel (dense q rotation, contiguous and paged appends, PagedKVCache); the
combine kernel again through ``merge_attention_states`` (varlen and dense layouts); and block
tables with out-of-range page ids and ``check=False`` (they must read nothing).

Every output is NaN-poisoned and compared with the float64 reference (flash-attn's bound); the
script prints one line per case and ``sanitize cases: N ok, M failed`` last, exit 1 on a failure.
A sanitizer only needs the launches, but a wrong value under a sanitizer is worth knowing too.

Options:
  --no-pool  plain cudaMalloc per array instead of CuPy's memory pool, so memcheck / initcheck
             see each array's own bounds (the pool hands out slices of large blocks);
  --cpu      the same cases on NumPy arrays (the CPU backend): checks this script without a GPU.

Run it once without a sanitizer first (sanitize.sh does): that compiles every kernel into
``$CUPY_CACHE_DIR``, so the sanitized runs only load cubins.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_dtypes  # noqa: E402

import cupy_flashattn as fa  # noqa: E402
from cupy_flashattn.accuracy import error_bound  # noqa: E402
from cupy_flashattn.reference import attention_ref  # noqa: E402

# The tests' input helpers (random inputs, scattered pages): one home for both.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from helpers import cu_seqlens, randn, scatter_into_pages, varlen_batch  # noqa: E402
from cupy_flashattn.rotary import apply_rotary  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
xp = None  # cupy, or numpy with --cpu


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def dev(a):
    return None if a is None else xp.asarray(a)


def poisoned(shape, dt):
    return xp.full(shape, np.nan, dtype=dt)


class Failure(AssertionError):
    pass


def check(what, out, q, k, v, dt, **kw):
    """out of one sequence (Sq, H, D) within flash-attn's bound of the float64 reference."""
    out = host(out).astype(np.float64)
    if np.isnan(out).any():
        raise Failure(f"{what}: NaN in the output (unwritten elements)")
    ref = attention_ref(q, k, v, **kw)
    naive = attention_ref(q, k, v, upcast=False, **kw).astype(np.float64)
    err = float(np.abs(out - ref).max(initial=0.0))
    bound = error_bound(np.abs(naive - ref).max(initial=0.0), dt)
    if not err <= bound:
        raise Failure(f"{what}: max error {err:.3g} > bound {bound:.3g}")
    return err


def scatter(rng, keys, values, P, dt):
    """Pages of P rows holding each sequence's keys in a random page order, plus junk pages
    (the tests' helper); returns (k_pages, v_pages, table)."""
    return scatter_into_pages(rng, keys, values, P, dt, spare_blocks=2, min_pages=1)


def logits(rng, mode, H):
    """(api kwargs, reference kwargs) of a mask / logit mode."""
    if mode == "causal":
        return dict(causal=True), dict(causal=True)
    if mode == "full":  # no mask at all (sm90: the wide D = 128 kernel)
        return {}, {}
    if mode == "local":
        return dict(window_size=(8, 4)), dict(window_size=(8, 4))
    if mode == "causal_sinks":
        s = rng.uniform(-1.0, 3.0, H).astype(np.float32)
        return dict(causal=True, sinks=dev(s)), dict(causal=True, sinks=s)
    slopes = rng.uniform(0.05, 0.5, H).astype(np.float32)  # "softcap_alibi"
    return (dict(softcap=5.0, alibi_slopes=dev(slopes)), dict(softcap=5.0, alibi_slopes=slopes))


# -- cases ------------------------------------------------------------------------------------


def prefill_dense(rng, dt, D, mode, long=False):
    # 160 packed rows per kv head: the prefill kernel.  long: keys over several key tiles, so
    # the sm90 kernel loads whole tiles and (a dense batch: its K/V maps end at each sequence's
    # end) the sequence-end tile by TMA; varlen gathers that tile by cp.async.
    B, Sq, Sk, H, Hk = (2, 200, 300, 4, 1) if long else (2, 80, 100, 2, 1)
    q, k, v = randn(rng, (B, Sq, H, D), dt), randn(rng, (B, Sk, Hk, D), dt), randn(rng, (B, Sk, Hk, D), dt)
    api, ref = logits(rng, mode, H)
    out = poisoned(q.shape, dt)
    fa.flash_attn_func(dev(q), dev(k), dev(v), out=out, **api)
    return max(check(f"batch {b}", out[b], q[b], k[b], v[b], dt, **ref) for b in range(B))


def prefill_varlen(rng, dt, D, mode, P=0):
    H, Hk = 4, 2
    lens_q, lens_k = ([70, 0, 33], [100, 5, 40]) if not P else ([70, 20], [100, 33])
    q, keys, values, cu_q, cu_k = varlen_batch(rng, lens_q, lens_k, H, Hk, D, dt)
    kw = {}
    if P:
        kp, vp, table = scatter(rng, keys, values, P, dt)
        k_arg, v_arg = dev(kp), dev(vp)
        kw["block_table"] = dev(table)
    else:
        k_arg, v_arg = dev(np.concatenate(keys)), dev(np.concatenate(values))
    api, ref = logits(rng, mode, H)
    out = poisoned(q.shape, dt)
    fa.flash_attn_varlen_func(dev(q), k_arg, v_arg, dev(cu_q), dev(cu_k), max(lens_q), max(lens_k),
                              out=out, check=True, **kw, **api)
    errs = [0.0]
    for b in range(len(lens_q)):
        s, e = int(cu_q[b]), int(cu_q[b + 1])
        if e > s:
            errs.append(check(f"seq {b}", out[s:e], q[s:e], keys[b], values[b], dt, **ref))
    return max(errs)


def decode(rng, dt, D, splits, P=0, sinks=False, heads=(8, 2), swap=True):
    """flash_attn_with_kvcache without new tokens: the decode kernel (split-KV when splits > 1;
    with ``sinks``, the combine adds them).  ``heads`` (H, Hk): more than 16 query heads per kv
    head take several 16-row tiles of one kv head -- on compute capability 9.0, MQA with 16 or
    more heads runs the sm90 split kernel with swapped rows instead (_cuda/decode_sm90.py)
    unless ``swap`` is False (CUPY_FLASHATTN_DECODE_SM90=0 for the call)."""
    if not swap:
        os.environ["CUPY_FLASHATTN_DECODE_SM90"] = "0"
        try:
            return decode(rng, dt, D, splits, P, sinks, heads)
        finally:
            del os.environ["CUPY_FLASHATTN_DECODE_SM90"]
    (H, Hk), B, S = heads, 3, 300
    lens = np.array([1, 250, 77], np.int32)
    q = randn(rng, (B, 1, H, D), dt)
    keys = [randn(rng, (int(n), Hk, D), dt) for n in lens]
    values = [randn(rng, (int(n), Hk, D), dt) for n in lens]
    kw = {}
    if P:
        kp, vp, table = scatter(rng, keys, values, P, dt)
        kc, vc = dev(kp), dev(vp)
        kw["block_table"] = dev(table)
    else:
        kc_h, vc_h = randn(rng, (B, S, Hk, D), dt), randn(rng, (B, S, Hk, D), dt)
        for b in range(B):
            kc_h[b, : lens[b]], vc_h[b, : lens[b]] = keys[b], values[b]
        kc, vc = dev(kc_h), dev(vc_h)
    ref = dict(softcap=20.0)
    if sinks:
        ref["sinks"] = rng.uniform(-1.0, 3.0, H).astype(np.float32)
        kw["sinks"] = dev(ref["sinks"])
    out = poisoned(q.shape, dt)
    fa.flash_attn_with_kvcache(dev(q), kc, vc, cache_seqlens=dev(lens), num_splits=splits,
                               softcap=20.0, out=out, check=True, **kw)
    return max(check(f"batch {b}", out[b], q[b], keys[b], values[b], dt, **ref)
               for b in range(B))


def _rotary(rng, n, half):
    ang = rng.uniform(0, 2 * np.pi, (n, half))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rot(x, cos, sin, pos, interleaved):
    return apply_rotary(x[None], cos, sin, np.asarray(pos)[None], interleaved)[0]


def append_rotary(rng, dt, D, P=0, interleaved=False, splits=2):
    """flash_attn_with_kvcache with new k/v and rotary: the rotary kernel on q, the fused
    rotary + append kernel into a contiguous (P = 0) or paged cache, then decode (+ combine)."""
    B, H, Hk, S, S_new = 2, 8, 2, 64, 2
    lens = np.array([0, 40], np.int32)
    q = randn(rng, (B, S_new, H, D), dt)
    k_new, v_new = randn(rng, (B, S_new, Hk, D), dt), randn(rng, (B, S_new, Hk, D), dt)
    cos, sin = _rotary(rng, S, D // 4)
    kw = {}
    if P:
        n_pages = B * (S // P) + 2
        table = rng.permutation(n_pages)[: B * (S // P)].reshape(B, S // P).astype(np.int32)
        kc_h, vc_h = randn(rng, (n_pages, P, Hk, D), dt), randn(rng, (n_pages, P, Hk, D), dt)
        kw["block_table"] = dev(table)

        def at(b, pos):
            return table[b, pos // P], pos % P
    else:
        kc_h, vc_h = randn(rng, (B, S, Hk, D), dt), randn(rng, (B, S, Hk, D), dt)

        def at(b, pos):
            return b, pos
    k_exp, v_exp = kc_h.copy(), vc_h.copy()
    kc, vc = dev(kc_h), dev(vc_h)
    out = poisoned(q.shape, dt)
    fa.flash_attn_with_kvcache(dev(q), kc, vc, dev(k_new), dev(v_new), rotary_cos=dev(cos),
                               rotary_sin=dev(sin), cache_seqlens=dev(lens), causal=True,
                               rotary_interleaved=interleaved, num_splits=splits, out=out,
                               check=True, **kw)
    errs = []
    for b in range(B):
        pos = int(lens[b]) + np.arange(S_new)
        k_exp[at(b, pos)] = _rot(k_new[b], cos, sin, pos, interleaved)
        v_exp[at(b, pos)] = v_new[b]
    for name, got, exp in (("k_cache", kc, k_exp), ("v_cache", vc, v_exp)):
        if not np.array_equal(host(got).view(np.uint16), exp.view(np.uint16)):
            raise Failure(f"{name} after the append differs from the expected rows")
    for b in range(B):
        pos = np.arange(int(lens[b]) + S_new)
        q_rot = _rot(q[b], cos, sin, int(lens[b]) + np.arange(S_new), interleaved)
        errs.append(check(f"batch {b}", out[b], q_rot, k_exp[at(b, pos)], v_exp[at(b, pos)], dt,
                          causal=True))
    return max(errs)


def paged_cache_object(rng, dt=F16, D=64):
    """PagedKVCache: its append (paged append kernel), then a decode step with rotary through it
    (rotary kernel on q and new k, append, decode with the split heuristic + combine)."""
    H, Hk, P = 4, 2, 16
    cache = fa.PagedKVCache(16, P, Hk, D, dt, xp=xp)
    ids = [cache.add_sequence() for _ in range(2)]
    ks = [randn(rng, (n, Hk, D), dt) for n in (40, 3)]
    vs = [randn(rng, (n, Hk, D), dt) for n in (40, 3)]
    cache.append(ids[0], dev(ks[0][None]), dev(vs[0][None]))
    cache.append(ids[1], dev(ks[1][None]), dev(vs[1][None]))
    q = randn(rng, (2, 1, H, D), dt)
    kn, vn = randn(rng, (2, 1, Hk, D), dt), randn(rng, (2, 1, Hk, D), dt)
    cos, sin = _rotary(rng, 128, D // 2)
    out = poisoned(q.shape, dt)
    fa.flash_attn_with_kvcache(dev(q), cache, None, dev(kn), dev(vn), rotary_cos=dev(cos),
                               rotary_sin=dev(sin), seq_ids=ids, causal=True, out=out, check=True)
    errs = []
    for j, L in enumerate((40, 3)):
        pos = np.array([L])
        keys = np.concatenate([ks[j], _rot(kn[j], cos, sin, pos, True)])
        values = np.concatenate([vs[j], vn[j]])
        errs.append(check(f"seq {j}", out[j], _rot(q[j], cos, sin, pos, True), keys, values, dt,
                          causal=True))
    return max(errs)


def merge(rng, dt, dense):
    """merge_attention_states of two partial results over disjoint key halves (the combine
    kernel) against attention over all keys."""
    H, Hk, D, Sq, Sk = 4, 2, 64, 5, 90
    q = randn(rng, (2, Sq, H, D), dt)
    k, v = randn(rng, (2, Sk, Hk, D), dt), randn(rng, (2, Sk, Hk, D), dt)
    half = Sk // 3
    parts = []
    for sl in (slice(0, half), slice(half, Sk)):
        if dense:
            parts.append(fa.flash_attn_func(dev(q), dev(np.ascontiguousarray(k[:, sl])),
                                            dev(np.ascontiguousarray(v[:, sl])),
                                            return_softmax_lse=True))
        else:  # varlen: (total, H, D) outputs with (H, total) LSEs
            n = sl.stop - sl.start
            cu_q = np.array([0, Sq, 2 * Sq], np.int32)
            cu_k = np.array([0, n, 2 * n], np.int32)
            parts.append(fa.flash_attn_varlen_func(
                dev(q.reshape(-1, H, D)), dev(np.ascontiguousarray(k[:, sl]).reshape(-1, Hk, D)),
                dev(np.ascontiguousarray(v[:, sl]).reshape(-1, Hk, D)), dev(cu_q), dev(cu_k), Sq,
                n, return_softmax_lse=True))
    (oa, la), (ob, lb) = parts
    out, _ = fa.merge_attention_states(oa, la, ob, lb)
    out = host(out).reshape(2, Sq, H, D)
    return max(check(f"batch {b}", out[b], q[b], k[b], v[b], dt) for b in range(2))


def absent_pages(rng, dt=BF16, D=128):
    """Block tables with out-of-range page ids and check=False: prefill and decode read nothing
    there (no fault, no NaN; those keys are absent)."""
    H, Hk, P, n_pages = 4, 2, 16, 6
    kp, vp = randn(rng, (n_pages, P, Hk, D), dt), randn(rng, (n_pages, P, Hk, D), dt)
    table = np.array([[0, -1, 2**31 - 1, 1], [n_pages, 3, -2**31, 4]], np.int32)
    lens_k = np.array([60, 50], np.int32)
    outs = []
    for lens_q in ([70, 20], [1, 1]):  # prefill (mixed with decode), then decode only
        cu_q = cu_seqlens(lens_q)
        cu_k = cu_seqlens(lens_k)
        q = randn(rng, (int(cu_q[-1]), H, D), dt)
        out = poisoned(q.shape, dt)
        args = (dev(q), dev(kp), dev(vp), dev(cu_q), dev(cu_k), max(lens_q), int(lens_k.max()))
        if xp is np:  # NumPy inputs are always fully validated: the bad ids are refused
            try:
                fa.flash_attn_varlen_func(*args, block_table=dev(table), out=out, check=False)
            except fa.BlockTableError:
                continue
            raise Failure("the CPU backend accepted out-of-range page ids")
        fa.flash_attn_varlen_func(*args, block_table=dev(table), out=out, check=False)
        outs.append(host(out))
    if any(np.isnan(o.astype(np.float32)).any() for o in outs):
        raise Failure("NaN in the output with absent pages")
    return 0.0


def cases():
    out = []
    for dt in (F16, BF16):
        for D in (64, 128):
            for mode in ("causal", "softcap_alibi"):
                name = f"{dt.name}-d{D}-{mode}"
                out.append((f"prefill dense {name}", lambda r, a=(dt, D, mode): prefill_dense(r, *a)))
                P = 16 if mode == "causal" else 48
                out.append((f"prefill paged P={P} {name}",
                            lambda r, a=(dt, D, mode, P): prefill_varlen(r, *a)))
    out += [
        ("prefill varlen bfloat16-d64-causal", lambda r: prefill_varlen(r, BF16, 64, "causal")),
        ("prefill varlen float16-d128-local", lambda r: prefill_varlen(r, F16, 128, "local")),
        ("prefill dense bfloat16-d128 causal sinks",
         lambda r: prefill_dense(r, BF16, 128, "causal_sinks")),
        ("prefill dense long (TMA tiles) float16-d128 causal",
         lambda r: prefill_dense(r, F16, 128, "causal", long=True)),
        ("prefill dense long (TMA tiles) bfloat16-d64 softcap_alibi",
         lambda r: prefill_dense(r, BF16, 64, "softcap_alibi", long=True)),
        ("prefill dense long (wide tiles) bfloat16-d128 full",
         lambda r: prefill_dense(r, BF16, 128, "full", long=True)),
        ("prefill dense long (80-key tiles) float16-d256 full",
         lambda r: prefill_dense(r, F16, 256, "full", long=True)),
        ("prefill varlen (wide tiles) bfloat16-d128 full", lambda r: prefill_varlen(r, BF16, 128, "full")),
        ("decode paged P=16 bfloat16-d128 splits=3 sinks",
         lambda r: decode(r, BF16, 128, 3, P=16, sinks=True)),
        ("decode float16-d64 splits=1 sinks", lambda r: decode(r, F16, 64, 1, sinks=True)),
        ("decode float16-d64 splits=1", lambda r: decode(r, F16, 64, 1)),
        ("decode bfloat16-d128 splits=3", lambda r: decode(r, BF16, 128, 3)),
        ("decode paged P=16 bfloat16-d64 splits=3", lambda r: decode(r, BF16, 64, 3, P=16)),
        ("decode paged P=48 float16-d128 splits=1", lambda r: decode(r, F16, 128, 1, P=48)),
        ("decode MQA 32/1 (9.0: the sm90 split kernel, swapped rows) paged P=16 bfloat16-d128 "
         "splits=3 sinks", lambda r: decode(r, BF16, 128, 3, P=16, sinks=True, heads=(32, 1))),
        # P = 48, not the case above's 16: the switch is read when a call's plan is made, and
        # a call of the same signature would replay the cached swapped plan.
        ("decode MQA 32/1 (two 16-row tiles a kv head, DECODE_SM90=0) paged P=48 bfloat16-d128 "
         "splits=3 sinks",
         lambda r: decode(r, BF16, 128, 3, P=48, sinks=True, heads=(32, 1), swap=False)),
        ("decode MQA 32/1 (9.0: swapped, cp.async gather) paged P=7 float16-d64 splits=2",
         lambda r: decode(r, F16, 64, 2, P=7, heads=(32, 1))),
        ("decode MQA 16/1 (9.0: swapped) bfloat16-d192 heuristic splits",
         lambda r: decode(r, BF16, 192, 0, heads=(16, 1))),
        ("decode 24/1 (two 16-row tiles, 8 padding rows) float16-d64 splits=1",
         lambda r: decode(r, F16, 64, 1, heads=(24, 1))),
        ("rotary+append contiguous bfloat16-d128", lambda r: append_rotary(r, BF16, 128)),
        ("rotary+append paged P=16 float16-d64",
         lambda r: append_rotary(r, F16, 64, P=16, interleaved=True, splits=1)),
        ("PagedKVCache append + rotary decode float16-d64", lambda r: paged_cache_object(r)),
        ("merge_attention_states varlen bfloat16", lambda r: merge(r, BF16, dense=False)),
        ("merge_attention_states dense float16", lambda r: merge(r, F16, dense=True)),
        ("absent page ids (check=False; prefill, then decode) bfloat16-d128", lambda r: absent_pages(r)),
        # The float32 / float64 kernels (sm80/flash_fwd_precise.cu: its own tiles and swizzles;
        # float32 on a 9.0 GPU: the sm90 kernel over float16 planes and their pre-pass).
        ("prefill dense float32-d128 causal (sm90: float16 planes; sm80: 3xTF32)", lambda r: prefill_dense(r, F32, 128, "causal")),
        ("prefill dense long float32-d64 softcap_alibi",
         lambda r: prefill_dense(r, F32, 64, "softcap_alibi", long=True)),
        ("prefill paged P=16 float32-d128 causal", lambda r: prefill_varlen(r, F32, 128, "causal", 16)),
        # On a 9.0 GPU: the sm90 float32 kernel's varlen path (sequence-end tiles gathered by
        # cp.async from both planes).
        ("prefill varlen float32-d80 local", lambda r: prefill_varlen(r, F32, 80, "local")),
        ("prefill varlen float64-d64 local", lambda r: prefill_varlen(r, F64, 64, "local")),
        ("prefill paged P=48 float64-d128 softcap_alibi",
         lambda r: prefill_varlen(r, F64, 128, "softcap_alibi", 48)),
    ]
    return out


def main():
    global xp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-pool", action="store_true", help="cudaMalloc per array (no CuPy pool)")
    ap.add_argument("--cpu", action="store_true", help="NumPy arrays (CPU backend), no GPU")
    ap.add_argument("-k", default="", help="run only cases whose name contains this")
    args = ap.parse_args()
    if args.cpu:
        xp = np
    else:
        import cupy

        xp = cupy
        if args.no_pool:
            cupy.cuda.set_allocator(None)
    t0 = time.time()
    ok = failed = 0
    for i, (name, fn) in enumerate(cases()):
        if args.k not in name:
            continue
        rng = np.random.default_rng(i)
        t = time.time()
        try:
            err = fn(rng)
            if xp is not np:
                xp.cuda.runtime.deviceSynchronize()
            ok += 1
            print(f"ok    {name}  (max err {err:.2e}, {time.time() - t:.1f}s)", flush=True)
        except Exception as exc:  # keep going: the sanitizer should see every kernel
            failed += 1
            print(f"FAIL  {name}: {type(exc).__name__}: {exc}", flush=True)
            if not isinstance(exc, Failure):
                traceback.print_exc()
    print(f"sanitize cases: {ok} ok, {failed} failed ({time.time() - t0:.1f}s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
