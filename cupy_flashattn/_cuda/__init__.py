"""CUDA backend: NVRTC-compiled FlashAttention-2 forward kernels from ``cuda_src/``.

``run_attention(problem)`` fills ``problem.out`` / ``problem.softmax_lse``; ``is_available()``
says whether a usable (sm_80+) GPU is present; ``precompile(...)`` compiles kernels ahead of
time.  Compiled kernels are cached on disk by CuPy in ``$CUPY_CACHE_DIR``
(default ``~/.cupy/kernel_cache``).
"""

from .compile import (  # noqa: F401
    HEAD_DIM_BUCKETS,
    KernelKey,
    bucket_for,
    compile_for_arch,
    get_kernel,
    parse_ptxas_log,
    precompile,
    shipped_keys,
    traits,
)
from .launch import is_available, run_attention, select_kernel  # noqa: F401
from .source import build_source, cuda_source_dir, source_hash  # noqa: F401

__all__ = [
    "run_attention",
    "is_available",
    "precompile",
    "select_kernel",
    "KernelKey",
    "shipped_keys",
    "compile_for_arch",
    "parse_ptxas_log",
    "cuda_source_dir",
    "build_source",
    "source_hash",
]
