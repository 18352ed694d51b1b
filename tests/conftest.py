"""Shared pytest setup.

- Puts the repository root on ``sys.path`` so ``import cupy_flashattn`` works from a plain
  checkout (no ``pip install -e .`` needed).
- Registers the ``gpu`` marker and skips ``gpu``-marked tests when no CUDA GPU is usable.
- ``$CUPY_FLASHATTN_TEST_SHARD="i/N"`` keeps shard i of N of the collected tests
  (tests/_shard.py; tools/gpu_suite_parallel.sh runs the N shards at once).
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)


@functools.lru_cache(maxsize=None)
def cuda_gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device.  Without a driver
    ``getDeviceCount`` raises (CUDARuntimeError), which counts as "no GPU"."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a usable CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("CUPY_FLASHATTN_TEST_SHARD")
    if shard:  # one of N parallel processes (tools/gpu_suite_parallel.sh; tests/_shard.py)
        from _shard import select_shard

        kept, dropped = select_shard(list(items), shard)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or cuda_gpu_available():
        return
    skip_gpu = pytest.mark.skip(reason="no usable CUDA GPU (cupy found no device)")
    for item in gpu_items:
        item.add_marker(skip_gpu)
