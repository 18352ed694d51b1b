"""``python -m cupy_flashattn info``: versions, the GPU, the kernel cache and our kernels in it.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np

from ._common import (
    _cuda_version,
    _human_bytes,
    _out,
    _short,
    _show_names,
    compiled_this_process,
    kernel_cache_dir,
    probe_gpu,
    scan_kernel_cache,
)

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
    if probe.usable:
        add(("Prefill path", _try(_prefill_path)))

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


def _prefill_path() -> str:
    from cupy_flashattn._cuda.launch import describe_prefill_path

    return describe_prefill_path()


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
        from .. import _cuda
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
    from .._cuda.source import cuda_source_dir, source_hash

    return f"{cuda_source_dir()} (hash {source_hash()})"
