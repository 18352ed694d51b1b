"""Kernel instantiations: key -> flat ``extern "C"`` entry point -> compiled function.

Every instantiation of the templated forward kernel is named by a :class:`KernelKey` (dtype,
head-dim bucket, feature flags) and exposed under a flat C name such as
``fa_fwd_bf16_d128_local_paged``.  The wrapper that turns the flat argument list into a
``fa::FwdParams`` and calls the template is generated here as source text and appended to the
translation unit (no ``name_expressions``: flat names disk-cache on every CuPy version).

Compiled modules are cached twice: in memory (``functools.cache``, one ``RawModule`` per key)
and on disk by CuPy under ``$CUPY_CACHE_DIR`` (default ``~/.cupy/kernel_cache``), keyed by the
full source text -- headers inlined, see :mod:`.source` -- plus options, NVRTC version and
architecture.  CuPy appends ``-arch=sm_<cc>`` of the current device itself (and makes it part of
that key), so it is not repeated in our options.  Point ``CUPY_CACHE_DIR`` at a persistent
directory to keep compiled kernels across containers; ``precompile(...)`` builds a chosen set
ahead of time so the first call of a run does not pay the ~seconds of NVRTC.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
from dataclasses import dataclass
from typing import Iterable, Sequence, Union

from .packing import ArgPack
from .tma import TmaArgPack
from .source import build_source, kernel_cache_root

__all__ = [
    "KernelKey",
    "Traits",
    "HEAD_DIM_BUCKETS",
    "DTYPES",
    "PARAMS",
    "traits",
    "key_traits",
    "override_traits",
    "shipped_keys",
    "get_kernel",
    "precompile",
    "compile_for_arch",
    "parse_ptxas_log",
    "NVRTC_OPTIONS",
]

log = logging.getLogger("cupy_flashattn")

HEAD_DIM_BUCKETS = (32, 64, 96, 128, 160, 192, 256, 384, 512)
#: The Hopper family's buckets: whole 64-column (128-byte) swizzle blocks (sm90/wgmma.cuh).
SM90_HEAD_DIM_BUCKETS = (64, 128, 192, 256)
DTYPES = ("f16", "bf16")
#: Element types of the float32 / float64 prefill (``sm80/flash_fwd_precise.cu``, mma.sync on any
#: GPU >= 8.0): "f32" float32 on 3xTF32 (float32 accuracy, the default for float32 inputs),
#: "tf32" float32 on plain TF32 (``set_float32_precision("high")``), "f64" float64 on DMMA.
PRECISE_DTYPES = ("f32", "tf32", "f64")
#: Head-dim buckets of the precise kernels: float64 stops at 128 (its O accumulators, D
#: doubles per thread, would spill above; sm80/kernel_traits.cuh).
PRECISE_HEAD_DIM_BUCKETS = {"f32": (32, 64, 96, 128, 160, 192, 256), "tf32": (32, 64, 96, 128, 160, 192, 256),
                            "f64": (32, 64, 96, 128)}
#: Head-dim buckets of the Hopper float32 kernel ("f32" on sm90: float32 as float16 hi / lo planes,
#: sm90/flash_fwd.cu; dense and varlen K/V).  Its Q / K / V planes take twice a 16-bit tile's
#: shared memory, so D = 128 already fills 192 KB with 64-key tiles (sm90/kernel_traits.cuh);
#: larger head dims, paged K/V, float64 and TF32 run on the sm80 precise kernel.
SM90_F32_HEAD_DIM_BUCKETS = (64, 128)
#: The C++ (element type, mma policy) of each precise element type.
_PRECISE_CXX = {"f32": ("float", "fa::Tf32<3>"), "tf32": ("float", "fa::Tf32<1>"),
                "f64": ("double", "fa::F64")}
NVRTC_OPTIONS = ("--std=c++17",)

# The flat kernel arguments, in fa::FwdParams field order: (C type, name).  launch.py packs
# its values in exactly this order with matching NumPy scalar types.
PARAMS = (
    ("const fa::u16*", "q"),
    ("const fa::u16*", "k"),
    ("const fa::u16*", "v"),
    ("fa::u16*", "o"),
    ("float*", "lse"),
    ("const int*", "cu_seqlens_q"),
    ("const int*", "cu_seqlens_k"),
    ("const int*", "seqused_k"),
    ("const int*", "cache_batch_idx"),
    ("const int*", "leftpad_k"),
    ("const int*", "block_table"),
    ("const float*", "alibi_slopes"),
    ("const float*", "sinks"),
    ("const int*", "prefix_ranges"),
    ("long long", "q_row_stride"),
    ("long long", "q_head_stride"),
    ("long long", "k_row_stride"),
    ("long long", "k_head_stride"),
    ("long long", "k_page_stride"),
    ("long long", "o_row_stride"),
    ("long long", "o_head_stride"),
    ("long long", "lse_head_stride"),
    ("int", "alibi_batch_stride"),
    ("int", "alibi_head_stride"),
    ("int", "table_batch_stride"),
    ("int", "prefix_ranges_count"),
    ("int", "prefix_ranges_batch_stride"),
    ("int", "batch"),
    ("int", "seqlen_q"),
    ("int", "seqlen_k"),
    ("int", "total_q"),
    ("int", "k_rows"),
    ("int", "num_heads"),
    ("int", "h_per_kv"),
    ("int", "head_dim"),
    ("int", "page_size"),
    ("int", "max_blocks_per_seq"),
    ("int", "window_left"),
    ("int", "window_right"),
    ("float", "softmax_scale"),
    ("float", "softcap"),
    ("int", "len_q_min"),
    ("int", "len_q_max"),
    ("int", "seqused_k_add"),
    ("int", "tiles_m"),
)


#: Kernel families, named by the ``cuda_src/`` directory that holds their kernels.  "sm80":
#: mma.sync m16n8k16 + ldmatrix + cp.async, which runs on every GPU of compute capability >= 8.0
#: (sm_90 included).  "sm90": the Hopper prefill path (wgmma, warp specialization, sm_90a
#: code that only a compute capability 9.0 device runs).
ARCHS = ("sm80", "sm90")

#: NVRTC target of each family's modules.  sm80 modules are built by CuPy for the current
#: device; sm90 modules are built for sm_90a (wgmma / setmaxnreg exist only there) by
#: :func:`_sm90a_module`.
NVRTC_TARGET = {"sm80": None, "sm90": "90a"}


def head_dim_buckets(arch: str = "sm80", dtype: str = "bf16") -> tuple:
    if dtype in PRECISE_DTYPES:
        return SM90_F32_HEAD_DIM_BUCKETS if arch == "sm90" else PRECISE_HEAD_DIM_BUCKETS[dtype]
    return SM90_HEAD_DIM_BUCKETS if arch == "sm90" else HEAD_DIM_BUCKETS


def is_precise(dtype_tag: str) -> bool:
    """True for the element types of the float32 / float64 kernel (PRECISE_DTYPES)."""
    return dtype_tag in PRECISE_DTYPES


#: Instantiations the sm90 family does not ship, as (head_dim, transform, paged): the dispatch
#: sends these problems to sm80.  Empty today (every one compiles spill-free); the place to
#: park a combination that stops doing so.
SM90_UNSHIPPED = frozenset()
#: Split-KV instantiations (KernelKey.split) not shipped, as (head_dim, transform, paged):
#: D = 256 with softcap over a paged cache spills 160 bytes in its consumer (ptxas, sm_90a);
#: those decode steps stay on the mma.sync decode kernel (decode_sm90.py).
SM90_SPLIT_UNSHIPPED = frozenset({(256, True, True)})
#: sm90 buckets with a "wide" kernel (KernelKey.wide): the key tile FlashAttention-3 uses when no
#: causal / local window bands the tiles -- 176 keys at D = 128 against 128 with a window
#: (sm90/kernel_traits.cuh has the measurement).  Dense or varlen K/V, no softcap / ALiBi.
SM90_WIDE_BUCKETS = (128,)
#: ... and only for keys this long (max_seqlen_k): measured against 128 x 128 (H100, bf16,
#: benchmarks/NOTES.md stop 33) equal at S = 2k, +1% at 4k, +6% at 8k; a short sequence pays
#: for the padding of its last 176-key tile and has few tiles to pipeline (at S = 512 the 128-key
#: paged kernels outran the wide dense one in the same run).
SM90_WIDE_MIN_KEYS = 4096


def family_prefix(kind: str, arch: str) -> str:
    """Entry-point name prefix: ``fa_fwd`` / ``fa_decode`` for sm80 (its names predate the
    field; disk caches and tools know them), ``fa_fwd_<arch>`` for any other family."""
    return f"fa_{kind}" if arch == "sm80" else f"fa_{kind}_{arch}"


@dataclass(frozen=True, order=True)
class KernelKey:
    """One instantiation.

    transform: softcap and/or ALiBi (both switched inside by run-time values, so one kernel
    serves either or both); paged: K/V through a block table.  Causal and sliding windows
    are run-time arguments of every kernel (they cost nothing on tiles they do not touch).
    arch: the kernel family (ARCHS), i.e. which ``cuda_src/<arch>/flash_fwd.cu`` it is built from.
    wide: the sm90 kernel with the wider key tile of SM90_WIDE_BUCKETS, for problems without a
    causal / local window and with keys of at least SM90_WIDE_MIN_KEYS (launch.select_kernel;
    any problem is still correct on it).
    split: the sm90 kernel's split-KV variant (flash_fwd.cu SplitOut: float32 partials for the
    decode combine kernel), which ``decode_sm90.py`` runs for MQA decode steps."""

    dtype: str  # "f16" | "bf16" | PRECISE_DTYPES (sm80; "f32" also sm90, dense / varlen)
    head_dim: int  # bucket, one of HEAD_DIM_BUCKETS
    transform: bool = False
    paged: bool = False
    arch: str = "sm80"
    wide: bool = False
    split: bool = False

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"KernelKey.arch must be one of {ARCHS}, got {self.arch!r}")
        if self.dtype not in DTYPES + PRECISE_DTYPES:
            raise ValueError(f"KernelKey.dtype must be one of {DTYPES + PRECISE_DTYPES}, got {self.dtype!r}")
        if self.dtype in PRECISE_DTYPES and self.arch != "sm80" and (self.dtype != "f32" or self.paged):
            raise ValueError(f"KernelKey: the {self.dtype} kernels are sm80 (mma.sync) only, except "
                             f"dense / varlen float32 on sm90, got {self!r}")
        buckets = head_dim_buckets(self.arch, self.dtype)
        if self.head_dim not in buckets:
            raise ValueError(
                f"KernelKey.head_dim must be one of {buckets} for {self.arch}, got {self.head_dim!r}"
            )
        if self.wide and (self.arch != "sm90" or self.paged or self.transform
                          or self.head_dim not in SM90_WIDE_BUCKETS):
            raise ValueError(f"KernelKey.wide: only sm90 dense kernels without transform of "
                             f"buckets {SM90_WIDE_BUCKETS}, got {self!r}")
        if self.split and (self.arch != "sm90" or self.wide or self.dtype not in DTYPES):
            raise ValueError(f"KernelKey.split: only 16-bit sm90 kernels of the 128-key tile, "
                             f"got {self!r}")

    @property
    def name(self) -> str:
        flags = [f for f in ("transform", "paged", "wide", "split") if getattr(self, f)]
        return "_".join([family_prefix("fwd", self.arch), self.dtype, f"d{self.head_dim}", *flags])

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Traits:
    """Launch-relevant numbers of ``fa::FwdTraits<D>`` (kernel_traits.cuh, evaluated by the
    compiler: ``device_facts.py``), or of a tuning override's ``fa::FwdTraitsBase<...>``."""

    head_dim: int
    block_m: int
    block_n: int
    num_warps: int
    min_blocks_per_sm: int
    q_in_regs: int = 0
    stages: int = 2
    smem: int = 0  # kSmemBytes when known; else asked of the compiler (smem_bytes)
    v_splits: int = 1  # CTAs per (query tile, head), each with head_dim / v_splits V columns

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps

    @property
    def smem_bytes(self) -> int:
        """``FwdTraitsBase::kSmemBytes``: the dynamic shared memory of a launch."""
        if self.smem:
            return self.smem
        from .device_facts import traits_facts

        return traits_facts(self.cxx)["kSmemBytes"]

    @property
    def cxx(self) -> str:
        """The ``fa::FwdTraitsBase<...>`` these numbers describe."""
        return (f"fa::FwdTraitsBase<{self.head_dim}, {self.block_m}, {self.block_n}, "
                f"{self.num_warps}, {self.min_blocks_per_sm}, {self.q_in_regs}, {self.v_splits}>")

    @property
    def register_budget(self) -> int:
        """Registers per thread that still allow ``min_blocks_per_sm`` CTAs on a 64K-register SM."""
        per_thread = 65536 // (self.num_threads * self.min_blocks_per_sm)
        return min(255, per_thread // 8 * 8)


# Tuning-only tile overrides (head-dim bucket -> Traits): see override_traits().  The
# environment variable CUPY_FLASHATTN_TRAITS="128=128,64,8,1,0;64=..." (bucket=block_m,
# block_n, warps, min CTAs per SM[, Q in registers]) sets them at import (device tuning runs).
_OVERRIDES: dict = {}


def _env_overrides(text: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(";"))):
        d, nums = item.split("=")
        out[int(d)] = Traits(int(d), *(int(x) for x in nums.split(",")))
    return out


def _trait_table(arch: str = "sm80") -> dict:
    """:func:`_trait_table_for` under the current tuning switches."""
    return _trait_table_for(arch, tuple(_tuning_defines()))


@functools.cache
def _trait_table_for(arch: str, tuning: tuple) -> dict:
    """bucket -> Traits of ``fa::FwdTraits<bucket>`` (sm80), ``fa::Sm90FwdTraits<bucket>``
    (sm90) or ``fa::PreciseFwdTraits<float|double, bucket>`` ("f32" / "f64"), as the compiler
    evaluates them."""
    from .device_facts import prefill_facts

    table = {}
    for d, f in prefill_facts(arch).items():
        assert f["kHeadDim"] == d, f"{arch}/kernel_traits.cuh: traits<{d}> has kHeadDim {f['kHeadDim']}"
        table[d] = Traits(d, f["kBlockM"], f["kBlockN"], f["kNWarps"], f["kMinBlocksPerSm"],
                          f["kQInRegs"], f["kStages"], f["kSmemBytes"], f["kVSplits"])
    return table


def traits(head_dim_bucket: int, arch: str = "sm80", dtype: str = "bf16", paged: bool = False,
           wide: bool = False) -> Traits:
    """The tile numbers of one kernel family's bucket (sm90: the paged and the wide kernels have
    their own, sm90/kernel_traits.cuh); :func:`key_traits` for a :class:`KernelKey`."""
    if dtype in PRECISE_DTYPES:
        table = "sm90f32" if arch == "sm90" else "f64" if dtype == "f64" else "f32"
        return _trait_table(table)[head_dim_bucket]
    if arch == "sm90":  # tuning overrides are an sm80 (FwdTraitsBase) facility
        return _trait_table("sm90p" if paged else "sm90w" if wide else "sm90")[head_dim_bucket]
    return _OVERRIDES.get(head_dim_bucket) or _trait_table()[head_dim_bucket]


def key_traits(key: "KernelKey") -> Traits:
    """The tile numbers of the kernel ``key`` names."""
    return traits(key.head_dim, key.arch, key.dtype, paged=key.paged, wide=key.wide)


_OVERRIDES.update(_env_overrides(os.environ.get("CUPY_FLASHATTN_TRAITS", "")))


def override_traits(head_dim_bucket: int, tr: "Traits | None") -> None:
    """Benchmark/tuning hook: run bucket ``head_dim_bucket`` with other tile numbers than
    kernel_traits.cuh (``None`` restores the table).  The generated entry point then
    instantiates the kernel with ``tr.cxx``; compiled kernels are cached per source text, so
    switching back and forth does not recompile."""
    if tr is None:
        _OVERRIDES.pop(head_dim_bucket, None)
    else:
        assert tr.head_dim == head_dim_bucket
        _OVERRIDES[head_dim_bucket] = tr


def shipped_keys(arch: str = "sm80") -> list:
    """Every instantiation of one family the launcher may select (what CI compiles)."""
    keys = [
        KernelKey(dt, d, tf, pg, arch)
        for dt, d, tf, pg in itertools.product(DTYPES, head_dim_buckets(arch), (False, True),
                                               (False, True))
        if arch != "sm90" or (d, tf, pg) not in SM90_UNSHIPPED
    ]
    if arch == "sm90":
        keys += [KernelKey(dt, d, arch="sm90", wide=True) for dt in DTYPES for d in SM90_WIDE_BUCKETS]
        keys += [KernelKey(dt, d, tf, pg, "sm90", split=True)
                 for dt, d, tf, pg in itertools.product(DTYPES, SM90_HEAD_DIM_BUCKETS,
                                                        (False, True), (False, True))
                 if (d, tf, pg) not in SM90_SPLIT_UNSHIPPED]
    return keys


def shipped_sm90_f32_keys() -> list:
    """Every instantiation of the Hopper float32 kernel (sm90/flash_fwd.cu with float16 planes;
    its own module: launch.py never mixes it with the 16-bit sm90 keys)."""
    return [KernelKey("f32", d, tf, arch="sm90") for d in SM90_F32_HEAD_DIM_BUCKETS
            for tf in (False, True)]


def shipped_precise_keys(dtypes: Sequence[str] = PRECISE_DTYPES) -> list:
    """Every instantiation of the float32 / float64 kernel (a module of its own source)."""
    return [KernelKey(dt, d, tf, pg) for dt in dtypes for d in PRECISE_HEAD_DIM_BUCKETS[dt]
            for tf in (False, True) for pg in (False, True)]


#: The forward entry points' one argument (see packing.py): PARAMS as a struct.
FWD_ARGS = ArgPack("fa_fwd_args", PARAMS)
#: The sm90 entry points' own fields after PARAMS: the dynamic tile schedule's counter (two
#: int32 in global memory, zero at launch; null for static rounds -- sm90/tile_scheduler.cuh).
SM90_EXTRA = (("int*", "tile_counter"),)
#: The sm90 entry points' argument: the TMA maps of q, k, v, then PARAMS + SM90_EXTRA (tma.py).
SM90_ARGS = TmaArgPack("fa_fwd_sm90_args", ArgPack("fa_fwd_sm90_base", PARAMS + SM90_EXTRA))
#: The split-KV sm90 entry points' fields after SM90_EXTRA (flash_fwd.cu SplitOut).
SM90_SPLIT_EXTRA = (("float*", "oaccum"), ("float*", "lse_accum"), ("int", "num_splits"))
SM90_SPLIT_ARGS = TmaArgPack("fa_fwd_sm90_split_args",
                             ArgPack("fa_fwd_sm90_split_base", PARAMS + SM90_EXTRA + SM90_SPLIT_EXTRA))
#: The Hopper float32 entry points' fields after SM90_EXTRA: the planes' scales (f32_planes.py).
SM90_F32_EXTRA = (("const float*", "q_rscale"), ("const float*", "kv_rscale"))
SM90_F32_ARGS = TmaArgPack("fa_fwd_sm90_f32_args",
                           ArgPack("fa_fwd_sm90_f32_base", PARAMS + SM90_EXTRA + SM90_F32_EXTRA))
#: The precise entry points' argument: FWD_ARGS plus the float64 scale and softcap
#: (``fa::PreciseScalars``; FwdParams holds them rounded to float32).
PRECISE_SCALARS = (("double", "softmax_scale_f64"), ("double", "softcap_f64"))
PRECISE_ARGS = ArgPack("fa_fwd_precise_args", PARAMS + PRECISE_SCALARS)


def _wrapper(key: KernelKey) -> str:
    if key.arch == "sm90":
        return _wrapper_sm90(key)
    b = lambda x: "true" if x else "false"  # noqa: E731
    flags = f"{b(key.transform)}, {b(key.paged)}"
    if key.dtype in PRECISE_DTYPES:
        elem, mma = _PRECISE_CXX[key.dtype]
        tr_cxx = f"fa::PreciseFwdTraits<{elem}, {key.head_dim}>"
        return _mma_sync_entry(
            key, traits(key.head_dim, key.arch, key.dtype), tr_cxx, "fa_fwd_precise_args",
            "  const fa::PreciseScalars x{a.softmax_scale_f64, a.softcap_f64};\n"
            f"  fa::flash_fwd_precise<{tr_cxx}, {mma}, {flags}>(p, x);")
    t = traits(key.head_dim)
    elem = "fa::Bf16" if key.dtype == "bf16" else "fa::F16"
    tr_cxx = t.cxx if key.head_dim in _OVERRIDES else f"fa::FwdTraits<{key.head_dim}>"
    return _mma_sync_entry(key, t, tr_cxx, "fa_fwd_args",
                           f"  fa::flash_fwd<{tr_cxx}, {elem}, {flags}>(p);")


def _mma_sync_entry(key: KernelKey, t: Traits, tr_cxx: str, struct: str, call: str) -> str:
    """An sm80-family entry point: the launch-geometry check, then FwdParams from the packed
    struct ``struct`` (FWD_ARGS' fields first) and ``call``."""
    return f"""
static_assert({tr_cxx}::kNThreads == {t.num_threads} && {tr_cxx}::kSmemBytes == {t.smem_bytes} &&
              {tr_cxx}::kMinBlocksPerSm == {t.min_blocks_per_sm},
              "{key.name}: the host's launch geometry differs from the tile table");
extern "C" __global__ void __launch_bounds__({t.num_threads}, {t.min_blocks_per_sm}) {key.name}(
    const {struct} a) {{
  fa::FwdParams p;
{FWD_ARGS.assign("p")}
{call}
}}
"""


def _wrapper_sm90(key: KernelKey) -> str:
    t = key_traits(key)
    if key.dtype == "f32":
        return _wrapper_sm90_f32(key, t)
    elem = "fa::Bf16" if key.dtype == "bf16" else "fa::F16"
    b = lambda x: "true" if x else "false"  # noqa: E731
    tr_cxx = f"fa::Sm90FwdTraits<{key.head_dim}, {b(key.paged)}, {b(key.wide)}>"
    flags = f"{b(key.transform)}, {b(key.paged)}"
    if key.split:
        struct = SM90_SPLIT_ARGS.struct_name
        call = (f"  const fa::SplitOut so{{a.base.oaccum, a.base.lse_accum, a.base.num_splits}};\n"
                f"  fa::flash_fwd_sm90<{tr_cxx}, {elem}, {flags}, true>(p, maps, a.base.tile_counter,\n"
                f"                                                   fa::F32Scales{{}}, so);")
    else:
        struct = SM90_ARGS.struct_name
        call = (f"  fa::flash_fwd_sm90<{tr_cxx}, {elem}, {flags}>(p, maps,\n"
                f"                                                                           a.base.tile_counter);")
    # (threads, 1): setmaxnreg needs the register cap at entry that the 1 gives.
    return f"""
static_assert({tr_cxx}::kNThreads == {t.num_threads} && {tr_cxx}::kSmemBytes == {t.smem_bytes},
              "{key.name}: the host's launch geometry differs from sm90/kernel_traits.cuh");
extern "C" __global__ void __launch_bounds__({t.num_threads}, 1) {key.name}(
    const __grid_constant__ {struct} a) {{
  fa::FwdParams p;
{FWD_ARGS.assign("p", "a.base")}
  const fa::TmaMaps maps{{&a.tma_q, &a.tma_k, &a.tma_v}};
{call}
}}
"""


def _wrapper_sm90_f32(key: KernelKey, t: Traits) -> str:
    """The float32 entry point: float16 planes (fa::F16 products) and their scales."""
    tr_cxx = f"fa::Sm90F32Traits<{key.head_dim}>"
    transform = "true" if key.transform else "false"
    return f"""
static_assert({tr_cxx}::kNThreads == {t.num_threads} && {tr_cxx}::kSmemBytes == {t.smem_bytes},
              "{key.name}: the host's launch geometry differs from sm90/kernel_traits.cuh");
extern "C" __global__ void __launch_bounds__({t.num_threads}, 1) {key.name}(
    const __grid_constant__ fa_fwd_sm90_f32_args a) {{
  fa::FwdParams p;
{FWD_ARGS.assign("p", "a.base")}
  const fa::TmaMaps maps{{&a.tma_q, &a.tma_k, &a.tma_v}};
  const fa::F32Scales sc{{a.base.q_rscale, a.base.kv_rscale}};
  fa::flash_fwd_sm90<{tr_cxx}, fa::F16, {transform}, false>(p, maps, a.base.tile_counter, sc);
}}
"""


def kernel_source(keys: Union[KernelKey, Iterable[KernelKey]]) -> str:
    """Translation unit: flash_fwd.cu with headers inlined, plus one entry point per key."""
    if isinstance(keys, KernelKey):
        keys = [keys]
    keys = list(keys)
    archs = {k.arch for k in keys} or {"sm80"}
    if len(archs) != 1:
        raise ValueError(f"one module per kernel family; got keys of {sorted(archs)}")
    arch = archs.pop()
    precise = {k.dtype in PRECISE_DTYPES for k in keys}
    if len(precise) > 1:
        raise ValueError("one module per kernel source: float32/float64 keys and 16-bit keys apart")
    if precise == {True} and arch == "sm80":
        return (build_source("sm80/flash_fwd_precise.cu") + '#line 1 "<generated entry points>"\n'
                + FWD_ARGS.c_struct() + PRECISE_ARGS.c_struct() + "".join(_wrapper(k) for k in keys))
    # sm90: the TMA maps' struct; the float32 (planes) keys' one also carries their scales,
    # the split-KV keys' one their partials.
    packs = [SM90_F32_ARGS] if precise == {True} else [SM90_ARGS]
    if arch == "sm90" and any(k.split for k in keys):
        packs = ([SM90_ARGS] if not all(k.split for k in keys) else []) + [SM90_SPLIT_ARGS]
    structs = FWD_ARGS.c_struct() + ("".join(pk.base.c_struct() + pk.c_struct() for pk in packs)
                                     if arch == "sm90" else "")
    return (build_source(f"{arch}/flash_fwd.cu") + '#line 1 "<generated entry points>"\n'
            + structs + "".join(_wrapper(k) for k in keys))


def get_kernel(key: KernelKey):
    """The ``cupy.RawKernel`` of one instantiation on the current device, compiled on first use
    (cached per device)."""
    if key not in _COMPILED:
        _COMPILED.append(key)
    if key.arch == "sm90":
        smem = key_traits(key).smem_bytes
        return load_function(("fwd", key), lambda: kernel_source(key), key.name, smem,
                             target=NVRTC_TARGET["sm90"])
    if key.dtype in PRECISE_DTYPES:
        smem = traits(key.head_dim, key.arch, key.dtype).smem_bytes
        return load_function(("fwd", key), lambda: kernel_source(key), key.name, smem)
    override = _OVERRIDES.get(key.head_dim)
    smem = (override or traits(key.head_dim)).smem_bytes
    return load_function(("fwd", key, override), lambda: kernel_source(key), key.name, smem)


_COMPILED: list = []


def compiled_kernels() -> list:
    """Keys compiled (and loaded) in this process, in order."""
    return list(_COMPILED)


_MODULES: dict = {}
_FUNCTIONS: dict = {}


def load_function(cache_key, make_source, name: str, smem_bytes: int, device_id=None,
                  target=None):
    """Kernel ``name`` of the module built from ``make_source()``, on ``device_id`` (default:
    the current device), with its dynamic shared-memory limit raised when it needs > 48 KB.

    CuPy keeps one loaded function per device and ``max_dynamic_shared_size_bytes`` is a
    per-function (so per-device) attribute: it is set here for every device the kernel is
    launched on, not only the first one (a config cached after a launch on GPU 0 would
    otherwise fail on GPU 1).  The module is loaded per device too (the devices may differ in
    architecture); its compiled code comes from CuPy's disk cache after the first build.
    ``target`` (e.g. "90a"): build for that NVRTC architecture instead of the device's own
    (:func:`_target_module`).  The tuning switches (:func:`_tuning_defines`) are part of the
    memory cache's key, as they are of the disk caches': a process that changes them (a test,
    an A/B run) never launches a kernel built without the switches its plan was made for."""
    import cupy

    if device_id is None:
        device_id = cupy.cuda.runtime.getDevice()
    fkey = (cache_key, tuple(_tuning_defines()), device_id)
    fn = _FUNCTIONS.get(fkey)
    if fn is not None:
        return fn
    with cupy.cuda.Device(device_id):
        module = _MODULES.get(fkey)
        if module is None:
            log.info("compiling %s (first use on device %d)", name, device_id)
            if target is None:
                module = cupy.RawModule(code=make_source(), options=NVRTC_OPTIONS)
            else:
                module = _target_module(make_source(), target)
            _MODULES[fkey] = module
        fn = module.get_function(name)
        if smem_bytes > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem_bytes
    _FUNCTIONS[fkey] = fn
    return fn


def _target_module(source: str, target: str):
    """A ``cupy.RawModule`` of ``source`` compiled by NVRTC for ``sm_<target>``.

    CuPy's own compile path always targets the device's plain architecture (``-arch=sm_90``),
    which has no wgmma or setmaxnreg; so the cubin is built here (:func:`compile_for_arch`)
    and loaded with ``RawModule(path=...)``.  It is cached on disk next to CuPy's kernels
    (``$CUPY_CACHE_DIR``), keyed by the hash of the source text, options, target and NVRTC
    version -- the same inputs CuPy's cache key covers."""
    import hashlib

    import cupy
    from cupy.cuda import nvrtc

    version = ".".join(map(str, nvrtc.getVersion()))
    options = _tuning_defines()
    digest = hashlib.sha256("\0".join([source, *NVRTC_OPTIONS, *options, target, version]).encode())
    root = kernel_cache_root()
    path = os.path.join(root, f"cupy_flashattn_sm{target}_{digest.hexdigest()[:32]}.cubin")
    if not os.path.isfile(path):
        cubin, _log = compile_for_arch(source, target, verbose=False, extra_options=options)
        os.makedirs(root, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)  # atomic: concurrent processes never load half a file
    return cupy.RawModule(path=path)


def precompile(
    dtypes: Sequence[str] = DTYPES,
    head_dims: Sequence[int] = HEAD_DIM_BUCKETS,
    features: Sequence[dict] = ({},),
) -> list:
    """Compile (and load) a chosen set of kernels ahead of time; returns their names.

    dtypes: kernel element types ("f16", "bf16", "f32", "tf32", "f64") or NumPy dtypes
    (float32 maps through the current float32 precision, see kernel_dtype_tag);
    head_dims: any head dims (mapped to their bucket); features: dicts of KernelKey flags, e.g.
    ``({}, {"paged": True}, {"transform": True})``.
    """
    names = []
    for dt, d, f in itertools.product(dtypes, head_dims, features):
        tag = kernel_dtype_tag(dt)
        key = KernelKey(tag, bucket_for(d, head_dim_buckets("sm80", tag)), **f)
        get_kernel(key)
        names.append(key.name)
    return names


def kernel_dtype_tag(dtype) -> str:
    """The kernel element type serving ``dtype``: "f16" for float16, "bf16" for bfloat16,
    "f64" for float64, and for float32 what :func:`cupy_flashattn.set_float32_precision` says:
    "f32" (3xTF32, float32 accuracy; the default), "tf32" or "bf16" (bf16 operands, fp32
    accumulation).  Tags pass through.  The one place this mapping is written (prefill and
    decode keys, precompile)."""
    if isinstance(dtype, str) and dtype in DTYPES + PRECISE_DTYPES:
        return dtype
    import numpy as np

    name = np.dtype(dtype).name
    if name == "float32":
        from ..precision import float32_kernel_dtype

        return float32_kernel_dtype()
    tag = {"float16": "f16", "bfloat16": "bf16", "float64": "f64"}.get(name)
    if tag is None:
        raise TypeError(f"q: dtype {name} is not supported by the CUDA kernels (expected "
                        "float16, bfloat16, float32 or float64)")
    return tag


def bucket_for(head_dim: int, buckets=HEAD_DIM_BUCKETS) -> int:
    """Smallest of ``buckets`` holding head_dim rounded up to a multiple of 8 (the D tail of a
    bucket is predicated in the kernels)."""
    d8 = -(-int(head_dim) // 8) * 8
    for b in buckets:
        if d8 <= b:
            return b
    raise ValueError(f"head_dim {head_dim} exceeds the largest bucket {buckets[-1]}")


def _tuning_defines() -> list:
    """``-D`` options from ``$CUPY_FLASHATTN_SM90_DEFINES`` ("FA_SM90_PINGPONG=1,..."): the
    kernels' tuning switches (sm90/kernel_traits.cuh, FA_SM90_WAIT_HINT_NS / FA_SM90_DESC_ADD /
    FA_SM90_PV_WIDE included; the decode
    kernel's FA_DECODE_* switches of sm80/flash_decode.cu, which decode.decode_source writes
    into its source text), for device sweeps and A/B runs only."""
    text = os.environ.get("CUPY_FLASHATTN_SM90_DEFINES", "")
    return [f"-D{d.strip()}" for d in text.split(",") if d.strip()]


def compile_for_arch(
    keys: Union[KernelKey, Sequence[KernelKey], str], arch: Union[int, str], verbose: bool = True,
    extra_options: Sequence[str] = (),
):
    """Compile keys (or raw source text) for ``sm_<arch>`` with NVRTC -- no GPU needed.

    Returns ``(cubin bytes, log)``; with verbose the log holds ``-Xptxas=-v`` output."""
    from cupy.cuda import nvrtc

    src = keys if isinstance(keys, str) else kernel_source(keys)
    arch = str(arch).replace("sm_", "")
    if not isinstance(keys, str):
        families = {k.arch for k in ([keys] if isinstance(keys, KernelKey) else keys)}
        if families == {"sm90"}:
            arch = NVRTC_TARGET["sm90"]  # the only target the Hopper family compiles for
    opts = [f"--gpu-architecture=sm_{arch}", *NVRTC_OPTIONS, *extra_options]
    if verbose:
        opts.append("-Xptxas=-v")
    prog = nvrtc.createProgram(src, "flash_fwd.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC failed for sm_{arch}:\n{nvrtc.getProgramLog(prog)}") from e
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


_FUNC_RE = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REG_RE = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(text: str) -> dict:
    """``{entry: {"registers", "stack", "spill_stores", "spill_loads", "arch"}}`` from ptxas -v."""
    out, cur = {}, None
    for line in text.splitlines():
        m = _FUNC_RE.search(line)
        if m:
            cur = m.group(1)
            out[cur] = {"arch": m.group(2)}
            continue
        if cur is None:
            continue
        m = _SPILL_RE.search(line)
        if m:
            out[cur].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                            spill_loads=int(m.group(3)))
        m = _REG_RE.search(line)
        if m:
            out[cur]["registers"] = int(m.group(1))
    return out
