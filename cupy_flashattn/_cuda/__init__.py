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
from .launch import PrefillPlan, is_available, needs_temporaries, select_kernel  # noqa: F401
from .launch import run_attention as run_prefill  # noqa: F401
from .decode import (  # noqa: F401
    DecodePlan,
    decode_applies,
    decode_len_q_limit,
    merge_states,
    precompile_decode,
    rope_append,
    run_decode,
)
from .source import build_source, cuda_source_dir, source_hash  # noqa: F401


def mixed_split(problem):
    """For a varlen batch too long for decode as a whole: the query length up to which its
    sequences go to the decode kernel (the rest to prefill), or None to run prefill alone.
    The per-sequence choice is made on the device (each kernel skips the other's sequences),
    so no host sync reads cu_seqlens_q."""
    p = problem
    if p.cu_seqlens_q is None or p.batch_size < 2 or p.head_dim > 256:
        return None
    if p.num_heads % p.num_heads_k or needs_temporaries(p):
        return None
    return decode_len_q_limit(p.num_heads, p.num_heads_k)


def plan_attention(problem):
    """The launch plan that serves ``problem`` (host-only decisions, no launch): the decode
    kernel when :func:`decode_applies`; for a mixed varlen batch (chunked prefill next to
    decode steps) both kernels, each serving its own sequences (:func:`mixed_split`); else the
    prefill kernel.  A plan depends only on the problem's shapes, strides, dtypes, alignment and
    scalars, so it can be replayed on other arrays of the same signature (api.py caches it)."""
    if decode_applies(problem):
        return (DecodePlan(problem),)
    limit = mixed_split(problem)
    if limit is None:
        return (PrefillPlan(problem),)
    return (DecodePlan(problem, len_q_max=limit), PrefillPlan(problem, len_q_min=limit + 1))


def run_attention(problem, plan=None):
    """Fill ``problem.out`` / ``problem.softmax_lse`` on the current CuPy stream (no host sync),
    with ``plan`` (from :func:`plan_attention` for a problem of the same signature) or a new
    one; returns the plan used."""
    if plan is None:
        plan = plan_attention(problem)
    for launch in plan:
        launch.run(problem)
    return plan


__all__ = [
    "run_attention",
    "plan_attention",
    "run_prefill",
    "run_decode",
    "decode_applies",
    "mixed_split",
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
