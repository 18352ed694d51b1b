"""Launching the forward kernel for one :class:`~cupy_flashattn.problem.AttentionProblem`.

Everything here is host-side bookkeeping with no device synchronisation: no ``.get()``, no
``int(cupy_array)``; the grid comes from the host integer ``max_seqlen_q`` and every per-sequence
quantity is resolved on the device (``cuda_src/block_info.cuh``).

Adaptations made before the launch (each costs a copy, and only when needed):
  * head dims that are not a multiple of 8 (e.g. 59): q/k/v are zero-padded to the next
    multiple of 8 and the output sliced back -- zero columns change neither Q K^T nor the
    kept part of P V.  Paged caches are padded whole, so prefer D % 8 == 0 for large caches;
  * float32 inputs: cast to bfloat16 (not float16: bf16 has float32's exponent range, so large
    activations cannot overflow to inf), computed with fp32 accumulation and softmax, and the
    output cast back to float32.  Precision is therefore that of bf16 inputs (~3 significant
    digits), not of float32;
  * q / out / k / v whose row or head strides are not multiples of 8 elements (16 bytes, as
    cp.async and the vector stores need), or k and v with different strides, are copied to
    contiguous arrays (out: written to a temporary, then copied back).
"""

from __future__ import annotations

import numpy as np

from ..problem import AttentionProblem
from .args import aligned as _aligned
from .args import bf16_dtype as _bf16
from .args import elem_stride as _estride
from .args import pad_last as _pad_last
from .args import ptr as _ptr
from .args import window as _window
from .compile import KernelKey, bucket_for, get_kernel, traits

__all__ = ["run_attention", "is_available", "select_kernel"]



def is_available() -> bool:
    """True when CuPy imports, a CUDA device is visible and it is sm_80 or newer."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        return int(cupy.cuda.Device().compute_capability) >= 80
    except Exception:
        return False




def _dtype_tag(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return "f16"
    if dtype == _bf16() or dtype == np.float32:
        return "bf16"
    raise TypeError(f"q: dtype {dtype} is not supported (expected float16, bfloat16 or float32)")




def select_kernel(problem: AttentionProblem) -> KernelKey:
    """The instantiation that serves this problem."""
    p = problem
    scale_ok = p.softmax_scale > 0 and np.isfinite(p.softmax_scale)
    return KernelKey(
        dtype=_dtype_tag(p.q.dtype),
        head_dim=bucket_for(p.head_dim),
        # A scale <= 0 cannot be folded into exp2 after the row max (it would flip the
        # ordering): the transform path scales first; with no slopes it adds a zero bias.
        transform=p.alibi_slopes is not None or p.softcap > 0 or not scale_ok,
        paged=p.paged,
    )










def needs_temporaries(problem: AttentionProblem) -> bool:
    """True when the launch writes into a temporary (padded head dim, float32 output, misaligned
    out, strided LSE) that is copied back whole -- which would overwrite rows another kernel
    wrote, so a mixed batch then runs on one kernel."""
    p = problem
    out, lse = p.out, p.softmax_lse
    return (
        p.head_dim % 8 != 0
        or np.dtype(out.dtype) == np.float32
        or not _aligned(out)
        or lse.ndim != 2
        or lse.strides[-1] != 4
    )


def run_attention(problem: AttentionProblem, len_q_min: int = 0) -> None:
    """Fill ``problem.out`` and ``problem.softmax_lse`` on the current CuPy stream.  With
    ``len_q_min``, only sequences of at least that many queries are served (mixed batch)."""
    import cupy

    p = problem
    key = select_kernel(p)
    tr = traits(key.head_dim)
    d = p.head_dim
    d8 = -(-d // 8) * 8
    cdtype = np.dtype(np.float16) if key.dtype == "f16" else _bf16()

    q, k, v, out = p.q, p.k, p.v, p.out
    if d8 != d or q.dtype != cdtype:
        q = _pad_last(q, d8, cdtype)
        k = _pad_last(k, d8, cdtype)
        v = _pad_last(v, d8, cdtype)
    if not _aligned(q):
        q = cupy.ascontiguousarray(q)
    if not (_aligned(k) and _aligned(v) and k.strides == v.strides):
        k, v = cupy.ascontiguousarray(k), cupy.ascontiguousarray(v)
    o = out
    if d8 != d or out.dtype != cdtype or not _aligned(out):
        o = cupy.empty(out.shape[:-1] + (d8,), dtype=cdtype)
    lse = p.softmax_lse
    lse_tmp = lse.strides[-1] != 4 if lse.ndim == 2 else True
    if lse_tmp:
        lse = cupy.empty((p.num_heads, p.total_q), dtype=np.float32)

    H, Hk = p.num_heads, p.num_heads_k
    if p.paged:
        k_page, k_row, k_head = _estride(k, 0), _estride(k, 1), _estride(k, 2)
        k_rows = int(k.shape[0])  # number of pages
        table = p.block_table
        table_stride, max_blocks = _estride(table, 0), int(table.shape[1])
        page_size = int(p.page_block_size)
    else:
        k_page, k_row, k_head = np.int64(0), _estride(k, 0), _estride(k, 1)
        k_rows = int(k.shape[0])
        table, table_stride, max_blocks, page_size = None, np.int64(0), 0, 0
    alibi = p.alibi_slopes
    if alibi is not None:
        a_b, a_h = _estride(alibi, 0), _estride(alibi, 1)
    else:
        a_b = a_h = np.int64(0)

    args = (
        q, k, v, o, lse,
        _ptr(p.cu_seqlens_q), _ptr(p.cu_seqlens_k), _ptr(p.seqused_k),
        _ptr(p.cache_batch_idx), _ptr(p.leftpad_k), _ptr(table), _ptr(alibi),
        _estride(q, 0), _estride(q, 1),
        k_row, k_head, k_page,
        _estride(o, 0), _estride(o, 1),
        np.int64(lse.strides[0] // 4),
        np.int32(a_b), np.int32(a_h), np.int32(table_stride),
        np.int32(p.batch_size), np.int32(p.seqlen_q), np.int32(p.seqlen_k),
        np.int32(p.total_q), np.int32(k_rows), np.int32(H), np.int32(H // Hk),
        np.int32(d8), np.int32(page_size), np.int32(max_blocks),
        np.int32(_window(p.window_left)), np.int32(_window(p.window_right)),
        np.float32(p.softmax_scale), np.float32(p.softcap if p.softcap > 0 else 0.0),
        np.int32(len_q_min), np.int32(2**31 - 1),
    )  # fmt: skip
    grid = (-(-int(p.max_seqlen_q) // tr.block_m), H, int(p.batch_size))
    if grid[0] > 0 and grid[2] > 0 and p.total_q > 0:
        kern = get_kernel(key)
        kern(grid, (tr.num_threads,), args, shared_mem=tr.smem_bytes)

    if o is not out:
        out[...] = o[..., :d].astype(out.dtype, copy=False)
    if lse_tmp:
        p.softmax_lse[...] = lse.reshape(p.softmax_lse.shape)
