"""Fingerprints of every shipped kernel's machine code, compiled with NVRTC on the CPU.

A refactor of ``cuda_src/`` that only moves code (headers split, helpers relocated, comments,
dead code removed) must leave the generated cubins byte-identical -- and then the GPU runs the
same instructions as before, which a CPU-only machine can prove.  Prints one line per module
(prefill: all shipped keys in one module per arch, and one per float32 / float64 element type;
decode, float8 K/V included; combine; rope/append) with the
SHA-256 of its cubin.  NVRTC_OPTIONS carry no -lineinfo, so source positions do not enter the
cubin.

    python3 tools/cubin_fingerprint.py [--arch 80 90 90a] > before.txt   # then diff with after
    python3 tools/cubin_fingerprint.py --per-key --arch 90a   # one line per sm90 kernel

--per-key compiles every shipped sm90 key alone (in parallel processes), so a change shows
which kernels it touched (e.g. only the paged ones).

``$CUPY_FLASHATTN_SM90_DEFINES`` applies as it does at run time (the loader passes the defines
as NVRTC options; the decode source writes them into its text), so a build that a device run
tested under a switch can be compared with the default that later turns the switch on.

Each line has two hashes: of the whole cubin, and of its machine code alone (the ``.text.*``
sections, by name).  Adding a specialization that no kernel of the module uses (a new traits
bucket) changes the first -- its static members enter the symbol table, and symbol indices in
``.nv.info`` shift -- but not the second: the GPU runs the same instructions.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cupy_flashattn._cuda import compile as cc  # noqa: E402
from cupy_flashattn._cuda import decode as dc  # noqa: E402


def code_hash(cubin: bytes) -> str:
    """SHA-256 of the cubin's ``.text.*`` sections (name and bytes, in section order): the
    machine code, without the symbol table and the attribute sections that index it."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]  # ELF64, little endian
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    h = hashlib.sha256()
    for name_off, _type, _flags, _addr, offset, size in headers:
        start = names_at + name_off
        name = cubin[start:cubin.index(b"\0", start)]
        if name.startswith(b".text."):
            h.update(name + b"\0" + cubin[offset:offset + size])
    return h.hexdigest()


def modules(arch):
    if arch == "90a":  # the Hopper family is built for sm_90a only
        yield "prefill sm90(all shipped keys)", cc.kernel_source(cc.shipped_keys("sm90"))
        return
    yield "prefill(all shipped keys)", cc.kernel_source(list(cc.shipped_keys()))
    for dt in cc.PRECISE_DTYPES:  # the float32 / float64 kernel, one module per element type
        yield f"prefill {dt}(all buckets)", cc.kernel_source(cc.shipped_precise_keys((dt,)))
    # Every shipped decode kernel, float8 K/V included (the float8 kernels are the same
    # template: a change to the shared code shows in both).
    yield "decode(all shipped keys)", dc.decode_source(dc.decode_shipped_keys(), combine=False)
    yield "combine", dc.decode_source([], combine=True)
    yield "rope_append", dc.rope_source()


def _sm90_keys() -> list:
    """Every shipped sm_90a kernel: the 16-bit family and the float32 (planes) one."""
    return cc.shipped_keys("sm90") + cc.shipped_sm90_f32_keys()


def _key_hash(key_name: str) -> str:
    key = next(k for k in _sm90_keys() if k.name == key_name)
    cubin, _ = cc.compile_for_arch(cc.kernel_source([key]), "90a", verbose=False,
                                   extra_options=cc._tuning_defines())
    return (f"sm_90a {key.name:40s} {hashlib.sha256(cubin).hexdigest()} {len(cubin)} "
            f"code {code_hash(cubin)[:16]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["80", "90", "90a"])
    ap.add_argument("--per-key", action="store_true",
                    help="sm90: one line per shipped key (float32 planes keys included)")
    args = ap.parse_args(argv)
    if args.per_key:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(os.cpu_count()) as ex:
            for line in ex.map(_key_hash, [k.name for k in _sm90_keys()]):
                print(line, flush=True)
        return
    for arch in args.arch:
        for name, src in modules(arch):
            cubin, _ = cc.compile_for_arch(src, arch, verbose=False, extra_options=cc._tuning_defines())
            print(f"sm_{arch} {name:28s} {hashlib.sha256(cubin).hexdigest()} {len(cubin)} "
                  f"code {code_hash(cubin)[:16]}", flush=True)


if __name__ == "__main__":
    main()
