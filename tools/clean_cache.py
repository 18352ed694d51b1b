#!/usr/bin/env python3
"""Remove cupy_flashattn's compiled kernels from CuPy's disk cache, and its Numba caches.

CuPy caches every compiled module as ``<md5>.cubin`` in ``$CUPY_CACHE_DIR`` (default
``~/.cupy/kernel_cache``); the file is the 32-byte hex hash followed by the cubin, whose ELF
string table holds the kernel names.  A cache file is ours when one of its symbols starts with
one of our kernel-name prefixes (``KERNEL_PREFIXES``; override with the comma-separated
``CUPY_FLASHATTN_KERNEL_PREFIXES``).  Other programs' kernels are left alone; ``--all`` empties
the whole CuPy cache instead.

Numba writes ``*.nbi`` / ``*.nbc`` next to the module in ``__pycache__`` (or under
``$NUMBA_CACHE_DIR``); those of cupy_flashattn (checkout and installed copy) are removed.

Usage: ``python tools/clean_cache.py [--all] [--dry-run]``.  Needs nothing but the standard
library (it never imports cupy or cupy_flashattn).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Names of our extern "C" entry points (fa_fwd_paged_bf16_d128_causal, ...), and the words any
# templated (mangled) name of ours contains.
KERNEL_PREFIXES = ("fa_", "cupy_flashattn", "flash_fwd", "flash_decode", "flash_attn")
NUMBA_SUFFIXES = (".nbi", ".nbc")


def cupy_cache_dir() -> Path:
    """The directory CuPy reads and writes compiled modules in (same rule as CuPy)."""
    env = os.environ.get("CUPY_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cupy" / "kernel_cache"


def kernel_prefixes() -> tuple[bytes, ...]:
    env = os.environ.get("CUPY_FLASHATTN_KERNEL_PREFIXES")
    names = [p.strip() for p in env.split(",")] if env else list(KERNEL_PREFIXES)
    return tuple(p.encode() for p in names if p)


def is_ours(data: bytes, prefixes: tuple[bytes, ...]) -> bool:
    """True if an ELF string-table entry (NUL-separated) names one of our kernels, directly or
    inside an Itanium-mangled name (``_Z<len><name>``)."""
    for prefix in prefixes:
        if b"\x00" + prefix in data:
            return True
        if re.search(rb"_Z\w*?\d+" + re.escape(prefix), data):
            return True
    return False


def cupy_cache_files(all_files: bool) -> list[Path]:
    cache = cupy_cache_dir()
    if not cache.is_dir():
        return []
    prefixes = kernel_prefixes()
    found = []
    for path in sorted(cache.iterdir()):
        if not path.is_file():
            continue
        if all_files:
            found.append(path)
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if is_ours(data, prefixes):
            found.append(path)
    return found


def numba_cache_files() -> list[Path]:
    roots = {REPO / "cupy_flashattn"}
    spec = importlib.util.find_spec("cupy_flashattn")  # locates; does not import the package
    if spec is not None and spec.submodule_search_locations:
        roots.update(Path(p) for p in spec.submodule_search_locations)
    found = set()
    for root in roots:
        if root.is_dir():
            for path in root.rglob("*"):
                if path.suffix in NUMBA_SUFFIXES and path.parent.name == "__pycache__":
                    found.add(path)
    numba_dir = os.environ.get("NUMBA_CACHE_DIR")
    if numba_dir and Path(numba_dir).is_dir():
        for path in Path(numba_dir).rglob("*"):
            if path.suffix in NUMBA_SUFFIXES and "cupy_flashattn" in str(path):
                found.add(path)
    return sorted(found)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="empty the whole CuPy kernel cache")
    ap.add_argument("--dry-run", action="store_true", help="list what would be removed")
    args = ap.parse_args(argv)

    cupy_files = cupy_cache_files(args.all)
    numba_files = numba_cache_files()
    verb = "would remove" if args.dry_run else "removed"
    for path in cupy_files + numba_files:
        if not args.dry_run:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        print(f"clean-cache: {verb} {path}")
    what = "all entries" if args.all else "cupy_flashattn kernels"
    print(f"clean-cache: {verb} {len(cupy_files)} CuPy cache file(s) ({what} in "
          f"{cupy_cache_dir()}) and {len(numba_files)} Numba cache file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
