"""CUDA backend: NVRTC-compiled FlashAttention-2 forward kernels from ``cuda_src/``.

``run_attention(problem)`` fills ``problem.out`` / ``problem.softmax_lse``: through the split-KV
decode kernel (``decode.py``, ``flash_decode.cu``) when the packed query rows of one kv head are
few (``decode.decode_applies``: ``max_seqlen_q * H / Hk <= 16``, or at most min(4, H / Hk)
16-row tiles) -- flash_attn_with_kvcache decode steps and varlen/paged batches whose longest
query is short -- and through the prefill kernel (``launch.py``) otherwise.  On compute
capability 9.0 an MQA decode step (one query token, one kv head, >= 16 heads) runs on the sm90
prefill kernel's split-KV variant with swapped rows instead (``decode_sm90.py``).  float32 (at the
default "highest" precision) and float64 always run the precise prefill kernel
(``sm80/flash_fwd_precise.cu``), whatever the query length.  ``is_available()``
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
    key_traits,
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


def route(problem, device_cc=None):
    """Which kernels serve ``problem``: ``("decode_sm90", None)`` for an MQA decode step that
    the sm90 split-KV kernel serves with swapped rows (``decode_sm90.swapped_decode_applies``;
    ``device_cc``: the compute capability it is judged for, default the current device's);
    ``("decode", None)`` when :func:`decode_applies`;
    ``("mixed", limit)`` for a varlen batch whose sequences of at most ``limit`` queries go to
    the decode kernel and the rest to prefill (:func:`mixed_split`); else ``("prefill", None)``.
    The one place this choice is made (plans and :func:`describe_launches` both ask it)."""
    from .compile import is_precise, kernel_dtype_tag

    if is_precise(kernel_dtype_tag(problem.q.dtype)):
        return "prefill", None  # float32 / float64: one kernel for every query length
    if problem.kv_float8 is not None:
        return "decode", None  # float8 K/V: only the decode kernel reads them (any query length)
    from .decode_sm90 import swapped_decode_applies

    if swapped_decode_applies(problem, device_cc):
        return "decode_sm90", None
    if decode_applies(problem):
        return "decode", None
    limit = mixed_split(problem)
    return ("prefill", None) if limit is None else ("mixed", limit)


def plan_attention(problem):
    """The launch plan that serves ``problem`` (host-only decisions, no launch), per
    :func:`route`.  A plan depends only on the problem's shapes, strides, dtypes, alignment and
    scalars, so it can be replayed on other arrays of the same signature (api.py caches it).
    Raises UnsupportedError when a kernel needs more shared memory than the GPU allows
    (device_limits.py)."""
    from .device_limits import check_fits

    check_fits(problem)  # a typed error, not a CUDA one at the first launch
    kind, limit = route(problem)
    if kind == "decode_sm90":
        from .decode_sm90 import Sm90DecodePlan

        return (Sm90DecodePlan(problem),)
    if kind == "decode":
        return (DecodePlan(problem),)
    if kind == "prefill":
        return (PrefillPlan(problem),)
    return (DecodePlan(problem, len_q_max=limit), PrefillPlan(problem, len_q_min=limit + 1))


def describe_launches(problem, sm_count=None, arch=None, device_cc=None) -> tuple:
    """What :func:`plan_attention` would launch, as plain data and without a GPU (``sm_count``
    given): one dict per kernel with ``kind`` ("decode" / "decode_sm90" / "prefill"; the
    combine launch that follows a decode kernel is not listed), ``kernel`` (entry point),
    ``arch`` (kernel family, compile.ARCHS), ``grid``, ``block``, ``smem`` (bytes) and, for
    decode, ``splits`` and the query-length range it serves.  Plan tests
    (``tests/test_plan.py``), the shared-memory check (``device_limits.py``) and debugging read
    it; the plans compute the same values through the same functions.  ``arch`` /
    ``device_cc``: the prefill family, or the compute capability it is chosen for (default: the
    current device; 80 without a GPU).  The sm90 grid is persistent (at most one CTA per SM:
    ``sm_count``, default the current device's, or 132 when ``device_cc`` describes a device
    that is not there)."""
    from .decode import DECODE_THREADS, decode_grid, plan as decode_plan
    from .schedule import launch_grid

    kind, limit = route(problem, device_cc)
    out = []
    if kind == "decode_sm90":
        from .decode_sm90 import swapped_decode_plan

        return (swapped_decode_plan(problem, sm_count if sm_count is not None else 132),)
    if kind in ("decode", "mixed"):
        key, m_blocks, splits = decode_plan(problem, len_q_max=limit, sm_count=sm_count)
        grid = decode_grid(problem, m_blocks, splits, key.v_splits)
        out.append(dict(kind="decode", kernel=key.name, arch=key.arch, grid=grid,
                        block=(DECODE_THREADS,), smem=key.smem_bytes, splits=splits,
                        len_q=(1, limit) if limit is not None else (1, None)))
    if kind in ("prefill", "mixed"):
        key = select_kernel(problem, arch=arch, device_cc=device_cc)
        tr = key_traits(key)
        if key.arch == "sm90" and sm_count is None and device_cc is not None:
            sm_count = 132  # described for a 9.0 device without one: an H100 / H200 SXM
        grid = launch_grid(problem, tr, key.arch, sm_count=sm_count)
        out.append(dict(kind="prefill", kernel=key.name, arch=key.arch, grid=grid,
                        block=(tr.num_threads,),
                        smem=tr.smem_bytes, splits=1,
                        len_q=(limit + 1, None) if limit is not None else (1, None)))
    return tuple(out)


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
    "route",
    "describe_launches",
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
