"""``python -m cupy_flashattn precompile``: compile chosen CUDA kernels ahead of first use.
"""

from __future__ import annotations

import sys
import time

from ._common import (
    _FALLBACK_FEATURES,
    _FALLBACK_HEAD_DIMS,
    _FALLBACK_KERNEL_DTYPES,
    _err,
    _gpu_name,
    _out,
    _short,
    _usage_error,
    kernel_cache_dir,
    probe_gpu,
)

# -- precompile -------------------------------------------------------------------------------


def _kernel_vocabulary():
    """(dtype tags, head-dim buckets, feature flags) of the CUDA backend, with fallbacks."""
    try:
        from .._cuda import compile as cc

        dtypes = tuple(getattr(cc, "DTYPES", _FALLBACK_KERNEL_DTYPES))
        dims = tuple(getattr(cc, "HEAD_DIM_BUCKETS", _FALLBACK_HEAD_DIMS))
        key = getattr(cc, "KernelKey", None)
        fields = getattr(key, "__dataclass_fields__", None)
        feats = tuple(f for f in fields if f not in ("dtype", "head_dim")) if fields else None
        return dtypes, dims, feats or _FALLBACK_FEATURES
    except Exception:
        return _FALLBACK_KERNEL_DTYPES, _FALLBACK_HEAD_DIMS, _FALLBACK_FEATURES


def _parse_feature_sets(specs: list[str], known) -> list[dict]:
    """'none' -> {}, 'local+paged' -> {'local': True, 'paged': True}."""
    sets = []
    for spec in specs:
        flags = {} if spec in ("none", "") else {f: True for f in spec.split("+")}
        unknown = [f for f in flags if f not in known]
        if unknown:
            raise ValueError(
                f"unknown feature {', '.join(unknown)} in {spec!r}; features are "
                f"{', '.join(known)} joined with '+', or 'none'"
            )
        if flags not in sets:
            sets.append(flags)
    return sets


class ProgressBar:
    """``[#######-------]  7/14  fa_fwd_bf16_d128 (1.9 s)``: redrawn in place on a terminal,
    one line per step otherwise (logs, CI)."""

    def __init__(self, total: int, stream=None, width: int = 28):
        self.total, self.width = max(total, 1), width
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0

    def update(self, done: int, label: str) -> None:
        filled = int(self.width * done / self.total)
        count = f"{done:>{len(str(self.total))}}/{self.total}"
        text = f"[{'#' * filled}{'-' * (self.width - filled)}] {count}  {label}"
        if self.tty:
            self.stream.write("\r" + text.ljust(self._last))
            self._last = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def cmd_precompile(args) -> int:
    probe = probe_gpu()
    if not probe.usable:
        _err(
            f"precompile: no usable CUDA GPU ({probe.reason}).\n"
            "CUDA kernels are compiled for the GPU that runs them (CuPy keys its cache by the "
            "device's architecture), so precompile needs one; run it on the GPU machine, with "
            "CUPY_CACHE_DIR pointing at a persistent directory.\n"
            "The CPU backend needs no precompiling: Numba compiles on first use and caches on disk."
        )
        return 1
    try:
        from .. import _cuda
        from .._cuda import compile as cc
    except Exception as e:
        _err(f"precompile: the CUDA backend cannot be imported ({_short(e)})")
        return 1
    fn = getattr(_cuda, "precompile", None) or getattr(cc, "precompile", None)
    if fn is None:
        _err("precompile: cupy_flashattn._cuda has no precompile() in this version")
        return 1
    dtypes_all, dims_all, feats_all = _kernel_vocabulary()
    if args.all and hasattr(cc, "shipped_keys"):
        plan = [(k.dtype, k.head_dim, {f: True for f in feats_all if getattr(k, f, False)})
                for k in cc.shipped_keys()]
    else:
        # default: plain and paged kernels (causal and windows are run-time arguments of every
        # kernel; softcap/ALiBi need the "transform" variant)
        specs = args.features or [f for f in ("none", "paged") if f == "none" or f in feats_all]
        try:
            feature_sets = _parse_feature_sets(specs, feats_all)
        except ValueError as e:
            _usage_error(f"--features: {e}")
            return 2
        aliases = {"float16": "f16", "fp16": "f16", "half": "f16", "bfloat16": "bf16"}
        dtypes = [aliases.get(d, d) for d in args.dtype] if args.dtype else list(dtypes_all)
        bad = [d for d in dtypes if d not in dtypes_all]
        if bad:
            _usage_error(f"--dtype: unknown {', '.join(bad)} (choose from "
                         f"{', '.join(dtypes_all)})")
            return 2
        dims = args.head_dim or list(dims_all)
        bad = [d for d in dims if not 1 <= d <= max(dims_all)]
        if bad:
            _usage_error(f"--head-dim: {', '.join(map(str, bad))} outside 1..{max(dims_all)}")
            return 2
        plan = [(dt, d, f) for dt in dtypes for d in dims for f in feature_sets]
    cache, _ = kernel_cache_dir()
    gpu = _gpu_name(probe.cupy, probe.cupy.cuda.Device().id)
    _out(f"precompile: {len(plan)} kernel(s) for {gpu}; cache {cache}")
    bar = ProgressBar(len(plan))
    failures, names = [], []
    t_start = time.perf_counter()
    for i, (dt, d, flags) in enumerate(plan):
        label = f"{dt} d{d} {'+'.join(flags) or 'none'}"
        bar.update(i, f"compiling {label} ...")
        t0 = time.perf_counter()
        try:
            got = fn(dtypes=[dt], head_dims=[d], features=[flags])
            names.extend(str(n) for n in (got or []))
            label = ", ".join(str(n) for n in got) if got else label
        except Exception as e:
            failures.append((label, e))
            label = f"FAILED {label}: {_short(e)}"
        bar.update(i + 1, f"{label} ({time.perf_counter() - t0:.1f} s)")
    bar.close()
    total = time.perf_counter() - t_start
    if failures:
        _err(f"precompile: {len(failures)} of {len(plan)} failed:")
        for label, e in failures:
            _err(f"  {label}: {e}")
        return 1
    _out(f"precompile: {len(set(names)) or len(plan)} kernel(s) ready in {total:.1f} s")
    return 0
