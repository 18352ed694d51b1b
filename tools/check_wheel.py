#!/usr/bin/env python3
"""Build the sdist and the wheel, and check that the kernel sources travel with them.

Steps (each prints one line; any failure exits non-zero):

1. Copy the packaging inputs of the checkout to a temporary directory (so a stale ``build/`` or
   ``*.egg-info`` in the checkout can neither add nor hide files) and build an sdist there with
   setuptools' PEP 517 backend (no network, no build isolation).
2. Unpack the sdist and build the wheel *from it*, as ``pip install <sdist>`` would.  This proves
   the sdist carries ``cuda_src/`` too.
3. Assert that every ``cuda_src/*.cu*`` (and ``*.h``) file of the checkout is in the sdist under
   ``cuda_src/`` and in the wheel under ``cupy_flashattn/cuda_src/``, byte for byte.
4. Unless ``--no-install``: install the wheel into a fresh virtual environment and, from a
   directory outside the checkout, import the package and assert that
   ``cupy_flashattn._cuda.source.cuda_source_dir()`` is the installed ``cupy_flashattn/cuda_src``
   and holds the same files.  To be quick the wheel is installed with ``--no-deps`` plus numpy;
   ``--deps`` installs its declared ``install_requires`` instead (numba, ml_dtypes: slower, and
   proves a CPU-only install imports with exactly what setup.cfg declares).

Usage: ``python tools/check_wheel.py [--keep DIR] [--no-install] [--deps]``.
The functions are imported by tests/test_packaging.py.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNEL_PATTERNS = ("**/*.cu", "**/*.cuh", "**/*.h")  # attn/, sm80/ and the top level
WHEEL_KERNEL_DIR = "cupy_flashattn/cuda_src/"
# What setuptools needs to build; everything else in the checkout is left behind.
PACKAGING_INPUTS = ("setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md", "Makefile",
                    "cupy_flashattn", "cuda_src", "tests", "examples", "tools", "docs")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "*.egg-info",
                                 ".pytest_cache", ".hypothesis", ".ipynb_checkpoints")


def kernel_files(cuda_src: Path) -> dict[str, str]:
    """``{path relative to cuda_src: sha256}`` of the kernel sources in a ``cuda_src`` directory."""
    files = {}
    for pattern in KERNEL_PATTERNS:
        for path in sorted(Path(cuda_src).glob(pattern)):
            if path.is_file():
                rel = path.relative_to(cuda_src).as_posix()
                files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def _backend(cwd: Path, call: str, outdir: Path) -> Path:
    """Run ``setuptools.build_meta.<call>(outdir)`` in ``cwd`` in a child process and return the
    built file.  A child keeps setuptools' global state and cwd out of the caller (pytest)."""
    code = textwrap.dedent(
        f"""
        import sys
        from setuptools import build_meta
        print(build_meta.{call}({str(outdir)!r}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"setuptools {call} failed in {cwd} (exit {proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return outdir / proc.stdout.strip().splitlines()[-1]


def build_sdist_and_wheel(repo: Path, workdir: Path) -> tuple[Path, Path]:
    """Build ``(sdist, wheel)`` of ``repo`` inside ``workdir``; the wheel is built from the sdist.

    Needs setuptools >= 64 (and ``wheel`` for setuptools < 70.1) in the running interpreter.
    """
    repo, workdir = Path(repo), Path(workdir)
    src = workdir / "src"
    src.mkdir(parents=True)
    for name in PACKAGING_INPUTS:
        path = repo / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=_IGNORE)
        elif path.is_file():
            shutil.copy2(path, src / name)
    dist = workdir / "dist"
    dist.mkdir()
    sdist = _backend(src, "build_sdist", dist)
    unpacked = workdir / "from_sdist"
    unpacked.mkdir()
    with tarfile.open(sdist) as tar:
        if sys.version_info >= (3, 12):
            tar.extractall(unpacked, filter="data")
        else:
            tar.extractall(unpacked)
    (sdist_root,) = list(unpacked.iterdir())
    wheel = _backend(sdist_root, "build_wheel", dist)
    return sdist, wheel


def sdist_kernel_files(sdist: Path) -> dict[str, str]:
    with tarfile.open(sdist) as tar:
        out = {}
        for member in tar.getmembers():
            parts = member.name.split("/")
            # <name>-<version>/cuda_src/<path>
            if (member.isfile() and len(parts) >= 3 and parts[1] == "cuda_src"
                    and parts[-1].endswith((".cu", ".cuh", ".h"))):
                data = tar.extractfile(member).read()
                out["/".join(parts[2:])] = hashlib.sha256(data).hexdigest()
    return out


def wheel_kernel_files(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        return {
            name[len(WHEEL_KERNEL_DIR):]: hashlib.sha256(zf.read(name)).hexdigest()
            for name in zf.namelist()
            if name.startswith(WHEEL_KERNEL_DIR) and name.endswith((".cu", ".cuh", ".h"))
        }


def compare(expected: dict[str, str], got: dict[str, str], where: str) -> list[str]:
    """Human-readable differences between two ``{name: sha256}`` maps (empty list if equal)."""
    problems = []
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    changed = sorted(n for n in set(expected) & set(got) if expected[n] != got[n])
    if missing:
        problems.append(f"{where}: missing {missing}")
    if extra:
        problems.append(f"{where}: unexpected {extra}")
    if changed:
        problems.append(f"{where}: content differs for {changed}")
    return problems


# Runs inside the fresh venv, from a directory outside the checkout.  Prints a JSON verdict.
_PROBE = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path
    import cupy_flashattn
    pkg = Path(cupy_flashattn.__file__).resolve().parent
    how = "cupy_flashattn._cuda.source.cuda_source_dir()"
    try:
        from cupy_flashattn._cuda.source import cuda_source_dir
    except ImportError as exc:  # the loader is not written yet: use the package path directly
        import importlib.resources
        how = f"importlib.resources (cuda_source_dir unavailable: {exc})"
        def cuda_source_dir():
            return Path(str(importlib.resources.files("cupy_flashattn") / "cuda_src"))
    d = Path(cuda_source_dir()).resolve()
    files = {}
    for pattern in %r:
        for p in sorted(d.glob(pattern)):
            files[p.relative_to(d).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    print(json.dumps({"package": str(pkg), "cuda_src": str(d), "how": how, "files": files,
                      "prefix": sys.prefix}))
    """
    % (KERNEL_PATTERNS,)
)


def _venv_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def install_and_probe(wheel: Path, workdir: Path, quick: bool = False) -> dict:
    """Install ``wheel`` into a new venv under ``workdir`` and run the probe outside the repo."""
    import json

    env = Path(workdir) / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    py = str(_venv_python(env))
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    steps = [pip + ["--no-deps", str(wheel)], pip + ["numpy"]] if quick else [pip + [str(wheel)]]
    for cmd in steps:
        # Output is kept back unless the step fails: with --no-deps pip complains (harmlessly)
        # that numba and ml_dtypes are missing.
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[2:])} failed:\n{proc.stdout[-3000:]}"
                               f"{proc.stderr[-3000:]}")
    outside = Path(workdir) / "outside"
    outside.mkdir(exist_ok=True)
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(
        [py, "-c", _PROBE], cwd=outside, capture_output=True, text=True, env=clean_env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"import probe failed in the fresh venv:\n{proc.stderr[-4000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    info["venv"] = str(env.resolve())
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="work in this directory and keep it")
    ap.add_argument("--no-install", action="store_true", help="skip the fresh-venv install")
    ap.add_argument("--deps", action="store_true",
                    help="install the wheel with its install_requires (default: --no-deps + numpy)")
    args = ap.parse_args(argv)

    expected = kernel_files(REPO / "cuda_src")
    print(f"check-wheel: {len(expected)} kernel source file(s) in cuda_src/: "
          f"{', '.join(sorted(expected)) or '(none yet)'}")
    if not expected:
        print("check-wheel: WARNING: cuda_src/ has no *.cu/*.cuh yet; checking the machinery only")

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="check_wheel_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        sdist, wheel = build_sdist_and_wheel(REPO, workdir / "build")
        print(f"check-wheel: built {sdist.name} and {wheel.name} (wheel from the sdist)")
        problems = compare(expected, sdist_kernel_files(sdist), f"sdist {sdist.name} cuda_src/")
        problems += compare(expected, wheel_kernel_files(wheel),
                            f"wheel {wheel.name} {WHEEL_KERNEL_DIR}")
        if not problems:
            print(f"check-wheel: sdist and wheel carry all {len(expected)} kernel file(s)")
        if not args.no_install and not problems:
            info = install_and_probe(wheel, workdir, quick=not args.deps)
            site = Path(info["venv"])
            pkg, src_dir = Path(info["package"]), Path(info["cuda_src"])
            if site not in pkg.parents:
                problems.append(f"imported {pkg} instead of the copy installed in {site}")
            if src_dir != pkg / "cuda_src":
                problems.append(f"{info['how']} returned {src_dir}, expected {pkg / 'cuda_src'}")
            problems += compare(expected, info["files"], f"installed {src_dir}")
            if not problems:
                print(f"check-wheel: fresh venv: {info['how']} -> {src_dir} "
                      f"({len(info['files'])} file(s), identical)")
        for p in problems:
            print(f"check-wheel: FAIL: {p}", file=sys.stderr)
        if not problems:
            print("check-wheel: OK")
        return 1 if problems else 0
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
