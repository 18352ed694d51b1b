"""Decode attention (``cuda_src/sm80/flash_decode.cu``): instantiations, split heuristic, launch.

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
splits whose wave efficiency is within 85% of the best, with at least 256 keys per split; and
a grid of fewer CTAs than SMs splits at least until each SM has one, down to 64 keys); the
partials (float32 O + LSE) are merged by the last split CTA of each tile in the same launch
where :func:`fused_combine_applies` (dense decode launches), else by the combine kernel, which
also serves :func:`merge_states` (``merge_attention_states`` on CuPy).

Key tiles (:func:`decode_tile`): a warp takes 16 keys at a time, or 32 (16-bit K/V, head dim
128, at most 16 packed rows a kv head -- GQA / MHA decode -- one CTA of 4 warps per SM with a
2-slot ring): measured faster there (H100: GQA 32/8 B = 1 ctx 32768 58.9 -> 56.4 us, B = 16
ctx 16384 361.3 -> 353.8) and slower for MQA's two 16-row tiles a kv head (B = 64 ctx 4096
65.4 -> 69.6), which keep 16.  ``CUPY_FLASHATTN_SM90_DEFINES=FA_DECODE_TILE32=0`` turns the
32-key kernels off (the A/B baseline).

Instantiations: one decode kernel per (dtype, head-dim bucket 64/128/256/384/512) -- masks,
softcap, ALiBi and paged addressing are run-time switches (the kernel waits on memory, not on
ALU) -- plus one combine kernel and one rotary/append kernel (``kv_cache.cu``) with run-time
dtypes; per (dtype, bucket 64/128/256, float8 format) one reading float8 K/V
(:data:`FP8_KV_FORMATS`: float8 caches on the GPU, ``fp8.gpu_rules``); and per dtype in
:data:`TILE32_BUCKETS` one with 32-key tiles (``_t32``).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import numpy as np

from ..problem import AttentionProblem
from .args import INT_MAX, Operands, compute_dtype, problem_pointers
from .args import bf16_dtype as _bf16
from .args import elem_stride as _es
from .compile import PARAMS, bucket_for, family_prefix, kernel_dtype_tag, load_function
from .device_facts import decode_facts
from .packing import ArgPack
from .launcher import Launch, launch_packed
from .per_stream import PerStream
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

#: 384 / 512: V-split CTAs (flash_decode.cu DecodeTraits::kVSplits), as the prefill's.
DECODE_BUCKETS = (64, 128, 256, 384, 512)
# fa::kDecodeRows and fa::kDecodeWarps * 32 (flash_decode.cu); every generated decode entry
# point static_asserts both, so they cannot drift.  Per-bucket stages, occupancy and shared
# memory are read from the compiler (device_facts.py).
DECODE_ROWS = 16
DECODE_THREADS = 128
#: Buckets with a 32-key-tile kernel (flash_decode<..., kTileN = 32>) for 16-bit K/V.
TILE32_BUCKETS = (128,)

DECODE_EXTRA = (
    ("float*", "oaccum"),
    ("float*", "lse_accum"),
    ("int", "num_splits"),
    ("int", "m_blocks"),
    ("int", "paged"),
    ("const float*", "k_scale"),
    ("const float*", "v_scale"),
    ("int*", "split_counters"),
)

#: Float8 K/V formats of the decode kernel (DecodeKey.kv) -> fa:: format tag (attn/fp8.cuh),
#: and the buckets they are built for (whole 16-element float8 chunks, no V-split).
FP8_KV_FORMATS = {"e4m3": "fa::KvE4M3", "e5m2": "fa::KvE5M2"}
FP8_KV_BUCKETS = (64, 128, 256)

COMBINE_FIELDS = (
    ("const void*", "o_in"), ("const float*", "lse_in"), ("const float*", "sinks"),
    ("void*", "o_out"), ("float*", "lse_out"),
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
    ("int", "elem_type"), ("int", "dst_type"),
    ("const float*", "dst_scale"), ("const float*", "dst2_scale"),
)  # fmt: skip

COMBINE_NAME = "fa_decode_combine"
ROPE_NAME = "fa_rope_append"


@dataclass(frozen=True, order=True)
class DecodeKey:
    dtype: str  # "f16" | "bf16": q and out (and K/V unless kv says otherwise)
    head_dim: int  # one of DECODE_BUCKETS
    arch: str = "sm80"  # kernel family (compile.ARCHS): cuda_src/<arch>/flash_decode.cu
    kv: str = ""  # "": K/V in dtype; "e4m3" / "e5m2": float8 K/V (FP8_KV_FORMATS)
    tile: int = 16  # keys per warp tile: 16, or 32 (TILE32_BUCKETS, decode_tile)

    @property
    def name(self) -> str:
        kv = f"_kv{self.kv}" if self.kv else ""
        tile = f"_t{self.tile}" if self.tile != 16 else ""
        return f"{family_prefix('decode', self.arch)}_{self.dtype}_d{self.head_dim}{kv}{tile}"

    def __str__(self) -> str:
        return self.name

    @property
    def stages(self) -> int:
        return decode_facts()[self.head_dim]["kStagesTile32" if self.tile == 32 else "kStages"]

    @property
    def min_blocks(self) -> int:
        """CTAs per SM the kernel is built for (__launch_bounds__; the float8 and 32-key
        kernels' own)."""
        if self.tile == 32:
            return decode_facts()[self.head_dim]["kMinBlocksTile32"]
        return decode_facts()[self.head_dim]["kMinBlocksFp8" if self.kv else "kMinBlocks"]

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of this kernel (:func:`smem_bytes`)."""
        return smem_bytes(self.head_dim, self.kv, self.tile)

    @property
    def v_splits(self) -> int:
        """CTAs per (tile, kv head, sequence), each with head_dim / v_splits V columns."""
        return decode_facts()[self.head_dim]["kVSplits"]

    @property
    def register_budget(self) -> int:
        return min(255, 65536 // (DECODE_THREADS * self.min_blocks) // 8 * 8)


def smem_bytes(bucket: int, kv: str = "", tile: int = 16) -> int:
    """Dynamic shared memory of the decode kernel (``fa::DecodeSmem<bucket, 2 or 1, tile>::kBytes``;
    ``kv``: a float8 format, DecodeKey.kv; ``tile``: DecodeKey.tile)."""
    if tile == 32:
        return decode_facts()[bucket]["kBytesTile32"]
    return decode_facts()[bucket]["kBytesFp8" if kv else "kBytes"]


def decode_tile(m_blocks: int, bucket: int, kv: str = "") -> int:
    """Keys per warp tile of a decode launch with ``m_blocks`` 16-row tiles a kv head: 32 where
    there is one (GQA / MHA), K/V are 16-bit and the bucket has a 32-key kernel
    (:data:`TILE32_BUCKETS`) -- unless $CUPY_FLASHATTN_SM90_DEFINES sets FA_DECODE_TILE32=0 --
    else 16 (see the module docstring for the measurements)."""
    if m_blocks == 1 and bucket in TILE32_BUCKETS and not kv and _switch("FA_DECODE_TILE32", True):
        return 32
    return 16


def decode_bucket(head_dim: int) -> int:
    return bucket_for(head_dim, DECODE_BUCKETS)


def kv_format(kv_dtype, head_dim: int) -> str:
    """DecodeKey.kv of K/V of ``kv_dtype`` (AttentionProblem.kv_float8: None or a 16-bit dtype
    for K/V of the query's type): "", or the float8 format,
    which the kernels read for head dims that are a multiple of 16 up to 256 (whole 16-byte
    float8 chunks; buckets FP8_KV_BUCKETS).  Raises ValueError for other head dims (the front
    end's checks come first)."""
    from .. import fp8

    if kv_dtype is None or not fp8.is_fp8(kv_dtype):
        return ""
    if head_dim % 16 or head_dim > FP8_KV_BUCKETS[-1]:
        raise ValueError(f"float8 K/V need head_dim a multiple of 16 up to {FP8_KV_BUCKETS[-1]}; "
                         f"got {head_dim}")
    return "e4m3" if np.dtype(kv_dtype) == fp8.FLOAT8_E4M3FN else "e5m2"


def decode_shipped_keys() -> list:
    return ([DecodeKey(dt, d) for dt in ("f16", "bf16") for d in DECODE_BUCKETS]
            + [DecodeKey(dt, d, tile=32) for dt in ("f16", "bf16") for d in TILE32_BUCKETS]
            + [DecodeKey(dt, d, kv=kv) for dt in ("f16", "bf16") for d in FP8_KV_BUCKETS
               for kv in FP8_KV_FORMATS])


# -- source ---------------------------------------------------------------------------------

#: One packed argument struct per entry point (packing.py): the decode kernel takes the
#: prefill kernel's FwdParams fields plus its own; combine and rope/append their own fields.
DECODE_ARGS = ArgPack("fa_decode_args", PARAMS + DECODE_EXTRA)
COMBINE_ARGS = ArgPack("fa_combine_args", COMBINE_FIELDS)
ROPE_ARGS = ArgPack("fa_rope_args", ROPE_FIELDS)
_PARAM_NAMES = tuple(n for _, n in PARAMS)
_EXTRA_NAMES = tuple(n for _, n in DECODE_EXTRA)


def _decode_wrapper(key: DecodeKey) -> str:
    elem = "fa::Bf16" if key.dtype == "bf16" else "fa::F16"
    kv = FP8_KV_FORMATS[key.kv] if key.kv else "fa::KvSame"
    # The 16-key kernels keep flash_decode's default kTileN (their text, so their cubins, as
    # before the 32-key kernels).
    tile = f", {key.tile}" if key.tile != 16 else ""
    return f"""
static_assert(fa::kDecodeRows == {DECODE_ROWS} && fa::kDecodeWarps * 32 == {DECODE_THREADS} &&
              fa::DecodeSmem<{key.head_dim}, {kv}::kBytes{tile}>::kBytes == {key.smem_bytes},
              "{key.name}: the host's launch geometry differs from flash_decode.cu");
extern "C" __global__ void __launch_bounds__({DECODE_THREADS}, {key.min_blocks}) {key.name}(
    const fa_decode_args a) {{
  fa::DecodeParams dp;
{DECODE_ARGS.assign("dp.f", names=_PARAM_NAMES)}
{DECODE_ARGS.assign("dp", names=_EXTRA_NAMES)}
  fa::flash_decode<{key.head_dim}, {elem}, {kv}{tile}>(dp);
}}
"""


def decode_source(keys=(), combine: bool = True) -> str:
    """flash_decode.cu (headers inlined) + entry points of ``keys`` (+ the combine kernel)."""
    keys = list(keys)
    archs = {k.arch for k in keys} or {"sm80"}
    if len(archs) != 1:
        raise ValueError(f"one module per kernel family; got keys of {sorted(archs)}")
    from .compile import _tuning_defines

    # Tuning switches ($CUPY_FLASHATTN_SM90_DEFINES, e.g. FA_DECODE_FUSED_COMBINE=0) as #defines
    # in the text itself: CuPy compiles and caches this module by its source text.
    defines = "".join(f"#define {d[2:].replace('=', ' ', 1)}\n" for d in _tuning_defines())
    src = defines + build_source(f"{archs.pop()}/flash_decode.cu") + '#line 1 "<generated decode entry points>"\n'
    if keys:
        src += DECODE_ARGS.c_struct() + "".join(_decode_wrapper(k) for k in keys)
    if combine:
        src += COMBINE_ARGS.c_struct()
        src += COMBINE_ARGS.entry_point(COMBINE_NAME, "CombineParams", "combine_states", 128)
    return src


def rope_source() -> str:
    return (build_source("kv_cache.cu") + '#line 1 "<generated rope entry point>"\n'
            + ROPE_ARGS.c_struct()
            + ROPE_ARGS.entry_point(ROPE_NAME, "RopeAppendParams", "rope_append", 128))


def _decode_kernel(key: DecodeKey):
    return load_function(("decode", key), lambda: decode_source([key], combine=False), key.name,
                         key.smem_bytes)


def _combine_kernel():
    return load_function(("combine",), lambda: decode_source([], combine=True), COMBINE_NAME, 0)


def _rope_kernel():
    return load_function(("rope",), rope_source, ROPE_NAME, 0)


def precompile_decode(dtypes=("f16", "bf16"), buckets=DECODE_BUCKETS) -> list:
    names = []
    for dt in dtypes:
        for b in buckets:
            for key in [DecodeKey(dt, b)] + ([DecodeKey(dt, b, tile=32)] if b in TILE32_BUCKETS else []):
                _decode_kernel(key)
                names.append(key.name)
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
                         max_splits: int = 128, min_keys: int = 256,
                         balance_waves: bool = False, fill_keys: int = 64,
                         merge_rows: int = 0) -> int:
    """flash-attn's rule: no split when the grid already fills ~80% of the SM slots; else the
    fewest splits whose wave efficiency is >= 85% of the best, with >= min_keys keys each.
    ``balance_waves``: no early exit for a full grid -- a grid of 1.3 waves also splits (the
    float8 kernel when it ran 3 CTAs per SM: B = 64, 8 kv heads was 512 CTAs on 396 slots,
    whose second wave ran at a third of the SM slots; H100, stop 32.  At 4 CTAs per SM, D = 128
    since stop 38, the same grid is 0.97 of one wave and stays unsplit).
    Then a grid of fewer CTAs than SMs splits at least until every SM has one CTA, down to
    ``fill_keys`` keys a split (one 16-key tile per warp): such a step's time is the latency
    chain of each CTA (launch, lengths, table, K/V, the split merge), which shorter splits on
    otherwise idle SMs cut.  H100, stop 37 (tools/decode_timeline.py, B = 1, GQA 32/8, D = 128,
    page 16, one step's event time): context 512, 2 splits (flash-attn's rule) 16.6 us, 8
    splits 12.8, 16 splits 13.1; context 4096, 14 splits 20.2, 16 splits 18.9, 32 splits 19.2;
    context 32768, 29 splits 61.2, 16 splits 62.2 (the wave rule's count stays).

    ``merge_rows`` (the real packed rows of one CTA, at most 16; 0: no cap): the splits are then
    capped by :func:`merge_split_cap`, where merging one more split's partials costs more than
    the shorter key loop saves (and a small grid so capped keeps at most one CTA per SM)."""
    fill = 1
    if 0 < ctas < num_sms:
        fill = max(1, min(num_sms // ctas, -(-int(max_seqlen_k) // fill_keys), max_splits))
    splits = max(fill, _wave_splits(ctas, max_seqlen_k, num_sms * ctas_per_sm, max_splits,
                                    min_keys, balance_waves))
    if merge_rows > 0 and splits > 1:
        cap = merge_split_cap(max_seqlen_k, merge_rows)
        if cap < splits:
            # A small grid whose merge cannot afford the wave rule's count stays at one CTA per
            # SM at most (the fill): MQA B = 4 ctx 8192 (8 CTAs, 16 rows each) took 28.5-28.9 us
            # at 16 splits, 31.3 at 12, 33.2 at 24 and 34.4 at the cap's 21 (H100, stop 42).
            splits = min(fill, cap) if fill > 1 else cap
    return splits


#: Key-loop time per key of one CTA over the merge time per split and per row a merging warp
#: takes (us / us), fitted to forced split counts of MQA 32/1 B = 1 (16 rows a CTA, 4 a warp),
#: D = 128 page 16, H100 (stop 42, tools/decode_ring_probe.py, kernel time): ctx 32768 at 16 /
#: 24 / 32 / 48 / 64 / 109 splits 56.3 / 48.9 / 42.8 / 43.2 / 44.6 / 58.2 us, ctx 4096 at 8 / 12
#: / 16 / 24 / 32 / 64 splits 26.8 / 25.0 / 23.2 / 25.9 / 25.5 / 36.0 (cuDNN 18.4 / 11.4).  The
#: loop costs ~0.019 us a key, the fused merge ~0.09 us a split per row each of its warps merges
#: (a row's partials are one warp's loads, rows one after another).  Both scale with the head dim.
_LOOP_OVER_MERGE = 0.019 / 0.09


def merge_split_cap(max_seqlen_k: int, merge_rows: int) -> int:
    """The split count past which the split merge costs more than the key loop saves: the
    minimum of loop + merge time, a L / s + b s, is at s = sqrt(a L / b), with b the merge time
    per split of ceil(merge_rows / 4) rows a warp (the 4 warps of the merging CTA share the
    rows).  MQA 32/1 (16 rows): 15 splits at context 4096, 42 at 32768 (the rules above gave
    64 and 109); GQA 32/8 (4 rows, one a warp): 29 / 83, above what its grid takes."""
    per_warp = -(-int(merge_rows) // 4)
    return max(1, round(math.sqrt(_LOOP_OVER_MERGE * int(max_seqlen_k) / per_warp)))


def _wave_splits(ctas: int, max_seqlen_k: int, slots: int, max_splits: int, min_keys: int,
                 balance_waves: bool) -> int:
    """flash-attn's wave rule of :func:`num_splits_heuristic`."""
    slots = max(1, slots)
    if ctas <= 0 or (ctas >= 0.8 * slots and not balance_waves):
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


def plan(problem: AttentionProblem, len_q_max=None, sm_count=None):
    """(key, m_blocks, num_splits) the launcher would use (host-only, no launch).  With
    ``len_q_max`` (the decode half of a mixed batch) the grid covers queries up to that length
    and there is no split: the combine kernel would rewrite the prefill kernel's rows.
    ``sm_count``: SMs of the GPU the split heuristic fills (default: the current device's)."""
    p = problem
    dt = kernel_dtype_tag(p.q.dtype)
    bucket, kv = decode_bucket(p.head_dim), kv_format(p.kv_float8, p.head_dim)
    g = p.num_heads // p.num_heads_k
    longest = int(p.max_seqlen_q) if len_q_max is None else min(int(p.max_seqlen_q), int(len_q_max))
    m_blocks = max(1, -(-longest * g // DECODE_ROWS))
    key = DecodeKey(dt, bucket, kv=kv, tile=decode_tile(m_blocks, bucket, kv))
    ctas = m_blocks * p.num_heads_k * key.v_splits * int(p.batch_size)
    if len_q_max is not None:
        return key, m_blocks, 1
    if p.num_splits and p.num_splits > 0:
        splits = int(p.num_splits)
    else:
        if sm_count is None:
            import cupy

            sm_count = _sm_count(cupy.cuda.Device().id)
        splits = num_splits_heuristic(ctas, int(p.max_seqlen_k), sm_count, key.min_blocks,
                                      balance_waves=bool(key.kv),
                                      merge_rows=min(DECODE_ROWS, longest * g))
    splits = max(1, min(splits, 256))
    return key, m_blocks, splits


def decode_grid(problem: AttentionProblem, m_blocks: int, splits: int, v_splits: int = 1) -> tuple:
    """(splits x packed 16-row tiles, kv heads x V-splits, batch): one CTA per tile of the
    packed (query, head) rows of one kv head of one sequence, per key split, and per V-split
    chunk of the head dim (384 / 512: blockIdx.y = kv head * v_splits + chunk)."""
    return (splits * m_blocks, problem.num_heads_k * v_splits, int(problem.batch_size))


def _switch(name: str, default: bool) -> bool:
    """A decode tuning switch as $CUPY_FLASHATTN_SM90_DEFINES sets it (``NAME=0`` off, any other
    value on; the last setting wins, as with the #defines decode_source writes), else
    ``default``."""
    from .compile import _tuning_defines

    on = default
    for define in _tuning_defines():
        n, _, value = define[2:].partition("=")
        if n.strip() == name:
            on = value.strip() != "0"
    return on


def _fused_combine_built() -> bool:
    """Whether the decode kernels are built with flash_decode.cu's FA_DECODE_FUSED_COMBINE: on
    by default (an H100 run, 2026-12-06: a B = 1 split decode step took 28.8 us instead of
    38.2 us with the combine kernel at context 4096, 79.9 vs 101.4 us at 32768), off only where
    $CUPY_FLASHATTN_SM90_DEFINES sets it to 0 (the A/B baseline)."""
    return _switch("FA_DECODE_FUSED_COMBINE", True)


def fused_combine_applies(problem: AttentionProblem, splits: int, v_splits: int,
                          len_q_max: int, direct: bool) -> bool:
    """Whether a decode launch merges its split partials in its last split CTAs instead of the
    combine kernel (flash_decode.cu FA_DECODE_FUSED_COMBINE, a tuning switch, on unless
    $CUPY_FLASHATTN_SM90_DEFINES sets it to 0: :func:`_fused_combine_built`): split-KV, the
    kernel writing the caller's arrays directly, no V-split, and every output row covered by a
    sequence this launch serves -- dense queries (varlen rows that no sequence covers are
    written as empty by the combine kernel only) and not a mixed batch."""
    return (_fused_combine_built() and splits > 1 and v_splits == 1 and direct
            and problem.cu_seqlens_q is None and len_q_max == INT_MAX)


class DecodePlan:
    """Host-side decisions of one decode launch (kernel, split count, grid, packed arguments),
    made once per problem shape: :meth:`run` then only allocates the split workspace, rebinds
    the pointers of the problem's arrays and launches (no host sync, CUDA-graph safe).  When
    the launch needs adapted operands (:attr:`Operands.direct` is False) every run rebuilds
    them."""

    def __init__(self, problem: AttentionProblem, len_q_max=None):
        p = problem
        self.key, self.m_blocks, self.splits = plan(p, len_q_max)
        self.compute_dtype = compute_dtype(self.key.dtype)
        self.kernel = _decode_kernel(self.key)
        self.smem = self.key.smem_bytes
        self.len_q_max = INT_MAX if len_q_max is None else int(len_q_max)
        self.grid = decode_grid(p, self.m_blocks, self.splits, self.key.v_splits)
        self.empty = not (p.total_q > 0 and p.batch_size > 0 and p.max_seqlen_q > 0)
        d8 = -(-p.head_dim // 8) * 8
        H, total_q = p.num_heads, p.total_q
        self.oacc_shape = (self.splits, total_q, H, d8)
        self.lacc_shape = (self.splits, H, total_q)
        # Rows that no sequence covers (varlen) must read as empty in the combine.
        self.lacc_fill = p.cu_seqlens_q is not None
        ops = Operands(p, self.compute_dtype)
        self.direct = ops.direct
        self._partials = SplitPartials(self.oacc_shape, self.lacc_shape)
        self.launch = self.combine_launch = None
        self.fused = fused_combine_applies(p, self.splits, self.key.v_splits, self.len_q_max,
                                           self.direct)
        # The fused combine's per-tile counters, one set per CUDA stream, zeroed once (the
        # combining CTA resets its own, so calls and graph replays find them at 0).
        self._split_counters = PerStream(self._new_split_counters)
        if self.direct and not self.empty:
            self.launch = Launch(self.kernel, self.grid, (DECODE_THREADS,), self.smem,
                                 DECODE_ARGS, DECODE_ARGS.new(self._values(ops)))
            pairs = total_q * H
            if self.splits > 1 and pairs > 0 and not self.fused:
                self.combine_launch = Launch(
                    _combine_kernel(), (-(-pairs // COMBINE_PAIRS_PER_CTA),), (COMBINE_THREADS,),
                    0, COMBINE_ARGS,
                    COMBINE_ARGS.new(self._combine_values(ops.o, ops.lse, sinks=p.sinks)))

    def _values(self, ops, oacc=None, lacc=None) -> dict:
        return {**ops.fwd_values(len_q_max=self.len_q_max), "oaccum": oacc, "lse_accum": lacc,
                "num_splits": self.splits, "m_blocks": self.m_blocks,
                "paged": 1 if ops.problem.paged else 0, "split_counters": None,
                **self._scales(ops.problem)}

    def _new_split_counters(self):
        import cupy

        _, y, b = self.grid
        return cupy.zeros(b * y * self.m_blocks, dtype=np.int32)

    def _scales(self, p) -> dict:
        """A float8 K/V's dequantization scales: (Hk,) float32 CuPy arrays (None: 1)."""
        if not self.key.kv:
            return {}
        return {"k_scale": p.k_scale, "v_scale": p.v_scale}

    def _combine_values(self, o, lse, oacc=None, lacc=None, sinks=None) -> dict:
        """The combine of this plan's split partials (the call's sinks join it: the partials
        leave them out)."""
        _, total_q, H, d8 = self.oacc_shape
        return combine_values(
            oacc, lacc, o, lse, sinks=sinks, splits=self.splits, rows=total_q, heads=H, head_dim=d8,
            o_split=total_q * H * d8, o_row=H * d8, o_head=d8,
            lse_split=H * total_q, lse_rows=total_q, lse_batch=0, lse_head=total_q,
            out_row=_es(o, 0), out_head=_es(o, 1), lse_out_batch=0,
            lse_out_head=lse.strides[0] // 4, in_type=0, out_type=_elem_code(o.dtype),
        )

    def run(self, p: AttentionProblem) -> None:
        if self.empty:
            return
        oacc = lacc = None
        if self.splits > 1:
            oacc, lacc = self._partials.get()
            if self.lacc_fill:
                lacc.fill(-np.inf)
        if self.direct:
            pointers = problem_pointers(p)
            pointers["oaccum"], pointers["lse_accum"] = oacc, lacc
            if self.fused:
                pointers["split_counters"] = self._split_counters.get()
            if self.key.kv:  # float8 K/V: the call's scales too (nothing on the 16-bit path)
                pointers.update(self._scales(p))
            self.launch(pointers)
            if self.combine_launch is not None:
                self.combine_launch({"o_in": oacc, "lse_in": lacc, "o_out": p.out,
                                     "lse_out": p.softmax_lse, "sinks": p.sinks})
            return
        ops = Operands(p, self.compute_dtype)
        args = DECODE_ARGS.new(self._values(ops, oacc, lacc))
        launch_packed(self.kernel, self.grid, (DECODE_THREADS,), args, self.smem)
        if self.splits > 1:
            cargs = COMBINE_ARGS.new(self._combine_values(ops.o, ops.lse, oacc, lacc, p.sinks))
            _launch_combine(cargs, self.oacc_shape[1] * self.oacc_shape[2])
        ops.finish()


def run_decode(problem: AttentionProblem, len_q_max=None) -> None:
    """Fill ``problem.out`` / ``problem.softmax_lse`` with the decode kernel (no host sync).
    With ``len_q_max``, only sequences of at most that many queries are served (mixed batch)."""
    DecodePlan(problem, len_q_max).run(problem)


def combine_values(o_in, lse_in, o_out, lse_out, *, splits, rows, heads, head_dim, o_split, o_row,
                   o_head, lse_split, lse_rows, lse_batch, lse_head, out_row, out_head,
                   lse_out_batch, lse_out_head, in_type, out_type, sinks=None) -> dict:
    """The combine kernel's ``fa::CombineParams`` fields (COMBINE_FIELDS names) -> values.
    ``sinks``: (heads,) float32 attention sinks of a split call (None: merge_attention_states)."""
    return dict(
        o_in=o_in, lse_in=lse_in, sinks=sinks, o_out=o_out, lse_out=lse_out,
        o_split_stride=o_split, o_row_stride=o_row, o_head_stride=o_head,
        lse_split_stride=lse_split, lse_batch_stride=lse_batch, lse_head_stride=lse_head,
        out_row_stride=out_row, out_head_stride=out_head,
        lse_out_batch_stride=lse_out_batch, lse_out_head_stride=lse_out_head,
        lse_rows=max(1, lse_rows), rows=rows, heads=heads, head_dim=head_dim,
        num_splits=splits, in_type=in_type, out_type=out_type,
    )


#: Split partials up to this size are kept per stream by a decode plan (bytes); larger ones
#: belong to long-context or large-batch calls whose kernels dwarf an allocation.
SPLIT_WORKSPACE_KEEP_BYTES = 16 << 20


class SplitPartials:
    """A split-KV plan's float32 partials (oaccum, lse_accum) for a call on the current CUDA
    stream (the mma.sync decode plan's and the swapped sm90 decode plan's): made once per
    stream and reused by every call of the plan when they are at most
    SPLIT_WORKSPACE_KEEP_BYTES (two cupy.empty calls were ~9 us of a ~60 us decode call on the
    H200 machine; per_stream.py says why reuse is safe), made per call when larger."""

    def __init__(self, oacc_shape: tuple, lacc_shape: tuple):
        self.oacc_shape, self.lacc_shape = tuple(oacc_shape), tuple(lacc_shape)
        nbytes = 4 * (int(np.prod(self.oacc_shape)) + int(np.prod(self.lacc_shape)))
        self._kept = PerStream(self._new) if nbytes <= SPLIT_WORKSPACE_KEEP_BYTES else None

    def _new(self):
        import cupy

        return (cupy.empty(self.oacc_shape, dtype=np.float32),
                cupy.empty(self.lacc_shape, dtype=np.float32))

    def get(self) -> tuple:
        return self._kept.get() if self._kept is not None else self._new()

#: The combine kernel's geometry: one warp per (row, head) pair, 4 pairs per 128-thread CTA.
COMBINE_THREADS, COMBINE_PAIRS_PER_CTA = 128, 4


def _launch_combine(args, pairs: int) -> None:
    if pairs > 0:
        launch_packed(_combine_kernel(), (-(-pairs // COMBINE_PAIRS_PER_CTA),), (COMBINE_THREADS,),
                      args)


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
    values = combine_values(
        oa, la, out, lse, splits=2, rows=rows, heads=H, head_dim=D,
        o_split=o_split // isz, o_row=H * D, o_head=D,
        lse_split=l_split // 4, lse_rows=lse_rows, lse_batch=lse_batch, lse_head=lse_head,
        out_row=H * D, out_head=D, lse_out_batch=lse_batch,
        lse_out_head=lse_head, in_type=_elem_code(oa.dtype), out_type=_elem_code(oa.dtype),
    )
    _launch_combine(COMBINE_ARGS.new(values), rows * H)
    return out, lse


# -- rotary + append (kv_cache.cu) -------------------------------------------------------


#: Pointer fields of the rope/append kernel, rebound per call by a replayed plan.
ROPE_POINTERS = ("src", "dst", "src2", "dst2", "seqlens", "batch_idx", "table", "cos", "sin",
                 "positions", "dst_scale", "dst2_scale")

#: kv_cache.cu's dst_type of a float8 destination (0: the source's type, no quantization).
_FP8_DST_TYPE = {"e4m3": 4, "e5m2": 5}


def _dst_type(dst_format) -> int:
    """RopeAppendParams.dst_type: 0 for a dst of the source's type (``dst_format`` None), else
    the code of its float8 format (dst then holds uint8 bytes)."""
    from .. import fp8

    if dst_format is None:
        return 0
    return _FP8_DST_TYPE["e4m3" if np.dtype(dst_format) == fp8.FLOAT8_E4M3FN else "e5m2"]


class RopePlan:
    """One ``fa_rope_append`` launch for arrays of fixed shapes/strides/dtypes: rotate ``src``
    (B, S, H, D) (when cos/sin are given) into ``dst`` -- a dense (B, S, H, D) array (mode 0),
    a contiguous cache (B_cache, S_cache, H, D) (mode 1) or a page pool (num_blocks, P, H, D)
    (mode 2) -- and copy ``src2`` into ``dst2`` with the same mapping.  Out-of-range
    destinations are dropped on the device.  With ``dst_format`` (a float8 dtype; dst / dst2
    then hold its uint8 bytes) they receive ``fp8(clip(x / scale[h]))`` with ``dst_scale`` /
    ``dst2_scale`` ((H,) float32).  Every array must have a contiguous last dim,
    ``seqlens``/``batch_idx``/``table``/``positions`` int32 and ``sin`` the dtype of ``cos``
    (the caller adapts them: :func:`rope_append`)."""

    def __init__(self, src, dst, *, src2=None, dst2=None, mode=0, seqlens=None, batch_idx=None,
                 table=None, page_size=0, cos=None, sin=None, interleaved=False, positions=None,
                 pos_per_token=True, dst_format=None, dst_scale=None, dst2_scale=None):
        B, S, H, D = (int(x) for x in src.shape)
        self.empty = B * S * H == 0
        rot_half = seqlen_ro = cs_type = c_stride = s_stride = 0
        if cos is not None:
            rot_half, seqlen_ro, cs_type = int(cos.shape[1]), int(cos.shape[0]), _elem_code(cos.dtype)
            c_stride, s_stride = _es(cos, 0), _es(sin, 0)
        pos_b = pos_s = 0
        if positions is not None:
            pos_b, pos_s = _es(positions, 0), _es(positions, 1)
        t_stride, t_width = (_es(table, 0), int(table.shape[1])) if table is not None else (0, 0)
        s2 = (_es(src2, 0), _es(src2, 1), _es(src2, 2)) if src2 is not None else (0, 0, 0)
        self.template = ROPE_ARGS.new(dict(
            src=src, dst=dst, src2=src2, dst2=dst2,
            src_b=_es(src, 0), src_s=_es(src, 1), src_h=_es(src, 2),
            src2_b=s2[0], src2_s=s2[1], src2_h=s2[2],
            dst_b=_es(dst, 0), dst_s=_es(dst, 1), dst_h=_es(dst, 2),
            seqlens=seqlens, batch_idx=batch_idx, table=table,
            table_stride=t_stride, table_width=t_width, page_size=page_size,
            dst_rows=dst.shape[0], dst_capacity=dst.shape[1], mode=mode,
            cos=cos, sin=sin, cos_row_stride=c_stride, sin_row_stride=s_stride,
            cs_type=cs_type, seqlen_ro=seqlen_ro, rot_half=rot_half,
            interleaved=1 if interleaved else 0,
            positions=positions, pos_b=pos_b, pos_s=pos_s, pos_per_token=1 if pos_per_token else 0,
            batch=B, seqlen=S, heads=H, head_dim=D, elem_type=_elem_code(src.dtype),
            dst_type=_dst_type(dst_format), dst_scale=dst_scale, dst2_scale=dst2_scale,
        ))  # fmt: skip
        rows = B * S * H
        self.grid = (-(-rows // 4), 2 if src2 is not None else 1)
        self.launch = None if self.empty else Launch(_rope_kernel(), self.grid, (32, 4), 0,
                                                     ROPE_ARGS, self.template)

    def run(self, **arrays) -> None:
        """Launch on ``arrays`` (ROPE_POINTERS names; the ones left out are null)."""
        if self.launch is not None:
            self.launch({n: arrays.get(n) for n in ROPE_POINTERS})


def rope_adapt(src, *, cos=None, sin=None, positions=None):
    """The adaptations :class:`RopePlan` needs (contiguous last dim of cos/sin, sin in cos's
    dtype, int32 positions); returns ``(cos, sin, positions)``.  Each costs a copy, only when
    needed."""
    import cupy

    if cos is not None:
        if cos.strides[-1] != cos.itemsize:
            cos = cupy.ascontiguousarray(cos)
        if sin.strides[-1] != sin.itemsize or sin.dtype != cos.dtype:
            sin = cupy.ascontiguousarray(sin.astype(cos.dtype, copy=False))
    if positions is not None and np.dtype(positions.dtype) != np.int32:
        positions = positions.astype(np.int32)
    return cos, sin, positions


def rope_append(src, dst, *, src2=None, dst2=None, mode=0, seqlens=None, batch_idx=None,
                table=None, page_size=0, cos=None, sin=None, interleaved=False, positions=None,
                pos_per_token=True, plans=None, slot=None, dst_format=None, dst_scale=None,
                dst2_scale=None):
    """``fa_rope_append`` launch (see :class:`RopePlan`), adapting cos/sin/positions.  With
    ``plans`` (a dict owned by a cached call of fixed signature) the plan is made once under
    ``slot`` and replayed afterwards."""
    cos, sin, positions = rope_adapt(src, cos=cos, sin=sin, positions=positions)
    arrays = dict(src=src, dst=dst, src2=src2, dst2=dst2, seqlens=seqlens, batch_idx=batch_idx,
                  table=table, cos=cos, sin=sin, positions=positions, dst_scale=dst_scale,
                  dst2_scale=dst2_scale)
    plan = plans.get(slot) if plans is not None else None
    if plan is None:
        plan = RopePlan(page_size=page_size, mode=mode, interleaved=interleaved,
                        pos_per_token=pos_per_token, dst_format=dst_format, **arrays)
        if plans is not None:
            plans[slot] = plan
    plan.run(**arrays)
