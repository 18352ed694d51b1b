"""The command line: ``python -m cupy_flashattn <command>``.

Commands::

    info        versions (CuPy, CUDA runtime, driver, NVRTC), the GPU, the kernel cache directory
                (CUPY_CACHE_DIR or ~/.cupy/kernel_cache) and which of our kernels it holds; without
                a GPU it says so and that NumPy arrays run on the CPU backend (Numba)
    precompile  compile chosen CUDA kernels ahead of first use (needs a GPU), with a progress bar
    bench       a quick side-by-side timing: ours vs the NumPy reference (CPU) or torch SDPA (GPU)
    check       a short self-test against the float64 reference on the backend present:
                dense, varlen, paged, kvcache...; prints PASS/FAIL per case

Exit status: 0 success, 1 failure (a check failed, a kernel did not compile, no GPU for
``precompile``), 2 usage error.

The same functions are callable from Python, e.g. in a notebook after some attention calls
``cupy_flashattn.cli.main(["info"])`` also lists the kernels compiled in *that* process.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .accuracy import eps_for

__all__ = ["CheckResult", "build_parser", "kernel_cache_dir", "main", "run_checks"]

DTYPE_CHOICES = ("float16", "bfloat16", "float32", "float64")
# Used when cupy_flashattn._cuda.compile cannot be imported (only for argument choices/help).
_FALLBACK_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)
_FALLBACK_KERNEL_DTYPES = ("f16", "bf16")
_FALLBACK_FEATURES = ("transform", "paged")
# Names of our extern "C" entry points inside a cubin's string table (fa_fwd_bf16_d128_paged).
_KERNEL_NAME_RE = re.compile(rb"\x00(fa_[A-Za-z0-9_]+)\x00")
_MAX_CACHE_FILE_SCAN = 256 * 1024 * 1024


# -- small helpers ----------------------------------------------------------------------------


def _out(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        from ._arrays import BFLOAT16

        return BFLOAT16
    return np.dtype(name)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _cuda_version(v: int) -> str:
    """12090 -> '12.9'."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _flops(rate: float) -> str:
    return f"{rate / 1e12:.1f} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.2f} GFLOP/s"


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


@dataclass
class GpuProbe:
    """Whether a CUDA GPU is usable, and why not."""

    usable: bool
    reason: str
    cupy: object = None  # the module when importable


def probe_gpu() -> GpuProbe:
    try:
        import cupy
    except Exception as e:  # not installed, or a broken CUDA install
        return GpuProbe(False, f"CuPy is not importable ({type(e).__name__}: {e})")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return GpuProbe(False, f"no CUDA device ({_short(e)})", cupy)
    if n < 1:
        return GpuProbe(False, "CUDA reports 0 devices", cupy)
    return GpuProbe(True, f"{n} CUDA device(s)", cupy)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


@dataclass
class Backend:
    """Where ``check``/``bench`` run: the array module, dtype and a device synchronize."""

    xp: object
    dtype: np.dtype
    dtype_name: str
    sync: Callable[[], None]
    label: str
    # The precision the kernels compute in: the CUDA backend runs float32 inputs as bfloat16.
    compute_name: str = ""

    def __post_init__(self):
        self.compute_name = self.compute_name or self.dtype_name

    @property
    def on_gpu(self) -> bool:
        return self.xp is not np

    def asarray(self, a):
        return self.xp.asarray(a)


def pick_backend(force_cpu: bool, dtype_name: str | None) -> Backend:
    probe = GpuProbe(False, "--cpu given") if force_cpu else probe_gpu()
    if probe.usable:
        cp = probe.cupy
        name = dtype_name or "bfloat16"
        if name == "float64":
            raise SystemExit(_usage_error("--dtype float64 runs only on the CPU backend; "
                                          "add --cpu"))
        dev = cp.cuda.Device()
        label = f"CUDA (CuPy) on GPU {dev.id}: {_gpu_name(cp, dev.id)}"
        compute = "bfloat16" if name == "float32" else name
        if compute != name:
            label += " (float32 inputs are computed as bfloat16 there)"
        return Backend(cp, _np_dtype(name), name, dev.synchronize, label, compute)
    name = dtype_name or "float32"
    why = "" if force_cpu else f"; no usable GPU: {probe.reason}"
    return Backend(np, _np_dtype(name), name, lambda: None, f"CPU (NumPy arrays, Numba){why}")


def _usage_error(msg: str) -> str:
    _err(f"python -m cupy_flashattn: error: {msg}")
    return 2  # SystemExit(2)


def _gpu_name(cp, device_id: int) -> str:
    try:
        name = cp.cuda.runtime.getDeviceProperties(device_id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:
        return f"(name unavailable: {_short(e)})"


# -- kernel cache -----------------------------------------------------------------------------


def kernel_cache_dir() -> tuple[Path, bool]:
    """CuPy's on-disk kernel cache (same rule as CuPy) and whether CUPY_CACHE_DIR set it."""
    env = os.environ.get("CUPY_CACHE_DIR")
    if env:
        return Path(env), True
    return Path.home() / ".cupy" / "kernel_cache", False


def scan_kernel_cache(cache: Path):
    """``(number of files, total bytes, sorted names of our kernels found in them)``."""
    if not cache.is_dir():
        return 0, 0, []
    files = total = 0
    names = set()
    for path in cache.iterdir():
        try:
            if not path.is_file():
                continue
            size = path.stat().st_size
        except OSError:
            continue
        files += 1
        total += size
        if path.suffix == ".cu" or size > _MAX_CACHE_FILE_SCAN:
            continue  # saved sources (CUPY_CACHE_SAVE_CUDA_SOURCE) are not compiled kernels
        try:
            data = path.read_bytes()
        except OSError:
            continue
        names.update(m.decode() for m in _KERNEL_NAME_RE.findall(data))
    return files, total, sorted(names)


def compiled_this_process() -> tuple[list[str] | None, str]:
    """Kernels compiled (or loaded) by this process: ``(names or None, note)``.

    Reads the CUDA backend's bookkeeping without importing it (importing it would not compile
    anything, so a module that is not loaded means nothing was compiled)."""
    mod = sys.modules.get("cupy_flashattn._cuda.compile")
    if mod is None:
        return [], "the CUDA backend was not used in this process"
    for attr in ("compiled_kernels", "compiled_names", "compiled"):
        value = getattr(mod, attr, None)
        if value is None:
            continue
        try:
            value = value() if callable(value) else value
            return sorted(str(getattr(k, "name", k)) for k in value), ""
        except Exception:
            continue
    get_kernel = getattr(mod, "get_kernel", None)
    info = getattr(get_kernel, "cache_info", None)
    if info is not None:
        n = info().currsize
        if n == 0:
            return [], ""
        return None, f"{n} kernel(s) (names not exposed by cupy_flashattn._cuda.compile)"
    return None, "unknown (cupy_flashattn._cuda.compile keeps no list of compiled kernels)"


def _show_names(names: list[str], verbose: bool, limit: int = 12) -> str:
    if not names:
        return "none"
    shown = names if verbose or len(names) <= limit else names[:limit]
    text = ", ".join(shown)
    if len(shown) < len(names):
        text += f", ... ({len(names) - len(shown)} more; --verbose lists all)"
    return text


# -- info -------------------------------------------------------------------------------------


def cmd_info(args) -> int:
    import cupy_flashattn

    # Scan the cache before importing CuPy: importing it creates the directory.
    cache, from_env = kernel_cache_dir()
    cache_existed = cache.is_dir()
    files, size, ours = scan_kernel_cache(cache)

    rows: list[tuple[str, str]] = []
    add = rows.append
    here = Path(cupy_flashattn.__file__).parent
    add(("cupy_flashattn", f"{cupy_flashattn.__version__}  ({here})"))
    add(("Python", f"{platform.python_version()} ({sys.executable})"))
    add(("NumPy / Numba", (f"{np.__version__} / {_version_of('numba')}"
                           f" ({_numba_threads()} threads), ml_dtypes {_version_of('ml_dtypes')}")))

    probe = probe_gpu()
    cp = probe.cupy
    add(("CuPy", cp.__version__ if cp is not None else f"not available: {probe.reason}"))
    if cp is not None:
        add(("CUDA runtime", _try(lambda: _cuda_version(cp.cuda.runtime.runtimeGetVersion()))))
        add(("CUDA driver", _try(_driver_version(cp))))
        add(("NVRTC", _try(_nvrtc_version)))
    if probe.usable:
        for i in range(cp.cuda.runtime.getDeviceCount()):
            add((f"GPU {i}", _try(lambda i=i: _describe_gpu(cp, i))))
        add(("Backend", ("CUDA kernels for CuPy arrays (and torch/JAX GPU arrays via DLPack); "
                         "NumPy arrays run on the CPU backend (Numba)")))
    else:
        add(("GPU", f"none usable ({probe.reason})"))
        add(("Backend", "CPU backend (Numba) for NumPy arrays; CuPy arrays need a CUDA GPU"))
    add(("CUDA backend", _cuda_backend_status()))

    add(("Kernel sources", _try(_source_info)))
    where = "CUPY_CACHE_DIR" if from_env else "default; set CUPY_CACHE_DIR to move it"
    if cache_existed:
        add(("Kernel cache", f"{cache} ({where}): {files} file(s), {_human_bytes(size)}"))
    else:
        add(("Kernel cache", f"{cache} ({where}): does not exist yet"))
    add(("  ours in cache", f"{len(ours)}: {_show_names(ours, args.verbose)}" if ours else "none"))
    names, note = compiled_this_process()
    if names is None:
        add(("  this process", note))
    else:
        add(("  this process", f"{len(names)}: {_show_names(names, args.verbose)}" if names
             else f"none ({note})" if note else "none"))

    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        _out(f"{key:<{width}}  {value}")
    return 0


def _version_of(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        mod = sys.modules.get(module)
        return getattr(mod, "__version__", "not installed")


def _numba_threads() -> str:
    try:
        import numba

        return str(numba.config.NUMBA_NUM_THREADS)
    except Exception:
        return "?"


def _try(fn) -> str:
    try:
        return str(fn())
    except Exception as e:
        return f"unavailable ({_short(e)})"


def _driver_version(cp):
    def get():
        v = cp.cuda.runtime.driverGetVersion()
        return "none installed" if v == 0 else _cuda_version(v)

    return get


def _nvrtc_version() -> str:
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return f"{major}.{minor}"


def _describe_gpu(cp, i: int) -> str:
    props = cp.cuda.runtime.getDeviceProperties(i)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    major, minor = props["major"], props["minor"]
    mem = props.get("totalGlobalMem", 0)
    sms = props.get("multiProcessorCount", "?")
    return (f"{name}, compute capability {major}.{minor} (sm_{major}{minor}), {sms} SMs, "
            f"{_human_bytes(int(mem))}")


def _cuda_backend_status() -> str:
    try:
        from . import _cuda
    except Exception as e:
        return f"NOT importable ({_short(e)})"
    missing = [n for n in ("run_attention", "precompile") if not hasattr(_cuda, n)]
    avail = getattr(_cuda, "is_available", None)
    if avail is not None:
        try:
            if not avail():
                return "importable; is_available() is False (needs a usable sm_80+ GPU)"
        except Exception as e:
            return f"is_available() raised {_short(e)}"
    return "ready" if not missing else f"incomplete (missing {', '.join(missing)})"


def _source_info() -> str:
    from ._cuda.source import cuda_source_dir, source_hash

    return f"{cuda_source_dir()} (hash {source_hash()})"


# -- precompile -------------------------------------------------------------------------------


def _kernel_vocabulary():
    """(dtype tags, head-dim buckets, feature flags) of the CUDA backend, with fallbacks."""
    try:
        from ._cuda import compile as cc

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
        from . import _cuda
        from ._cuda import compile as cc
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
        from .reference import attention_ref

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

    from .reference import attention_ref

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


# -- argument parsing -------------------------------------------------------------------------


_DTYPE_HELP = "default: bfloat16 on GPU, float32 on CPU"


def _int_in(low: int, high: int | None, what: str):
    """An argparse ``type=`` for an int in [low, high] (high None: no upper bound), so that a
    bad value is a usage error (exit 2, the valid range in the message), never a traceback or a
    silently substituted default."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int ({what})") from None
        if value < low or (high is not None and value > high):
            allowed = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: {what} must be {allowed}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cupy_flashattn",
        description="cupy_flashattn: environment info, kernel precompilation, a quick "
                    "benchmark and a self-test.",
        epilog="Exit status: 0 success, 1 failure, 2 usage error.",
    )
    sub = p.add_subparsers(dest="command", metavar="command")

    s = sub.add_parser("info", help="versions, GPU, kernel cache and compiled kernels")
    s.add_argument("-v", "--verbose", action="store_true", help="list every kernel name")
    s.set_defaults(func=cmd_info)

    # The kernel vocabulary is not imported here (that would load the CUDA backend for every
    # command); cmd_precompile checks the values.
    s = sub.add_parser(
        "precompile", help="compile CUDA kernels ahead of first use (needs a GPU)",
        description="Compile kernels for the current GPU into CuPy's cache (CUPY_CACHE_DIR). "
                    "Feature flags are the boolean fields of cupy_flashattn._cuda.KernelKey "
                    f"(currently {', '.join(_FALLBACK_FEATURES)}: 'transform' serves softcap "
                    "and ALiBi, 'paged' a block table; causal and sliding windows are run-time "
                    "arguments of every kernel).",
    )
    s.add_argument("--dtype", nargs="+", metavar="DTYPE",
                   help=f"kernel dtypes (default: all: {' '.join(_FALLBACK_KERNEL_DTYPES)}; "
                        "float16/bfloat16 are accepted too)")
    s.add_argument("--head-dim", nargs="+", type=int, metavar="D",
                   help=f"head dims, mapped to their bucket (default: all buckets "
                        f"{' '.join(map(str, _FALLBACK_HEAD_DIMS))})")
    s.add_argument("--features", nargs="+", metavar="SET",
                   help="feature sets, each 'none' or flags joined by '+', e.g. "
                        "none paged transform+paged (default: none paged)")
    s.add_argument("--all", action="store_true", help="every shipped instantiation")
    s.set_defaults(func=cmd_precompile)

    s = sub.add_parser("bench",
                       help="quick timing: ours vs the reference (CPU) or torch SDPA (GPU)")
    s.add_argument("--cpu", action="store_true", help="use the CPU backend even with a GPU")
    s.add_argument("--dtype", choices=DTYPE_CHOICES, help=_DTYPE_HELP)
    s.add_argument("--seqlen", type=_int_in(1, 1 << 20, "the sequence length"), metavar="S",
                   help="prefill sequence length, >= 1 (default: 2048 on GPU, 512 on CPU)")
    s.add_argument("--head-dim", type=_int_in(1, 256, "the head dim"), metavar="D",
                   help="head dim, 1..256 (default: 128 on GPU, 64 on CPU)")
    s.add_argument("--repeats", type=_int_in(1, None, "the number of timed runs"), default=5,
                   metavar="N", help="timed runs per provider, >= 1 (default 5)")
    s.add_argument("--pool-pages", type=_int_in(1, 1 << 24, "a pool size in pages"), nargs="+",
                   default=list(POOL_PAGES), metavar="N",
                   help="CPU only: pool sizes of the PagedKVCache decode rows, whose time must "
                        "not depend on the pool (default: 64 1024 16384)")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("check", help="self-test against the float64 reference; PASS/FAIL per case")
    s.add_argument("--cpu", action="store_true", help="use the CPU backend even with a GPU")
    s.add_argument("--dtype", choices=DTYPE_CHOICES, help=_DTYPE_HELP)
    s.add_argument("--cases", nargs="+", choices=list(CHECKS), metavar="CASE",
                   help=f"cases to run (default: all: {' '.join(CHECKS)})")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_check)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (argparse printed it) or --help
        return int(e.code) if isinstance(e.code, int) else 2
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except SystemExit as e:  # usage errors raised inside a command
        return int(e.code) if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
