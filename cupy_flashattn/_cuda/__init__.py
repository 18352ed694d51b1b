"""CUDA backend: NVRTC-compiled FlashAttention-2 forward kernels from ``cuda_src/``.

``run_attention(problem)`` fills ``problem.out`` / ``problem.softmax_lse``: through the split-KV
decode kernel (``decode.py``, ``flash_decode.cu``) when the packed query rows of one kv head are
few (``decode.decode_applies``: ``max_seqlen_q * H / Hk <= 16``, or at most min(4, H / Hk)
16-row tiles) -- flash_attn_with_kvcache decode steps and varlen/paged batches whose longest
query is short -- and through the prefill kernel (``launch.py``) otherwise.  ``is_available()``
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
from .launch import is_available, select_kernel  # noqa: F401
from .launch import run_attention as run_prefill  # noqa: F401
from .decode import decode_applies, merge_states, precompile_decode, rope_append, run_decode  # noqa: F401
from .source import build_source, cuda_source_dir, source_hash  # noqa: F401



def run_attention(problem) -> None:
    """Fill ``problem.out`` / ``problem.softmax_lse`` on the current CuPy stream (no host sync):
    decode kernel when :func:`decode_applies`, else the prefill kernel."""
    if decode_applies(problem):
        run_decode(problem)
    else:
        run_prefill(problem)


__all__ = [
    "run_attention",
    "run_prefill",
    "run_decode",
    "decode_applies",
    "precompile_decode",
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
