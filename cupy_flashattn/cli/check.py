"""``python -m cupy_flashattn check``: a short self-test against the float64 reference with the
tests' accuracy bound (``cupy_flashattn.accuracy``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..accuracy import eps_for
from ._common import (
    Backend,
    _host,
    _ms,
    _np_dtype,
    _out,
    _short,
    pick_backend,
)

# -- check ------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str
    seconds: float = 0.0


class _Errors:
    """max |out - ref| and flash-attn's bound 2 * max |naive - ref| + eps, plus an LSE check."""

    def __init__(self, dtype_name: str, compute_name: str = ""):
        self.compute = _np_dtype(compute_name or dtype_name)
        self.eps = eps_for(compute_name or dtype_name)  # the tests' bound (accuracy.py)
        self.err = self.naive = self.lse_err = 0.0
        self.problems: list[str] = []

    def add(self, out, q, k, v, lse=None, **kw):
        from ..reference import attention_ref

        ref, ref_lse = attention_ref(q, k, v, return_lse=True, **kw)
        # naive: the same attention rounded at every step to the precision the backend
        # computes in (inputs rounded too when that is narrower than their dtype)
        lowp = [a.astype(self.compute) for a in (q, k, v)]
        naive = attention_ref(*lowp, upcast=False, **kw)
        out = _host(out).astype(np.float64)
        if np.isnan(out).any():
            self.problems.append("NaN in out")
        self.err = max(self.err, float(np.nanmax(np.abs(out - ref), initial=0.0)))
        self.naive = max(self.naive, float(np.abs(naive.astype(np.float64) - ref).max(initial=0.0)))
        if lse is not None:
            lse = _host(lse).astype(np.float64)
            if not np.array_equal(np.isinf(lse), np.isinf(ref_lse)) or np.isnan(lse).any():
                self.problems.append("LSE +inf pattern differs (rows that see no key)")
            finite = np.isfinite(ref_lse)
            if finite.any():
                rel = np.abs(lse[finite] - ref_lse[finite]) / (1 + np.abs(ref_lse[finite]))
                self.lse_err = max(self.lse_err, float(np.nanmax(rel)))

    @property
    def bound(self) -> float:
        return 2 * self.naive + self.eps

    def result(self, name: str, what: str) -> CheckResult:
        ok = self.err <= self.bound and self.lse_err <= 1e-3 and not self.problems
        detail = (f"{what}: max|out-ref| {self.err:.2e} <= bound {self.bound:.2e}"
                  if self.err <= self.bound else
                  f"{what}: max|out-ref| {self.err:.2e} ABOVE bound {self.bound:.2e}")
        detail += f", LSE rel err {self.lse_err:.1e}"
        if self.problems:
            detail += "; " + "; ".join(sorted(set(self.problems)))
        return CheckResult(name, ok, detail)


def _rand(rng, shape, be: Backend):
    host = rng.standard_normal(shape).astype(be.dtype)
    return host, be.asarray(host)


def _case_dense(rng, be: Backend) -> CheckResult:
    import cupy_flashattn as fa

    B, Sq, Sk, H, Hk, D = 2, 77, 128, 8, 2, 64
    (qh, q), (kh, k), (vh, v) = (_rand(rng, s, be) for s in
                                 [(B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D)])
    errors = _Errors(be.dtype_name, be.compute_name)
    for causal in (False, True):
        out, lse = fa.flash_attn_func(q, k, v, causal=causal, return_softmax_lse=True)
        errors.add(out, qh, kh, vh, lse, causal=causal)
    return errors.result("dense", f"q {(B, Sq, H, D)} k/v {(B, Sk, Hk, D)}, GQA {H}/{Hk}, "
                                  "causal+non-causal")


def _case_features(rng, be: Backend) -> CheckResult:
    import cupy_flashattn as fa

    B, S, H, Hk, D = 2, 100, 4, 4, 80
    (qh, q), (kh, k), (vh, v) = (_rand(rng, (B, S, h, D), be) for h in (H, Hk, Hk))
    slopes_h = rng.uniform(0.01, 0.2, (H,)).astype(np.float32)
    kw = {"window_size": (32, 8), "softcap": 20.0}
    out, lse = fa.flash_attn_func(q, k, v, alibi_slopes=be.asarray(slopes_h),
                                  return_softmax_lse=True, **kw)
    errors = _Errors(be.dtype_name, be.compute_name)
    errors.add(out, qh, kh, vh, lse, alibi_slopes=slopes_h, **kw)
    return errors.result("features", f"D={D}, window (32, 8), softcap 20, ALiBi")


def _varlen_inputs(rng, be, lens_q, lens_k, H, Hk, D):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    qh, q = _rand(rng, (int(cu_q[-1]), H, D), be)
    kh, k = _rand(rng, (int(cu_k[-1]), Hk, D), be)
    vh, v = _rand(rng, (int(cu_k[-1]), Hk, D), be)
    return cu_q, cu_k, (qh, q), (kh, k), (vh, v)


def _case_varlen(rng, be: Backend) -> CheckResult:
    import cupy_flashattn as fa

    lens_q, lens_k, H, Hk, D = [1, 37, 130, 0, 64], [50, 37, 200, 5, 64], 6, 2, 64
    cu_q, cu_k, (qh, q), (kh, k), (vh, v) = _varlen_inputs(rng, be, lens_q, lens_k, H, Hk, D)
    out, lse = fa.flash_attn_varlen_func(q, k, v, be.asarray(cu_q), be.asarray(cu_k),
                                         max(lens_q), max(lens_k), causal=True,
                                         return_softmax_lse=True)
    out, lse = _host(out), _host(lse)
    errors = _Errors(be.dtype_name, be.compute_name)
    for b in range(len(lens_q)):
        s, e, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if e > s:
            errors.add(out[s:e], qh[s:e], kh[ks:ke], vh[ks:ke], lse[:, s:e], causal=True)
    return errors.result("varlen", f"lengths q {lens_q} k {lens_k}, causal")


def _case_paged(rng, be: Backend) -> CheckResult:
    """A raw block table over randomly permuted pages (not PagedKVCache)."""
    import cupy_flashattn as fa

    lens_q, lens_k, H, Hk, D, P = [3, 20, 7], [50, 300, 7], 8, 2, 64, 16
    cu_q, cu_k, (qh, q), (kh, _), (vh, _) = _varlen_inputs(rng, be, lens_q, lens_k, H, Hk, D)
    pages = [-(-n // P) for n in lens_k]
    num_blocks = sum(pages) + 4
    perm = rng.permutation(num_blocks).astype(np.int32)
    k_pages = rng.standard_normal((num_blocks, P, Hk, D)).astype(be.dtype)  # garbage elsewhere
    v_pages = rng.standard_normal((num_blocks, P, Hk, D)).astype(be.dtype)
    table = np.zeros((len(lens_k), max(pages)), np.int32)
    nxt = 0
    for b, n in enumerate(lens_k):
        table[b, : pages[b]] = perm[nxt: nxt + pages[b]]
        nxt += pages[b]
        pos = np.arange(n)
        k_pages[table[b, pos // P], pos % P] = kh[cu_k[b]: cu_k[b + 1]]
        v_pages[table[b, pos // P], pos % P] = vh[cu_k[b]: cu_k[b + 1]]
    out, lse = fa.flash_attn_varlen_func(
        q, be.asarray(k_pages), be.asarray(v_pages), be.asarray(cu_q), be.asarray(cu_k),
        max(lens_q), max(lens_k), causal=True, block_table=be.asarray(table),
        page_block_size=P, return_softmax_lse=True,
    )
    out, lse = _host(out), _host(lse)
    errors = _Errors(be.dtype_name, be.compute_name)
    for b in range(len(lens_q)):
        s, e = cu_q[b], cu_q[b + 1]
        errors.add(out[s:e], qh[s:e], kh[cu_k[b]: cu_k[b + 1]], vh[cu_k[b]: cu_k[b + 1]],
                   lse[:, s:e], causal=True)
    return errors.result("paged", f"page_block_size {P}, permuted pages, key lengths {lens_k}")


def _case_kvcache(rng, be: Backend) -> CheckResult:
    """Contiguous cache: append 2 new tokens at cache_seqlens, then attend (causal)."""
    import cupy_flashattn as fa

    B, S_cache, S_new, H, Hk, D = 3, 96, 2, 8, 2, 64
    kc_h, k_cache = _rand(rng, (B, S_cache, Hk, D), be)
    vc_h, v_cache = _rand(rng, (B, S_cache, Hk, D), be)
    (qh, q), (knh, k_new), (vnh, v_new) = (_rand(rng, (B, S_new, h, D), be) for h in (H, Hk, Hk))
    seqlens = np.array([0, 17, 90], np.int32)
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                          cache_seqlens=be.asarray(seqlens), causal=True,
                                          return_softmax_lse=True)
    out, lse = _host(out), _host(lse)
    errors = _Errors(be.dtype_name, be.compute_name)
    for b in range(B):
        n = seqlens[b]
        keys = np.concatenate([kc_h[b, :n], knh[b]])
        values = np.concatenate([vc_h[b, :n], vnh[b]])
        if not np.array_equal(_host(k_cache)[b, : n + S_new], keys):
            errors.problems.append("new keys were not appended at cache_seqlens")
        errors.add(out[b], qh[b], keys, values, lse[b], causal=True)
    return errors.result("kvcache", f"contiguous cache {(B, S_cache, Hk, D)}, "
                                    f"cache_seqlens {seqlens.tolist()} + {S_new} new")


def _case_paged_kvcache(rng, be: Backend) -> CheckResult:
    """PagedKVCache: prefill 3 prompts (varlen), decode 3 steps, free one, reuse its pages."""
    import cupy_flashattn as fa

    H, Hk, D, P = 4, 2, 64, 16
    cache = fa.PagedKVCache(num_blocks=24, page_block_size=P, num_heads_k=Hk, head_dim=D,
                            dtype=be.dtype, xp=be.xp)
    prompts = [37, 5, 70]
    ids = [cache.add_sequence() for _ in prompts]
    cu = np.concatenate([[0], np.cumsum(prompts)]).astype(np.int32)
    kh, k = _rand(rng, (int(cu[-1]), Hk, D), be)
    vh, v = _rand(rng, (int(cu[-1]), Hk, D), be)
    qh, q = _rand(rng, (int(cu[-1]), H, D), be)
    cache.append(ids, k, v, cu_seqlens=cu)
    hist_k = {i: kh[cu[j]: cu[j + 1]] for j, i in enumerate(ids)}
    hist_v = {i: vh[cu[j]: cu[j + 1]] for j, i in enumerate(ids)}
    errors = _Errors(be.dtype_name, be.compute_name)
    out, lse = fa.flash_attn_varlen_func(q, cache, None, be.asarray(cu), None, max(prompts), None,
                                         causal=True, return_softmax_lse=True)
    out, lse = _host(out), _host(lse)
    for j, i in enumerate(ids):
        s, e = cu[j], cu[j + 1]
        errors.add(out[s:e], qh[s:e], hist_k[i], hist_v[i], lse[:, s:e], causal=True)
    for step in range(3):
        if step == 1:  # the short sequence finishes; a new one takes its pages
            cache.free(ids[1])
            ids = [ids[0], ids[2], cache.add_sequence()]
            hist_k[ids[2]] = np.zeros((0, Hk, D), be.dtype)
            hist_v[ids[2]] = np.zeros((0, Hk, D), be.dtype)
        B = len(ids)
        (q1h, q1), (k1h, k1), (v1h, v1) = (_rand(rng, (B, 1, h, D), be) for h in (H, Hk, Hk))
        out, lse = fa.flash_attn_with_kvcache(q1, cache, None, k1, v1, seq_ids=ids, causal=True,
                                              return_softmax_lse=True)
        out, lse = _host(out), _host(lse)
        for j, i in enumerate(ids):
            hist_k[i] = np.concatenate([hist_k[i], k1h[j]])
            hist_v[i] = np.concatenate([hist_v[i], v1h[j]])
            errors.add(out[j], q1h[j], hist_k[i], hist_v[i], lse[j], causal=True)
    return errors.result("paged-kvcache", f"PagedKVCache P={P}: prefill {prompts}, 3 decode "
                                          "steps, free + page reuse")


def _case_page_size_error(rng, be: Backend) -> CheckResult:
    """The project's seed: a page size that disagrees with the cache is refused before launch."""
    import cupy_flashattn as fa

    k_pages = be.xp.zeros((4, 32, 2, 64), dtype=be.dtype)
    q = be.xp.zeros((1, 1, 4, 64), dtype=be.dtype)
    table = be.asarray(np.zeros((1, 4), np.int32))
    try:
        fa.flash_attn_with_kvcache(q, k_pages, k_pages, cache_seqlens=be.asarray(
            np.array([5], np.int32)), block_table=table, page_block_size=16)
    except fa.PageSizeMismatchError as e:
        ok = "page_block_size 16 does not match k shape" in str(e)
        note = "" if ok else " (unexpected text)"
        return CheckResult("page-size-error", ok, "page_block_size=16 on a cache of 32-row "
                           f"pages raises PageSizeMismatchError{note}")
    return CheckResult("page-size-error", False, "page_block_size=16 on 32-row pages did NOT raise")


CHECKS = {
    "dense": _case_dense,
    "features": _case_features,
    "varlen": _case_varlen,
    "paged": _case_paged,
    "kvcache": _case_kvcache,
    "paged-kvcache": _case_paged_kvcache,
    "page-size-error": _case_page_size_error,
}


def run_checks(be: Backend, names=None, seed: int = 0) -> list[CheckResult]:
    """Run the named self-test cases (all by default); exceptions count as failures."""
    results = []
    for name in names or list(CHECKS):
        rng = np.random.default_rng([seed, list(CHECKS).index(name)])
        t0 = time.perf_counter()
        try:
            res = CHECKS[name](rng, be)
        except Exception as e:
            res = CheckResult(name, False, f"raised {_short(e)}")
        res.seconds = time.perf_counter() - t0
        results.append(res)
    return results


def cmd_check(args) -> int:
    be = pick_backend(args.cpu, args.dtype)
    _out(f"check: backend {be.label}, dtype {be.dtype_name}; reference: NumPy float64; "
         "bound: 2 x (naive same-precision error) + eps (flash-attn's criterion)")
    width = max(len(n) for n in CHECKS)
    results = []
    for name in args.cases or list(CHECKS):
        (res,) = run_checks(be, [name], args.seed)
        results.append(res)
        _out(f"{'PASS' if res.passed else 'FAIL'}  {res.name:<{width}}  {res.detail}  "
             f"({_ms(res.seconds)})")
    failed = [r.name for r in results if not r.passed]
    if failed:
        _out(f"check: FAILED {len(failed)} of {len(results)} ({', '.join(failed)})")
        return 1
    _out(f"check: all {len(results)} passed")
    return 0
