"""Packaging: the declared metadata, and the kernel sources inside the sdist and the wheel.

The wheel is built from the sdist with setuptools' PEP 517 backend, in a temporary copy of the
checkout (a few seconds, no network); tools/check_wheel.py does the same plus an install into a
fresh venv (`make check-wheel`).
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_tool(name):
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_wheel = _load_tool("check_wheel")
clean_cache = _load_tool("clean_cache")


@pytest.fixture(scope="module")
def cfg():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return parser


def _lines(value):
    return [line.strip() for line in value.strip().splitlines() if line.strip()]


def _names(requirements):
    """``{normalized name: requirement string}``."""
    out = {}
    for req in requirements:
        name = re.match(r"[A-Za-z0-9._-]+", req).group(0)
        out[re.sub(r"[-_.]+", "-", name).lower()] = req
    return out


def _package_modules():
    """Every .py file of the package tree (a directory holding one is a package to ship, with
    or without an __init__.py)."""
    return [p for p in (REPO / "cupy_flashattn").rglob("*.py") if "__pycache__" not in p.parts]


def test_pyproject_only_names_the_backend():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert set(data) == {"build-system"}, "metadata belongs in setup.cfg, not pyproject.toml"
    assert data["build-system"]["build-backend"] == "setuptools.build_meta"


def test_setup_cfg_declares_dependencies_and_extras(cfg):
    opts = cfg["options"]
    assert opts["python_requires"].replace(" ", "") == ">=3.10"
    assert {"numpy", "ml-dtypes", "numba"} <= set(_names(_lines(opts["install_requires"])))
    extras = {k: _names(_lines(v)) for k, v in cfg["options.extras_require"].items()}
    assert {"cuda12", "cuda13", "test"} <= set(extras)
    assert {"cupy-cuda12x", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"} <= set(
        extras["cuda12"]
    )
    # CUDA 13 wheels dropped the suffix; the -cu13 names on PyPI are empty placeholders.
    assert {"cupy-cuda13x", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime"} <= set(extras["cuda13"])
    for name in ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime"):
        assert "<14" in extras["cuda13"][name].replace(" ", ""), extras["cuda13"][name]
    assert {"pytest", "hypothesis", "nbclient", "nbformat", "ipykernel"} <= set(extras["test"])
    for extra in extras.values():  # the whole toolkit is gigabytes: NVRTC + headers suffice
        assert "cuda-toolkit" not in extra


def test_every_package_directory_is_listed(cfg):
    listed = set(_lines(cfg["options"]["packages"]))
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in _package_modules()}
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [options] packages in setup.cfg"
    assert {"cupy_flashattn", "cupy_flashattn._cuda", "cupy_flashattn.cuda_src"} <= listed
    package_dir = dict(
        (k.strip(), v.strip())
        for k, v in (line.split("=") for line in _lines(cfg["options"]["package_dir"]))
    )
    assert package_dir == {"cupy_flashattn.cuda_src": "cuda_src"}
    globs = {g.strip() for g in cfg["options.package_data"]["cupy_flashattn.cuda_src"].split(",")}
    assert {"*.cu", "*.cuh"} <= globs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("setuptools", minversion="64")
    import setuptools

    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):
        pytest.importorskip("wheel", reason="setuptools < 70.1 needs the wheel package")
    work = tmp_path_factory.mktemp("packaging")
    sdist, wheel = check_wheel.build_sdist_and_wheel(REPO, work)
    return work, sdist, wheel


def test_sdist_and_wheel_carry_cuda_src(built):
    _, sdist, wheel = built
    expected = check_wheel.kernel_files(REPO / "cuda_src")
    assert check_wheel.compare(expected, check_wheel.sdist_kernel_files(sdist), "sdist") == []
    assert check_wheel.compare(expected, check_wheel.wheel_kernel_files(wheel), "wheel") == []
    if not expected:
        pytest.skip("cuda_src/ has no *.cu/*.cuh yet: only the packaging machinery was checked")


def test_wheel_carries_every_module(built):
    _, _, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in _package_modules()}
    assert modules <= names, f"missing from the wheel: {sorted(modules - names)}"
    assert not any(n.startswith(("tests/", "cuda_src/", "tools/")) for n in names)


def test_unpacked_wheel_finds_its_own_kernels(built, tmp_path):
    """Imported from the unpacked wheel (not the checkout), the loader must return the
    wheel's cupy_flashattn/cuda_src."""
    _, _, wheel = built
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = check_wheel._PROBE
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    outside = tmp_path / "outside"
    outside.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=outside, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    pkg = Path(info["package"])
    assert pkg == (site / "cupy_flashattn").resolve()
    assert Path(info["cuda_src"]) == pkg / "cuda_src", info["how"]
    expected = check_wheel.kernel_files(REPO / "cuda_src")
    assert check_wheel.compare(expected, info["files"], info["cuda_src"]) == []


def test_makefile_targets_and_ci_script():
    text = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", text, flags=re.M))
    required = {"help", "demo", "test", "test-gpu", "bench", "lint", "check-wheel", "clean-cache"}
    assert required <= targets, f"missing targets {sorted(required - targets)}"
    assert re.search(r"^\.DEFAULT_GOAL\s*:=\s*help\s*$", text, flags=re.M)
    ci = REPO / ".ci" / "run"
    assert ci.stat().st_mode & stat.S_IXUSR, ".ci/run must be executable"
    assert "make test" in ci.read_text()


def test_clean_cache_recognizes_our_kernels():
    prefixes = (b"fa_", b"flash_fwd")
    ours = b"0" * 32 + b"\x7fELF...\x00.text.fa_fwd_paged_bf16_d128\x00fa_fwd_paged_bf16_d128\x00"
    mangled = b"0" * 32 + b"\x7fELF\x00_Z16flash_fwd_kernelILi128EEvv\x00"
    theirs = b"0" * 32 + b"\x7fELF\x00cupy_add\x00my_kernel\x00"
    assert clean_cache.is_ours(ours, prefixes)
    assert clean_cache.is_ours(mangled, prefixes)
    assert not clean_cache.is_ours(theirs, prefixes)
