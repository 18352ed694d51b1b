"""Diagnostic (issue 14): where the Hopper float32 kernel's error comes from.

A NumPy emulation of the float16-plane algorithm (cuda_src/f32_split.cu + sm90/flash_fwd.cu) with
exact products -- no tensor-core accumulation, exact exp -- beside the GPU result, the sm80 3xTF32
kernel and the float32 naive error, on tests/gpu/test_gpu_f32_planes.py's magnitude cases.
Ratios are max error / the naive float32 implementation's max error (the flash-attn bound is 2).

    PYTHONPATH=. python3 tools/f32_error_probe.py [--gpu]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers import ref_and_naive, scaled_float32_case  # noqa: E402

F32 = np.float32
CASES = ((1e-12, 1e12, 1e-30), (1e15, 1e-15, 1e25), (1.0, 1.0, 1.0))


def split(x, axes):
    """hi, lo (float64 values of the float16 planes) and 1 / scale, the scale per `axes` max."""
    amax = np.abs(x).max(axis=axes, keepdims=True)
    shift = np.clip(14 - np.frexp(amax)[1], -126, 126)
    xs = (x.astype(np.float64) * np.ldexp(1.0, shift)).astype(F32)
    hi = xs.astype(np.float16).astype(np.float64)
    lo = (xs - hi).astype(np.float16).astype(np.float64)
    return hi, lo, np.ldexp(1.0, -shift)


def emulate(q, k, v, scale):
    """Non-causal attention through the planes: S = ql kh + qh kl + qh kh, P x 2^12 split."""
    _, _, H, _ = q.shape
    g = H // k.shape[2]
    out = np.zeros(q.shape)
    qh, ql, rq = split(q, 3)  # per row
    kh, kl, rk = split(k, (0, 1, 3))  # per kv head
    vh, vl, rv = split(v, (0, 1, 3))
    for b in range(q.shape[0]):
        for h in range(H):
            hk = h // g
            s = ql[b, :, h] @ kh[b, :, hk].T + qh[b, :, h] @ kl[b, :, hk].T + qh[b, :, h] @ kh[b, :, hk].T
            s = s.astype(F32).astype(np.float64) * rq[b, :, h] * rk[0, 0, hk, 0] * scale
            p = np.exp(s - s.max(1, keepdims=True)).astype(F32).astype(np.float64)
            ps = p * 4096
            ph = ps.astype(np.float16).astype(np.float64)
            pl = (ps - ph).astype(np.float16).astype(np.float64)
            o = ph @ vh[b, :, hk] + pl @ vh[b, :, hk] + ph @ vl[b, :, hk]
            out[b, :, h] = o * rv[0, 0, hk, 0] / 4096 / p.sum(1, keepdims=True)
    return out


def main():
    gpu = "--gpu" in sys.argv
    for mags in CASES:
        for causal in (False, True):
            q, k, v, scale = scaled_float32_case(*mags, causal)
            ref, _, naive = ref_and_naive(q, k, v, softmax_scale=scale, causal=causal)
            base = np.abs(naive - ref).max()
            line = f"q/k/v {mags} causal={causal}:"
            if not causal:
                line += f" emulated {np.abs(emulate(q, k, v, scale) - ref).max() / base:.2f}"
            if gpu:
                import cupy as cp

                import cupy_flashattn as fa
                from cupy_flashattn._cuda.launch import force_prefill_arch

                errs = {}
                for arch in (None, "sm80"):
                    force_prefill_arch(arch)
                    out = fa.flash_attn_func(cp.asarray(q), cp.asarray(k), cp.asarray(v),
                                             softmax_scale=scale, causal=causal).get()
                    errs[arch or "sm90"] = np.abs(out - ref).max() / base
                force_prefill_arch(None)
                line += f" gpu {errs['sm90']:.2f} sm80-3xTF32 {errs['sm80']:.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
