"""Decode attention (``cuda_src/flash_decode.cu``): instantiations, split heuristic, launch.

When it applies (:func:`decode_applies`): the packed rows of one kv head -- ``max_seqlen_q * g``
with ``g = H / Hk`` query heads per kv head -- fit in few 16-row tiles.  Then one CTA per
(split, m-block, kv head, sequence) reads each K/V byte once per kv head and the query heads of
the group ride along as rows of the same mma tile.  The prefill kernel instead reads K/V once
per *query head* and per 64/128-query tile, so decode is chosen when its number of 16-row
m-blocks is at most what prefill would pay, ``m_blocks <= min(4, g)``, or when everything fits
one tile (``max_seqlen_q * g <= 16``):

    GQA 32/8 (g = 4): Sq <= 16      MHA (g = 1): Sq <= 16      MQA 32/1 (g = 32): Sq <= 2

Split-KV (flash-decoding): with fewer CTAs than ~80% of the SM slots, each sequence's keys are
split over ``num_splits`` CTAs (chosen like flash-attn's ``num_splits_heuristic``: the fewest
splits whose wave efficiency is within 85% of the best, with at least 256 keys per split); the
partials (float32 O + LSE) are merged by the combine kernel, which also serves
:func:`merge_states` (``merge_attention_states`` on CuPy).

Instantiations: one decode kernel per (dtype, head-dim bucket 64/128/256) -- masks, softcap,
ALiBi and paged addressing are run-time switches (the kernel waits on memory, not on ALU) -- plus
one combine kernel and one rotary/append kernel (``kv_cache.cu``) with run-time dtypes: 8 in all.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np

from ..problem import AttentionProblem
from .args import INT_MAX, Operands
from .args import bf16_dtype as _bf16
from .args import elem_stride as _es
from .args import ptr as _ptr
from .compile import NVRTC_OPTIONS, PARAMS
from .source import build_source

__all__ = [
    "DecodeKey",
    "DECODE_BUCKETS",
    "decode_applies",
    "decode_bucket",
    "decode_shipped_keys",
    "decode_source",
    "num_splits_heuristic",
    "run_decode",
    "merge_states",
    "rope_append",
    "smem_bytes",
]

log = logging.getLogger("cupy_flashattn")

DECODE_BUCKETS = (64, 128, 256)
DECODE_ROWS = 16  # kDecodeRows
DECODE_THREADS = 128
# (kStages, kMinBlocks) per bucket: mirrors DecodeTraits<> in flash_decode.cu.
DECODE_TRAITS = {64: (4, 3), 128: (3, 2), 256: (3, 1)}

DECODE_EXTRA = (
    ("float*", "oaccum"),
    ("float*", "lse_accum"),
    ("int", "num_splits"),
    ("int", "m_blocks"),
    ("int", "paged"),
)

COMBINE_FIELDS = (
    ("const void*", "o_in"), ("const float*", "lse_in"), ("void*", "o_out"), ("float*", "lse_out"),
    ("long long", "o_split_stride"), ("long long", "o_row_stride"), ("long long", "o_head_stride"),
    ("long long", "lse_split_stride"), ("long long", "lse_batch_stride"),
    ("long long", "lse_head_stride"),
    ("long long", "out_row_stride"), ("long long", "out_head_stride"),
    ("long long", "lse_out_batch_stride"), ("long long", "lse_out_head_stride"),
    ("int", "lse_rows"), ("int", "rows"), ("int", "heads"), ("int", "head_dim"),
    ("int", "num_splits"), ("int", "in_type"), ("int", "out_type"),
)  # fmt: skip

ROPE_FIELDS = (
    ("const void*", "src"), ("void*", "dst"), ("const void*", "src2"), ("void*", "dst2"),
    ("long long", "src_b"), ("long long", "src_s"), ("long long", "src_h"),
    ("long long", "src2_b"), ("long long", "src2_s"), ("long long", "src2_h"),
    ("long long", "dst_b"), ("long long", "dst_s"), ("long long", "dst_h"),
    ("const int*", "seqlens"), ("const int*", "batch_idx"), ("const int*", "table"),
    ("int", "table_stride"), ("int", "table_width"), ("int", "page_size"),
    ("int", "dst_rows"), ("int", "dst_capacity"), ("int", "mode"),
    ("const void*", "cos"), ("const void*", "sin"),
    ("long long", "cos_row_stride"), ("long long", "sin_row_stride"),
    ("int", "cs_type"), ("int", "seqlen_ro"), ("int", "rot_half"), ("int", "interleaved"),
    ("const int*", "positions"), ("long long", "pos_b"), ("long long", "pos_s"),
    ("int", "pos_per_token"),
    ("int", "batch"), ("int", "seqlen"), ("int", "heads"), ("int", "head_dim"),
    ("int", "elem_type"),
)  # fmt: skip

# The order in which run_decode packs compile.PARAMS (shared with the prefill kernel's entry
# points); tests/test_nvrtc_compile_decode.py fails if compile.PARAMS drifts from it.
PACKED_PARAMS = (
    "q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "cache_batch_idx",
    "leftpad_k", "block_table", "alibi_slopes", "q_row_stride", "q_head_stride", "k_row_stride",
    "k_head_stride", "k_page_stride", "o_row_stride", "o_head_stride", "lse_head_stride",
    "alibi_batch_stride", "alibi_head_stride", "table_batch_stride", "batch", "seqlen_q",
    "seqlen_k", "total_q", "k_rows", "num_heads", "h_per_kv", "head_dim", "page_size",
    "max_blocks_per_seq", "window_left", "window_right", "softmax_scale", "softcap",
    "len_q_min", "len_q_max",
)  # fmt: skip

COMBINE_NAME = "fa_decode_combine"
ROPE_NAME = "fa_rope_append"


@dataclass(frozen=True, order=True)
class DecodeKey:
    dtype: str  # "f16" | "bf16"
    head_dim: int  # one of DECODE_BUCKETS

    @property
    def name(self) -> str:
        return f"fa_decode_{self.dtype}_d{self.head_dim}"

    def __str__(self) -> str:
        return self.name

    @property
    def stages(self) -> int:
        return DECODE_TRAITS[self.head_dim][0]

    @property
    def min_blocks(self) -> int:
        return DECODE_TRAITS[self.head_dim][1]

    @property
    def register_budget(self) -> int:
        return min(255, 65536 // (DECODE_THREADS * self.min_blocks) // 8 * 8)


def smem_bytes(bucket: int) -> int:
    """Dynamic shared memory of the decode kernel (DecodeSmem<kD>::kBytes)."""
    stages = DECODE_TRAITS[bucket][0]
    row = (bucket + 8) * 2
    tile = 16 * row
    ring = 4 * stages * 2 * tile
    merge = 4 * 16 * (bucket + 8) * 4
    return 16 * row + max(ring, merge)


def decode_bucket(head_dim: int) -> int:
    d8 = -(-int(head_dim) // 8) * 8
    for b in DECODE_BUCKETS:
        if d8 <= b:
            return b
    raise ValueError(f"head_dim {head_dim} exceeds the largest decode bucket {DECODE_BUCKETS[-1]}")


def decode_shipped_keys() -> list:
    return [DecodeKey(dt, d) for dt in ("f16", "bf16") for d in DECODE_BUCKETS]


# -- source ---------------------------------------------------------------------------------


def _flat(fields):
    return ",\n    ".join(f"{ctype} {name}" for ctype, name in fields)


def _decode_wrapper(key: DecodeKey) -> str:
    elem = "fa::Bf16" if key.dtype == "bf16" else "fa::F16"
    assigns = "\n".join(f"  dp.f.{n} = {n};" for _, n in PARAMS)
    extra = "\n".join(f"  dp.{n} = {n};" for _, n in DECODE_EXTRA)
    return f"""
extern "C" __global__ void __launch_bounds__({DECODE_THREADS}, {key.min_blocks}) {key.name}(
    {_flat(PARAMS + DECODE_EXTRA)}) {{
  fa::DecodeParams dp;
{assigns}
{extra}
  fa::flash_decode<{key.head_dim}, {elem}>(dp);
}}
"""


def _struct_wrapper(name: str, struct: str, fn: str, fields, threads: int) -> str:
    assigns = "\n".join(f"  c.{n} = {n};" for _, n in fields)
    return f"""
extern "C" __global__ void __launch_bounds__({threads}) {name}(
    {_flat(fields)}) {{
  fa::{struct} c;
{assigns}
  fa::{fn}(c);
}}
"""


def decode_source(keys=(), combine: bool = True) -> str:
    """flash_decode.cu (headers inlined) + entry points of ``keys`` (+ the combine kernel)."""
    src = build_source("flash_decode.cu") + '#line 1 "<generated decode entry points>"\n'
    src += "".join(_decode_wrapper(k) for k in keys)
    if combine:
        src += _struct_wrapper(COMBINE_NAME, "CombineParams", "combine_states", COMBINE_FIELDS, 128)
    return src


def rope_source() -> str:
    return build_source("kv_cache.cu") + '#line 1 "<generated rope entry point>"\n' + _struct_wrapper(
        ROPE_NAME, "RopeAppendParams", "rope_append", ROPE_FIELDS, 128
    )


@functools.cache
def _decode_kernel(key: DecodeKey):
    import cupy

    log.info("compiling %s (first use)", key.name)
    mod = cupy.RawModule(code=decode_source([key], combine=False), options=NVRTC_OPTIONS)
    kern = mod.get_function(key.name)
    smem = smem_bytes(key.head_dim)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


@functools.cache
def _combine_kernel():
    import cupy

    log.info("compiling %s (first use)", COMBINE_NAME)
    return cupy.RawModule(code=decode_source([], combine=True), options=NVRTC_OPTIONS).get_function(COMBINE_NAME)


@functools.cache
def _rope_kernel():
    import cupy

    log.info("compiling %s (first use)", ROPE_NAME)
    return cupy.RawModule(code=rope_source(), options=NVRTC_OPTIONS).get_function(ROPE_NAME)


def precompile_decode(dtypes=("f16", "bf16"), buckets=DECODE_BUCKETS) -> list:
    names = []
    for dt in dtypes:
        for b in buckets:
            _decode_kernel(DecodeKey(dt, b))
            names.append(DecodeKey(dt, b).name)
    _combine_kernel()
    _rope_kernel()
    return names + [COMBINE_NAME, ROPE_NAME]


# -- heuristics -----------------------------------------------------------------------------


@functools.cache
def _sm_count(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])


def decode_applies(problem: AttentionProblem) -> bool:
    """True when the decode kernel serves this problem better than the prefill kernel."""
    p = problem
    if p.head_dim > DECODE_BUCKETS[-1] or p.num_heads % p.num_heads_k:
        return False
    g = p.num_heads // p.num_heads_k
    rows = int(p.max_seqlen_q) * g
    m_blocks = -(-rows // DECODE_ROWS)
    return rows <= DECODE_ROWS or m_blocks <= min(4, g)


def decode_len_q_limit(num_heads: int, num_heads_k: int) -> int:
    """The longest query length the decode kernel serves (the rule of :func:`decode_applies`
    solved for max_seqlen_q): in a mixed batch, sequences up to it go to decode, longer ones to
    the prefill kernel."""
    g = num_heads // num_heads_k
    return max(DECODE_ROWS // g, DECODE_ROWS * min(4, g) // g)


def num_splits_heuristic(ctas: int, max_seqlen_k: int, num_sms: int, ctas_per_sm: int = 1,
                         max_splits: int = 128, min_keys: int = 256) -> int:
    """flash-attn's rule: no split when the grid already fills ~80% of the SM slots; else the
    fewest splits whose wave efficiency is >= 85% of the best, with >= min_keys keys each."""
    slots = max(1, num_sms * ctas_per_sm)
    if ctas <= 0 or ctas >= 0.8 * slots:
        return 1
    cap = max(1, min(max_splits, -(-int(max_seqlen_k) // min_keys)))
    if cap == 1:
        return 1
    effs = []
    for s in range(1, cap + 1):
        waves = ctas * s / slots
        effs.append(waves / -(-waves // 1))
    best = max(effs)
    for s, e in enumerate(effs, start=1):
        if e >= 0.85 * best:
            return s
    return 1


# -- launch ---------------------------------------------------------------------------------


def _elem_code(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return 0
    if dtype == np.float16:
        return 1
    if dtype == _bf16():
        return 2
    if dtype == np.float64:
        return 3
    raise TypeError(f"unsupported dtype {dtype}")














def plan(problem: AttentionProblem, len_q_max=None):
    """(key, m_blocks, num_splits) the launcher would use (host-only, no launch).  With
    ``len_q_max`` (the decode half of a mixed batch) the grid covers queries up to that length
    and there is no split: the combine kernel would rewrite the prefill kernel's rows."""
    import cupy

    p = problem
    dt = "f16" if np.dtype(p.q.dtype) == np.float16 else "bf16"
    key = DecodeKey(dt, decode_bucket(p.head_dim))
    g = p.num_heads // p.num_heads_k
    longest = int(p.max_seqlen_q) if len_q_max is None else min(int(p.max_seqlen_q), int(len_q_max))
    m_blocks = max(1, -(-longest * g // DECODE_ROWS))
    ctas = m_blocks * p.num_heads_k * int(p.batch_size)
    if len_q_max is not None:
        return key, m_blocks, 1
    if p.num_splits and p.num_splits > 0:
        splits = int(p.num_splits)
    else:
        splits = num_splits_heuristic(ctas, int(p.max_seqlen_k), _sm_count(cupy.cuda.Device().id),
                                      key.min_blocks)
    splits = max(1, min(splits, 256))
    return key, m_blocks, splits


def run_decode(problem: AttentionProblem, len_q_max=None) -> None:
    """Fill ``problem.out`` / ``problem.softmax_lse`` with the decode kernel (no host sync).
    With ``len_q_max``, only sequences of at most that many queries are served (mixed batch)."""
    import cupy

    p = problem
    key, m_blocks, splits = plan(p, len_q_max)
    ops = Operands(p, np.dtype(np.float16) if key.dtype == "f16" else _bf16())
    H, Hk, total_q, d8 = p.num_heads, p.num_heads_k, p.total_q, ops.head_dim8
    grid = (splits * m_blocks, Hk, int(p.batch_size))
    if not (total_q > 0 and p.batch_size > 0 and p.max_seqlen_q > 0):
        ops.finish()
        return
    if splits > 1:
        oacc = cupy.empty((splits, total_q, H, d8), dtype=np.float32)
        # Rows that no sequence covers (varlen) must read as empty in the combine.
        if p.cu_seqlens_q is not None:
            lacc = cupy.full((splits, H, total_q), -np.inf, dtype=np.float32)
        else:
            lacc = cupy.empty((splits, H, total_q), dtype=np.float32)
    else:
        oacc = lacc = None
    args = ops.fwd_params(len_q_max=INT_MAX if len_q_max is None else len_q_max) + (
        _ptr(oacc), _ptr(lacc), np.int32(splits), np.int32(m_blocks), np.int32(1 if p.paged else 0),
    )  # fmt: skip
    _decode_kernel(key)(grid, (DECODE_THREADS,), args, shared_mem=smem_bytes(key.head_dim))
    if splits > 1:
        o, lse = ops.o, ops.lse
        _combine(
            oacc, lacc, o, lse, splits=splits, rows=total_q, heads=H, head_dim=d8,
            o_split=total_q * H * d8, o_row=H * d8, o_head=d8,
            lse_split=H * total_q, lse_rows=total_q, lse_batch=0, lse_head=total_q,
            out_row=int(_es(o, 0)), out_head=int(_es(o, 1)),
            lse_out_rows=total_q, lse_out_batch=0, lse_out_head=int(lse.strides[0] // 4),
            in_type=0, out_type=_elem_code(o.dtype),
        )
    ops.finish()


def _combine(o_in, lse_in, o_out, lse_out, *, splits, rows, heads, head_dim, o_split, o_row, o_head,
             lse_split, lse_rows, lse_batch, lse_head, out_row, out_head, lse_out_rows,
             lse_out_batch, lse_out_head, in_type, out_type):
    assert lse_rows == lse_out_rows
    pairs = rows * heads
    if pairs == 0:
        return
    args = (
        o_in, lse_in, o_out, lse_out,
        np.int64(o_split), np.int64(o_row), np.int64(o_head),
        np.int64(lse_split), np.int64(lse_batch), np.int64(lse_head),
        np.int64(out_row), np.int64(out_head), np.int64(lse_out_batch), np.int64(lse_out_head),
        np.int32(max(1, lse_rows)), np.int32(rows), np.int32(heads), np.int32(head_dim),
        np.int32(splits), np.int32(in_type), np.int32(out_type),
    )  # fmt: skip
    _combine_kernel()((-(-pairs // 4),), (128,), args)


def merge_states(out_a, lse_a, out_b, lse_b):
    """GPU ``merge_attention_states`` for float16/bfloat16/float32 outputs and float32 LSEs
    (validated by the caller).  Returns ``(out, lse)`` like merge.py; None when this path does
    not apply (the caller then uses the generic code)."""
    import cupy

    if np.dtype(lse_a.dtype) != np.float32 or np.dtype(lse_b.dtype) != np.float32:
        return None
    if np.dtype(out_a.dtype) not in (np.dtype(np.float16), _bf16(), np.dtype(np.float32)):
        return None
    oa, ob = cupy.ascontiguousarray(out_a), cupy.ascontiguousarray(out_b)
    la, lb = cupy.ascontiguousarray(lse_a), cupy.ascontiguousarray(lse_b)
    isz = oa.itemsize
    o_split, l_split = ob.data.ptr - oa.data.ptr, lb.data.ptr - la.data.ptr
    if o_split % isz or l_split % 4:
        return None
    D = int(oa.shape[-1])
    H = int(oa.shape[-2])
    rows = int(np.prod(oa.shape[:-2]))
    if oa.ndim == 3:  # (total, H, D) with lse (H, total)
        lse_rows, lse_batch, lse_head = rows, 0, rows
    else:  # (B, S, H, D) with lse (B, H, S)
        S = int(oa.shape[1])
        lse_rows, lse_batch, lse_head = S, H * S, S
    out = cupy.empty(oa.shape, dtype=oa.dtype)
    lse = cupy.empty(la.shape, dtype=np.float32)
    _combine(
        oa, la, out, lse, splits=2, rows=rows, heads=H, head_dim=D,
        o_split=o_split // isz, o_row=H * D, o_head=D,
        lse_split=l_split // 4, lse_rows=lse_rows, lse_batch=lse_batch, lse_head=lse_head,
        out_row=H * D, out_head=D, lse_out_rows=lse_rows, lse_out_batch=lse_batch,
        lse_out_head=lse_head, in_type=_elem_code(oa.dtype), out_type=_elem_code(oa.dtype),
    )
    return out, lse


# -- rotary + append (kv_cache.cu) -------------------------------------------------------


def rope_append(src, dst, *, src2=None, dst2=None, mode=0, seqlens=None, batch_idx=None,
                table=None, page_size=0, cos=None, sin=None, interleaved=False, positions=None,
                pos_per_token=True):
    """Launch ``fa_rope_append``: rotate ``src`` (B, S, H, D) (when cos/sin are given) into
    ``dst`` -- a dense (B, S, H, D) array (mode 0), a contiguous cache (B_cache, S_cache, H, D)
    (mode 1) or a page pool (num_blocks, P, H, D) (mode 2) -- and copy ``src2`` into ``dst2``
    with the same mapping.  Out-of-range destinations are dropped on the device."""
    import cupy

    B, S, H, D = (int(x) for x in src.shape)
    if B * S * H == 0:
        return
    rot_half, seqlen_ro, cs_type = 0, 0, 0
    c_stride = s_stride = np.int64(0)
    if cos is not None:
        rot_half, seqlen_ro, cs_type = int(cos.shape[1]), int(cos.shape[0]), _elem_code(cos.dtype)
        if cos.strides[-1] != cos.itemsize:
            cos = cupy.ascontiguousarray(cos)
        if sin.strides[-1] != sin.itemsize or sin.dtype != cos.dtype:
            sin = cupy.ascontiguousarray(sin.astype(cos.dtype, copy=False))
        c_stride, s_stride = _es(cos, 0), _es(sin, 0)
    pos_b = pos_s = np.int64(0)
    if positions is not None:
        if np.dtype(positions.dtype) != np.int32:
            positions = positions.astype(np.int32)
        pos_b, pos_s = _es(positions, 0), _es(positions, 1)
    if table is not None:
        t_stride, t_width = int(_es(table, 0)), int(table.shape[1])
    else:
        t_stride = t_width = 0
    z = np.int64(0)
    s2 = (_es(src2, 0), _es(src2, 1), _es(src2, 2)) if src2 is not None else (z, z, z)
    args = (
        src, dst, _ptr(src2), _ptr(dst2),
        _es(src, 0), _es(src, 1), _es(src, 2), *s2,
        _es(dst, 0), _es(dst, 1), _es(dst, 2),
        _ptr(seqlens), _ptr(batch_idx), _ptr(table),
        np.int32(t_stride), np.int32(t_width), np.int32(page_size),
        np.int32(dst.shape[0]), np.int32(dst.shape[1]), np.int32(mode),
        _ptr(cos), _ptr(sin), np.int64(c_stride), np.int64(s_stride),
        np.int32(cs_type), np.int32(seqlen_ro), np.int32(rot_half), np.int32(1 if interleaved else 0),
        _ptr(positions), np.int64(pos_b), np.int64(pos_s), np.int32(1 if pos_per_token else 0),
        np.int32(B), np.int32(S), np.int32(H), np.int32(D), np.int32(_elem_code(src.dtype)),
    )  # fmt: skip
    rows = B * S * H
    _rope_kernel()((-(-rows // 4), 2 if src2 is not None else 1), (32, 4), args)
