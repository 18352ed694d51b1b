"""How host-side CuPy arrays become kernel arguments, shared by every launcher (prefill,
decode): 16-byte alignment checks, head-dim padding, element strides, null pointers, window
clamping.  No function here synchronises with the device."""

from __future__ import annotations

import numpy as np


#: Windows wider than any sequence are clamped so `i + shift +- window` cannot overflow int32.
WINDOW_CAP = 1 << 30


def bf16_dtype() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def compute_dtype(kernel_tag: str) -> np.dtype:
    """The operand dtype of a kernel element type: what q/k/v/out are cast to when the
    caller's arrays are of another dtype (float32 on "bf16" kernels: set_float32_precision
    "medium").  "f32" / "tf32" read float32, "f64" float64."""
    if kernel_tag in ("f32", "tf32"):
        return np.dtype(np.float32)
    if kernel_tag == "f64":
        return np.dtype(np.float64)
    return np.dtype(np.float16) if kernel_tag == "f16" else bf16_dtype()


def aligned(a) -> bool:
    """Last dim contiguous, other strides multiples of 16 bytes, base 16-byte aligned (what
    cp.async and the 16-byte vector stores need)."""
    if a.strides[-1] != a.itemsize:
        return False
    ptr = a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data  # CuPy, or NumPy in tests
    if ptr % 16:
        return False
    return all(s % 16 == 0 for s, n in zip(a.strides[:-1], a.shape[:-1]) if n > 1)


def pad_last(a, d_to, dtype):
    """``a`` cast to ``dtype`` with its last dim zero-padded to ``d_to`` (``a`` itself if it
    already is): zero columns change neither Q K^T nor the kept part of P V."""
    import cupy

    if a.shape[-1] == d_to and a.dtype == dtype:
        return a
    out = cupy.zeros(a.shape[:-1] + (d_to,), dtype=dtype)
    out[..., : a.shape[-1]] = a.astype(dtype, copy=False)
    return out


def elem_stride(a, i) -> int:
    """Stride of dim ``i`` in elements."""
    return int(a.strides[i] // a.itemsize)


#: The pointer fields of ``fa::FwdParams`` and the AttentionProblem field each one reads when
#: the launch is direct (:attr:`Operands.direct`): what a replayed plan rebinds per call.
PROBLEM_POINTERS = (
    ("q", "q"), ("k", "k"), ("v", "v"), ("o", "out"), ("lse", "softmax_lse"),
    ("cu_seqlens_q", "cu_seqlens_q"), ("cu_seqlens_k", "cu_seqlens_k"),
    ("seqused_k", "seqused_k"), ("cache_batch_idx", "cache_batch_idx"),
    ("leftpad_k", "leftpad_k"), ("block_table", "block_table"),
    ("alibi_slopes", "alibi_slopes"), ("sinks", "sinks"),
    ("prefix_ranges", "mm_prefix_ranges"),
)


def problem_pointers(p) -> dict:
    """FwdParams pointer field -> the problem's array (what a replayed launch rebinds:
    ``launcher.Launch``).  Read from the dataclass's ``__dict__``: per call, a dict lookup is
    cheaper than ``getattr`` (14 fields)."""
    fields = p.__dict__
    return {field: fields[attr] for field, attr in PROBLEM_POINTERS}


def window(w: int) -> int:
    return -1 if w < 0 else min(int(w), WINDOW_CAP)


#: ``len_q_max`` that serves every sequence.
INT_MAX = 2**31 - 1


class Operands:
    """The arrays one forward launch (prefill or decode) reads and writes, adapted for the kernel:
    q/k/v cast to the compute dtype and zero-padded to a multiple of 8 in D when needed, copied
    when not 16-byte aligned (k and v must share strides), and temporaries for ``out`` / the LSE
    when the caller's cannot be written directly.  :meth:`finish` copies the temporaries back.

    Each adaptation costs a copy and happens only when needed (see ``launch.py``'s docstring)."""

    def __init__(self, p, compute_dtype):
        import cupy

        self.problem = p
        self.head_dim = d = p.head_dim
        self.head_dim8 = d8 = -(-d // 8) * 8
        q, k, v, out = p.q, p.k, p.v, p.out
        kv_fp8 = p.kv_float8 is not None  # float8 K/V are read as stored (decode.kv_format)
        if d8 != d or q.dtype != compute_dtype:
            q = pad_last(q, d8, compute_dtype)
            if not kv_fp8:
                k, v = (pad_last(a, d8, compute_dtype) for a in (k, v))
        if not aligned(q):
            q = cupy.ascontiguousarray(q)
        if not (aligned(k) and aligned(v) and k.strides == v.strides):
            k, v = cupy.ascontiguousarray(k), cupy.ascontiguousarray(v)
        o = out
        if d8 != d or out.dtype != compute_dtype or not aligned(out):
            o = cupy.empty(out.shape[:-1] + (d8,), dtype=compute_dtype)
        lse = p.softmax_lse
        self.lse_is_temporary = lse.ndim != 2 or lse.strides[-1] != lse.itemsize
        if self.lse_is_temporary:
            lse = cupy.empty((p.num_heads, p.total_q), dtype=lse.dtype)
        self.q, self.k, self.v, self.o, self.lse = q, k, v, o, lse

    @property
    def direct(self) -> bool:
        """True when the kernel reads and writes the problem's own arrays (no adaptation copy,
        no temporary): then a launch plan can be replayed on other arrays of the same shapes,
        strides and alignment by rebinding pointers alone."""
        p = self.problem
        return (self.q is p.q and self.k is p.k and self.v is p.v and self.o is p.out
                and self.lse is p.softmax_lse)

    def fwd_values(self, len_q_min: int = 0, len_q_max: int = INT_MAX, tiles_m: int = 0) -> dict:
        """The ``fa::FwdParams`` fields (``compile.PARAMS`` names) -> values; arrays (or None)
        for the pointer fields.  ``tiles_m``: query tiles per (sequence, head), read by the
        sm90 family's persistent schedule only."""
        p, q, k, v, o, lse = self.problem, self.q, self.k, self.v, self.o, self.lse
        if p.paged:
            k_page, k_row, k_head = elem_stride(k, 0), elem_stride(k, 1), elem_stride(k, 2)
            table = p.block_table
            table_stride, max_blocks = elem_stride(table, 0), int(table.shape[1])
            page_size = int(p.page_block_size)
        else:
            k_page, k_row, k_head = 0, elem_stride(k, 0), elem_stride(k, 1)
            table, table_stride, max_blocks, page_size = None, 0, 0, 0
        alibi = p.alibi_slopes
        a_b, a_h = (elem_stride(alibi, 0), elem_stride(alibi, 1)) if alibi is not None else (0, 0)
        ranges = p.mm_prefix_ranges  # (B, R, 2) int32, pairs contiguous (validate.prefix_ranges)
        r_count, r_stride = ((int(ranges.shape[1]), elem_stride(ranges, 0))
                             if ranges is not None and ranges.size else (0, 0))
        H, Hk = p.num_heads, p.num_heads_k
        return dict(
            q=q, k=k, v=v, o=o, lse=lse,
            cu_seqlens_q=p.cu_seqlens_q, cu_seqlens_k=p.cu_seqlens_k, seqused_k=p.seqused_k,
            cache_batch_idx=p.cache_batch_idx, leftpad_k=p.leftpad_k, block_table=table,
            alibi_slopes=alibi, sinks=p.sinks, prefix_ranges=ranges if r_count else None,
            q_row_stride=elem_stride(q, 0), q_head_stride=elem_stride(q, 1),
            k_row_stride=k_row, k_head_stride=k_head, k_page_stride=k_page,
            o_row_stride=elem_stride(o, 0), o_head_stride=elem_stride(o, 1),
            lse_head_stride=lse.strides[0] // lse.itemsize,
            alibi_batch_stride=a_b, alibi_head_stride=a_h, table_batch_stride=table_stride,
            prefix_ranges_count=r_count, prefix_ranges_batch_stride=r_stride,
            batch=p.batch_size, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k,
            total_q=p.total_q, k_rows=k.shape[0], num_heads=H, h_per_kv=H // Hk,
            head_dim=self.head_dim8, page_size=page_size, max_blocks_per_seq=max_blocks,
            window_left=window(p.window_left), window_right=window(p.window_right),
            softmax_scale=p.softmax_scale, softcap=p.softcap if p.softcap > 0 else 0.0,
            len_q_min=len_q_min, len_q_max=len_q_max, seqused_k_add=p.seqused_k_add,
            tiles_m=tiles_m,
        )  # fmt: skip

    def finish(self) -> None:
        """Copy the temporaries (output, LSE) into the caller's arrays."""
        p = self.problem
        if self.o is not p.out:
            p.out[...] = self.o[..., : self.head_dim].astype(p.out.dtype, copy=False)
        if self.lse_is_temporary:
            p.softmax_lse[...] = self.lse.reshape(p.softmax_lse.shape)
