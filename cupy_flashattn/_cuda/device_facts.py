"""The numbers the host needs about the kernels' tiles, read from the compiler -- never restated.

The host sizes grids, dynamic shared memory and register budgets from the tile configuration of
each kernel: ``fa::FwdTraits<D>`` in ``kernel_traits.cuh`` (prefill) and ``fa::DecodeTraits<D>``
/ ``fa::DecodeSmem<D>`` in ``flash_decode.cu`` (decode); ``fa::PreciseFwdTraits<T, D>`` (the
float32 / float64 prefill).  Those headers are the one table (with
the measured reason for every entry).  Instead of parsing C++ or copying its formulas, a tiny
translation unit evaluates the constexprs into an array::

    extern "C" __constant__ int fa_facts[] = {fa::FwdTraits<32>::kBlockM, ...};

NVRTC compiles it to PTX on the CPU (no GPU needed) and the array's initializer in the PTX is
the table (``.const .align 4 .b8 fa_facts[N] = {bytes...}``, little-endian int32s, trailing
zero bytes left out).  One compile
of a few hundred milliseconds per process, kept in memory and, keyed by the hash of
``cuda_src/``, in CuPy's kernel cache directory.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import numpy as np

from .source import build_source, kernel_cache_root, source_hash

__all__ = ["PREFILL_FACTS", "DECODE_FACTS", "prefill_facts", "decode_facts", "traits_facts"]

#: Members of ``fa::FwdTraitsBase`` the host reads.
PREFILL_FACTS = ("kHeadDim", "kBlockM", "kBlockN", "kNWarps", "kMinBlocksPerSm", "kQInRegs",
                 "kStages", "kSmemBytes", "kVSplits")
#: Members of ``fa::DecodeTraits<D>`` then ``fa::DecodeSmem<D>`` the host reads; kBytesFp8 is
#: ``fa::DecodeSmem<D, 1>::kBytes`` (float8 K/V), kMinBlocksFp8 its CTAs per SM.
DECODE_FACTS = ("kStages", "kMinBlocks", "kBytes", "kVSplits", "kBytesFp8", "kMinBlocksFp8")
#: The sm90 traits tables (name -> the traits type of bucket {d}, sm90/kernel_traits.cuh).
SM90_TABLES = {
    "prefill_sm90": "Sm90FwdTraits<{d}, false, false>",
    "prefill_sm90_paged": "Sm90FwdTraits<{d}, true, false>",
    "prefill_sm90_wide": "Sm90FwdTraits<{d}, false, true>",
}
#: The 32-key kernels' (``fa::DecodeTile<D, 2, 32>``, ``fa::DecodeSmem<D, 2, 32>``), for the
#: buckets that have one (decode.TILE32_BUCKETS).
DECODE_TILE32_FACTS = ("kStagesTile32", "kMinBlocksTile32", "kBytesTile32")

_ARRAY_RE = re.compile(r"fa_facts\[(\d+)\]\s*=\s*\{([^}]*)\}")


def _evaluate(source: str, expressions: list) -> list:
    """The int values of C++ constant ``expressions`` in the context of ``source``."""
    from cupy.cuda import nvrtc

    unit = (source + '\n#line 1 "<device facts>"\nextern "C" __constant__ int fa_facts[] = {'
            + ", ".join(f"(int)({e})" for e in expressions) + "};\n")
    prog = nvrtc.createProgram(unit, "device_facts.cu", [], [])
    try:
        try:
            from .compile import _tuning_defines

            nvrtc.compileProgram(prog, ["--gpu-architecture=compute_80", "--std=c++17",
                                        *_tuning_defines()])
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"device facts: NVRTC failed:\n{nvrtc.getProgramLog(prog)}") from e
        ptx = nvrtc.getPTX(prog).decode()
    finally:
        nvrtc.destroyProgram(prog)
    m = _ARRAY_RE.search(ptx)
    if m is None:
        raise RuntimeError("device facts: fa_facts not found in the PTX")
    # ptxas omits trailing zero bytes of an initializer: pad to the declared size.
    data = bytes(int(x) for x in m.group(2).split(",")).ljust(int(m.group(1)), b"\0")
    values = np.frombuffer(data, dtype="<i4").tolist()
    if len(values) != len(expressions):
        raise RuntimeError(f"device facts: {len(values)} values for {len(expressions)} expressions")
    return values


def _disk_cache() -> Path:
    root = kernel_cache_root()
    import hashlib

    from .compile import _tuning_defines

    # The switches, and the facts asked for: a host that asks for a new fact (DECODE_FACTS grew)
    # must not read an older table written for the same kernel sources.
    asked = (" ".join(_tuning_defines()) + "|" + " ".join(PREFILL_FACTS + DECODE_FACTS + DECODE_TILE32_FACTS)
             + "|" + " ".join(SM90_TABLES))
    tuning = hashlib.sha256(asked.encode()).hexdigest()[:8]
    return Path(root) / f"cupy_flashattn_device_facts_{source_hash()}_{tuning}.json"


def _all_facts() -> dict:
    """{"prefill": {bucket: {fact: value}}, "decode": {...}} under the current tuning switches
    ($CUPY_FLASHATTN_SM90_DEFINES can change a kernel's tiles and shared memory), from memory,
    the disk cache or NVRTC."""
    from .compile import _tuning_defines

    return _facts_for(tuple(_tuning_defines()))


@functools.cache
def _facts_for(tuning: tuple) -> dict:
    """_all_facts for one set of tuning switches (the memory cache's key)."""
    path = _disk_cache()
    try:
        raw = json.loads(path.read_text())
        return {kind: {int(b): v for b, v in table.items()} for kind, table in raw.items()}
    except (OSError, ValueError):
        pass
    from .compile import HEAD_DIM_BUCKETS
    from .decode import DECODE_BUCKETS

    exprs = [f"fa::FwdTraits<{d}>::{f}" for d in HEAD_DIM_BUCKETS for f in PREFILL_FACTS]
    vals = _evaluate(build_source("sm80/kernel_traits.cuh"), exprs)
    n = len(PREFILL_FACTS)
    prefill = {d: dict(zip(PREFILL_FACTS, vals[i * n:(i + 1) * n]))
               for i, d in enumerate(HEAD_DIM_BUCKETS)}
    exprs = [f"fa::DecodeTraits<{d}>::kStages" for d in DECODE_BUCKETS]
    exprs += [f"fa::DecodeTraits<{d}>::kMinBlocks" for d in DECODE_BUCKETS]
    exprs += [f"fa::DecodeSmem<{d}>::kBytes" for d in DECODE_BUCKETS]
    exprs += [f"fa::DecodeTraits<{d}>::kVSplits" for d in DECODE_BUCKETS]
    exprs += [f"fa::DecodeSmem<{d}, 1>::kBytes" for d in DECODE_BUCKETS]
    exprs += [f"fa::DecodeTraits<{d}>::kMinBlocksFp8" for d in DECODE_BUCKETS]
    vals = _evaluate(build_source("sm80/flash_decode.cu"), exprs)
    k = len(DECODE_BUCKETS)
    decode = {d: dict(zip(DECODE_FACTS, vals[i::k])) for i, d in enumerate(DECODE_BUCKETS)}
    from .decode import TILE32_BUCKETS

    exprs = [e for d in TILE32_BUCKETS for e in (f"fa::DecodeTile<{d}, 2, 32>::kStages",
                                                  f"fa::DecodeTile<{d}, 2, 32>::kMinBlocks",
                                                  f"fa::DecodeSmem<{d}, 2, 32>::kBytes")]
    vals = _evaluate(build_source("sm80/flash_decode.cu"), exprs)
    for i, d in enumerate(TILE32_BUCKETS):
        decode[d].update(zip(DECODE_TILE32_FACTS, vals[3 * i:3 * i + 3]))
    from .compile import SM90_HEAD_DIM_BUCKETS

    sm90 = {}
    for table, cxx in SM90_TABLES.items():
        exprs = [f"fa::{cxx.format(d=d)}::{f}" for d in SM90_HEAD_DIM_BUCKETS
                 for f in PREFILL_FACTS]
        vals = _evaluate(build_source("sm90/kernel_traits.cuh"), exprs)
        sm90[table] = {d: dict(zip(PREFILL_FACTS, vals[i * n:(i + 1) * n]))
                       for i, d in enumerate(SM90_HEAD_DIM_BUCKETS)}
    from .compile import SM90_F32_HEAD_DIM_BUCKETS

    exprs = [f"fa::Sm90F32Traits<{d}>::{f}" for d in SM90_F32_HEAD_DIM_BUCKETS for f in PREFILL_FACTS]
    vals = _evaluate(build_source("sm90/kernel_traits.cuh"), exprs)
    sm90["prefill_sm90_f32"] = {d: dict(zip(PREFILL_FACTS, vals[i * n:(i + 1) * n]))
                                for i, d in enumerate(SM90_F32_HEAD_DIM_BUCKETS)}
    from .compile import PRECISE_HEAD_DIM_BUCKETS

    precise = {}
    for tag, cxx in (("f32", "float"), ("f64", "double")):
        buckets = PRECISE_HEAD_DIM_BUCKETS[tag]
        exprs = [f"fa::PreciseFwdTraits<{cxx}, {d}>::{f}" for d in buckets for f in PREFILL_FACTS]
        vals = _evaluate(build_source("sm80/kernel_traits_precise.cuh"), exprs)
        precise[f"prefill_{tag}"] = {d: dict(zip(PREFILL_FACTS, vals[i * n:(i + 1) * n]))
                                     for i, d in enumerate(buckets)}
    facts = {"prefill": prefill, **sm90, "decode": decode, **precise}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(facts))
        tmp.replace(path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only cache directory only costs the compile next time
    return facts


def prefill_facts(arch: str = "sm80") -> dict:
    """head-dim bucket -> {PREFILL_FACTS name: value} of ``fa::FwdTraits<bucket>`` (sm80),
    ``fa::Sm90FwdTraits<bucket, false, false>`` (sm90), ``<bucket, true, false>`` ("sm90p": the
    paged kernels), ``<bucket, false, true>`` ("sm90w": the wide kernels),
    ``fa::Sm90F32Traits<bucket>`` ("sm90f32": the Hopper float32 kernel) or
    ``fa::PreciseFwdTraits<float|double, bucket>`` ("f32" / "f64")."""
    table = {"sm90": "prefill_sm90", "sm90p": "prefill_sm90_paged", "sm90w": "prefill_sm90_wide",
             "sm90f32": "prefill_sm90_f32",
             "f32": "prefill_f32", "f64": "prefill_f64"}
    return _all_facts()[table.get(arch, "prefill")]


def decode_facts() -> dict:
    """decode bucket -> {"kStages", "kMinBlocks", "kBytes" (dynamic shared memory)}."""
    return _all_facts()["decode"]


@functools.cache
def traits_facts(cxx: str) -> dict:
    """The PREFILL_FACTS of an arbitrary ``fa::FwdTraitsBase<...>`` (tuning overrides)."""
    vals = _evaluate(build_source("sm80/kernel_traits.cuh"), [f"{cxx}::{f}" for f in PREFILL_FACTS])
    return dict(zip(PREFILL_FACTS, vals))
