"""Does this GPU have the shared memory the chosen kernels need?

The tiles in ``cuda_src/*/kernel_traits.cuh`` were measured on the H200, whose blocks may opt
in to 227 KB of shared memory. Other GPUs allow less per block
(``cudaDevAttrMaxSharedMemoryPerBlockOptin``): the A100 163 KB, sm_86 / sm_89 (RTX 30xx / 40xx,
L4, L40) 99 KB. So on those GPUs some head-dim buckets do not fit (the sm80 D=256 prefill needs
194 KB, the D=128 decode 106 KB). Setting the kernel's ``max_dynamic_shared_size_bytes`` above the
limit fails with an untyped CUDA error. Worse, it fails at the first launch, which for
``flash_attn_with_kvcache`` comes after the append has written the cache. So every plan is
checked here first (:func:`check_fits`), from host data only: the kernels come from
:func:`describe_launches`, and the limit is one cached device attribute. A call that does not
fit gets an :class:`~cupy_flashattn.errors.UnsupportedError` that names both sizes and the
largest head dim that fits, before anything is written.
"""

from __future__ import annotations

from ..errors import UnsupportedError, explain

_OPTIN: dict = {}  # device id -> bytes


def smem_per_block_optin(device_id=None) -> int:
    """The most dynamic shared memory one block of a kernel may opt in to on a device (default:
    the current one), in bytes."""
    import cupy

    dev = cupy.cuda.runtime.getDevice() if device_id is None else int(device_id)
    limit = _OPTIN.get(dev)
    if limit is None:
        rt = cupy.cuda.runtime
        limit = _OPTIN[dev] = int(rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                        dev))
    return limit


def _largest_fitting_head_dim(arch: str, kind: str, dtype: str, limit: int):
    """The largest head dim whose kernel of this family fits in ``limit`` bytes, or None."""
    from .compile import head_dim_buckets, traits
    from .decode import DECODE_BUCKETS, smem_bytes

    if kind == "decode":
        fitting = [d for d in DECODE_BUCKETS if smem_bytes(d) <= limit]
    else:
        fitting = [d for d in head_dim_buckets(arch, dtype) if traits(d, arch, dtype).smem_bytes <= limit]
    return max(fitting) if fitting else None


def check_fits(problem, limit=None, sm_count=None, device_cc=None) -> None:
    """Raise UnsupportedError when a kernel that would serve ``problem`` needs more shared memory
    per block than ``limit`` bytes (default: the current device's opt-in limit).  ``sm_count`` /
    ``device_cc``: as :func:`describe_launches` (tests describe a device that is not there)."""
    from . import describe_launches
    from .compile import kernel_dtype_tag

    if limit is None:
        limit = smem_per_block_optin()
    launches = describe_launches(problem, sm_count=sm_count, device_cc=device_cc)
    for launch in launches:
        need = int(launch["smem"])
        if need <= limit:
            continue
        kind = launch["kind"]
        dtype = kernel_dtype_tag(problem.q.dtype)
        best = _largest_fitting_head_dim(launch["arch"], kind, dtype, limit)
        fix = ("run it on a GPU that allows more shared memory per block (Hopper: 227 KB)"
               + (f", or use head_dim <= {best}, the largest whose {kind} kernel fits this GPU"
                  if best is not None else ""))
        raise explain(
            UnsupportedError, "head_dim",
            f"the {kind} kernel for head_dim {problem.head_dim} ({launch['kernel']}) needs more "
            "shared memory per block than this GPU allows",
            f"at most {limit} bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin)",
            f"{need} bytes", fix,
        )
