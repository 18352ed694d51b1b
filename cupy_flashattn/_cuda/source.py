"""Locating ``cuda_src/`` and turning it into one self-contained translation unit.

NVRTC gets the full source text with our own ``#include "x.cuh"`` headers inlined (each once,
recursively), every inlined file introduced by a ``#line 1 "<real path>"`` directive so that
compiler messages point at the real file and line.  Because CuPy's on-disk cache key hashes the
source text, inlining also means an edited header can never load a stale cubin.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import re

__all__ = ["cuda_source_dir", "build_source", "source_hash", "kernel_cache_root"]

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


def kernel_cache_root() -> pathlib.Path:
    """CuPy's on-disk kernel cache, by CuPy's rule: ``$CUPY_CACHE_DIR``, else
    ``~/.cupy/kernel_cache``.  Our own cached artefacts (device facts, sm_90a cubins) live there
    too, so one setting moves them all."""
    import os

    env = os.environ.get("CUPY_CACHE_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cupy" / "kernel_cache"


def cuda_source_dir() -> pathlib.Path:
    """The directory holding the kernel sources.

    First the installed location ``<package>/cuda_src`` (where the wheel puts them), then the
    checkout's ``<repo>/cuda_src``.
    """
    import cupy_flashattn

    pkg = pathlib.Path(cupy_flashattn.__file__).resolve().parent
    for cand in (pkg / "cuda_src", pkg.parent / "cuda_src"):
        if (cand / "sm80" / "flash_fwd.cu").is_file():
            return cand
    raise FileNotFoundError(
        f"cuda_src: kernel sources not found (expected sm80/flash_fwd.cu in {pkg / 'cuda_src'} or "
        f"{pkg.parent / 'cuda_src'}). Fix: reinstall cupy_flashattn, or run from a checkout."
    )


def _inline(path: pathlib.Path, seen: set, out: list) -> None:
    path = path.resolve()
    if path in seen:
        return
    seen.add(path)
    out.append(f'#line 1 "{path.as_posix()}"')
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        m = _INCLUDE.match(line)
        if m:
            target = (path.parent / m.group(1)).resolve()
            if not target.is_file():
                raise FileNotFoundError(f"{path}:{lineno}: included file {m.group(1)!r} not found")
            _inline(target, seen, out)
            out.append(f'#line {lineno + 1} "{path.as_posix()}"')
        elif _PRAGMA_ONCE.match(line):
            out.append("")  # once-ness is handled by `seen`; keep the line count
        else:
            out.append(line)


@functools.cache
def _build_source_cached(main: str, mtimes: tuple) -> str:
    out: list = []
    _inline(cuda_source_dir() / main, set(), out)
    return "\n".join(out) + "\n"


def _mtimes() -> tuple:
    d = cuda_source_dir()
    return tuple(sorted((p.relative_to(d).as_posix(), p.stat().st_mtime_ns) for p in _source_files(d)))


def build_source(main: str = "sm80/flash_fwd.cu") -> str:
    """The full translation unit of ``cuda_src/<main>`` (a path inside ``cuda_src/``, e.g.
    ``"sm80/flash_decode.cu"``) with our headers inlined."""
    return _build_source_cached(main, _mtimes())


def source_hash() -> str:
    """SHA-256 (hex, first 16 digits) over every source file below ``cuda_src/`` (paths
    relative to it, and contents)."""
    h = hashlib.sha256()
    d = cuda_source_dir()
    for p in _source_files(d):
        h.update(p.relative_to(d).as_posix().encode())
        h.update(b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _source_files(d: pathlib.Path) -> list:
    """The kernel sources below ``d``: ``common.cuh`` and ``kv_cache.cu`` at the top, the
    concepts every architecture shares in ``attn/``, one folder per architecture path
    (``sm80/``), sorted."""
    return sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in (".cu", ".cuh"))
