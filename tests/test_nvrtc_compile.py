"""CI (no GPU needed): every shipped kernel instantiation compiles with NVRTC for sm_80 and
sm_90, with 0 bytes of register spills and within its register budget (ptxas -v).

One pytest parameter per (arch, kernel) so a failure names the kernel; kernels of one
(arch, dtype, head-dim bucket) are compiled together in one NVRTC program (module-level cache)
to share the front-end work.  ~1 s per kernel per arch on one core.
"""

from __future__ import annotations

import functools

import pytest

from helpers import require_nvrtc

require_nvrtc()

from cupy_flashattn._cuda import compile as cc  # noqa: E402

ARCHS = (80, 90)
KEYS = cc.shipped_keys()


@functools.cache
def _group_log(arch: int, dtype: str, head_dim: int) -> dict:
    keys = [k for k in KEYS if k.dtype == dtype and k.head_dim == head_dim]
    cubin, log = cc.compile_for_arch(keys, arch)
    assert cubin, "NVRTC returned no cubin"
    return cc.parse_ptxas_log(log)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("key", KEYS, ids=str)
def test_kernel_compiles_without_spills(arch, key):
    info = _group_log(arch, key.dtype, key.head_dim).get(key.name)
    assert info is not None, f"{key.name}: no ptxas -v record for sm_{arch}"
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (
        f"{key.name} sm_{arch}: {info['spill_stores']} bytes spill stores, "
        f"{info['spill_loads']} bytes spill loads (registers {info['registers']})"
    )
    budget = cc.traits(key.head_dim).register_budget
    assert info["registers"] <= budget, (
        f"{key.name} sm_{arch}: {info['registers']} registers > budget {budget} "
        f"({cc.traits(key.head_dim).num_threads} threads x "
        f"{cc.traits(key.head_dim).min_blocks_per_sm} CTAs/SM)"
    )


def test_source_inlines_every_header():
    from cupy_flashattn._cuda import source

    src = source.build_source()
    assert '#include "' not in src
    for name in ("common.cuh", "sm80/mma.cuh", "attn/block_info.cuh", "attn/mask.cuh",
                 "attn/softmax.cuh", "sm80/kernel_traits.cuh"):
        assert f'/{name}"' in src, f"{name} not inlined with a #line directive"
    assert len(source.source_hash()) == 16


def test_kernel_names_are_flat_and_unique():
    names = [k.name for k in KEYS]
    assert len(set(names)) == len(names)
    assert all(n.replace("_", "").isalnum() for n in names)
