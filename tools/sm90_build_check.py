"""A smoke check of one sm90 build (CUPY_FLASHATTN_SM90_DEFINES) before an A/B times it: a few
bf16 calls at awkward sizes -- dense, varlen (lengths 1 / 97 / 300 / 1025: the dynamic
schedule), paged 16 with scattered pages, causal and not, D = 64 / 128, GQA 4/2 -- against the
float64 NumPy reference (cupy_flashattn.reference), with every output element checked finite.
A development tool for device runs; the GPU test suite is the real check.

    PYTHONPATH=. python3 tools/sm90_build_check.py      # prints one line per case, exit 1 on BAD
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

TOL = 5e-2  # bf16 outputs of unit-scale inputs: ~1e-2 of rounding at worst; a broken build O(1)


def main() -> int:
    import cupy
    import ml_dtypes

    import cupy_flashattn as fa
    from cupy_flashattn.reference import attention_ref

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(49)
    bad = 0

    def rand(*shape):
        return rng.standard_normal(shape).astype(bf16)

    def report(name, got, want):
        nonlocal bad
        got = np.asarray(got, np.float64)
        err = float(np.abs(got - want).max())
        ok = np.isfinite(got).all() and err <= TOL
        bad += not ok
        print(f"{name:48s} max err {err:.3g} {'ok' if ok else 'BAD'}", flush=True)

    def cases(d, causal):
        # dense, GQA 4 / 2, 333 rows (a partial last tile of 128)
        q, k, v = rand(2, 333, 4, d), rand(2, 333, 2, d), rand(2, 333, 2, d)
        out = fa.flash_attn_func(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), causal=causal)
        want = attention_ref(q, k, v, causal=causal)
        report(f"dense D{d} causal={int(causal)}", cupy.asnumpy(out).astype(np.float64), want)
        # varlen: lengths on the device
        lens = [1, 97, 300, 1025]
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        qv, kv, vv = rand(cu[-1], 4, d), rand(cu[-1], 2, d), rand(cu[-1], 2, d)
        out = cupy.asnumpy(fa.flash_attn_varlen_func(
            cupy.asarray(qv), cupy.asarray(kv), cupy.asarray(vv), cupy.asarray(cu), cupy.asarray(cu),
            max(lens), max(lens), causal=causal)).astype(np.float64)
        want = np.concatenate([attention_ref(qv[a:b], kv[a:b], vv[a:b], causal=causal)
                               for a, b in itertools.pairwise(cu)])
        report(f"varlen {lens} D{d} causal={int(causal)}", out, want)
        # paged 16: the same keys in scattered pages, a partial last page per sequence
        page, seq_k = 16, [300, 1025]
        npages = [-(-s // page) for s in seq_k]
        ids = rng.permutation(sum(npages) + 5).astype(np.int32)
        pool_k, pool_v = rand(len(ids), page, 2, d), rand(len(ids), page, 2, d)
        table = np.zeros((2, max(npages)), np.int32)
        keys, vals, start = [], [], 0
        for b, (s, n) in enumerate(zip(seq_k, npages)):
            table[b, :n] = ids[start:start + n]
            start += n
            keys.append(pool_k[table[b, :n]].reshape(-1, 2, d)[:s])
            vals.append(pool_v[table[b, :n]].reshape(-1, 2, d)[:s])
        sq = [97, 1025]
        cuq = np.concatenate([[0], np.cumsum(sq)]).astype(np.int32)
        cuk = np.concatenate([[0], np.cumsum(seq_k)]).astype(np.int32)
        qp = rand(cuq[-1], 4, d)
        out = cupy.asnumpy(fa.flash_attn_varlen_func(
            cupy.asarray(qp), cupy.asarray(pool_k), cupy.asarray(pool_v), cupy.asarray(cuq),
            cupy.asarray(cuk), max(sq), max(seq_k), causal=causal,
            block_table=cupy.asarray(table))).astype(np.float64)
        want = np.concatenate([attention_ref(qp[cuq[b]:cuq[b + 1]], keys[b], vals[b], causal=causal)
                               for b in range(2)])
        report(f"paged16 Sq {sq} Sk {seq_k} D{d} causal={int(causal)}", out, want)


    for d in (64, 128):
        for causal in (False, True):
            try:
                cases(d, causal)
            except Exception as e:  # noqa: BLE001 -- a broken build: say so, go on to the next case
                bad += 1
                print(f"D{d} causal={int(causal)}: {type(e).__name__}: {e}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
