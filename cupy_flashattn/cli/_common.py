"""Helpers shared by the commands: output, dtype names, formatting, the GPU probe and backend
choice, and the kernel-cache scan.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
        from .._arrays import BFLOAT16

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
    from .._cuda.source import kernel_cache_root

    return kernel_cache_root(), bool(os.environ.get("CUPY_CACHE_DIR"))


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
