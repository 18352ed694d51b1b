"""CI (no GPU needed): every shipped kernel instantiation compiles with NVRTC -- the sm80 family
for sm_80 and sm_90, the Hopper family for sm_90a -- with 0 bytes of register spills, within
its register budget and (sm90) with every setmaxnreg honoured (ptxas -v; warning C7508 would
say one was ignored).

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
SM90_KEYS = cc.shipped_keys("sm90") + cc.shipped_sm90_f32_keys()
PRECISE_KEYS = cc.shipped_precise_keys()


@functools.cache
def _group(arch, family: str, dtype: str, head_dim: int):
    pool = {"sm90": SM90_KEYS, "precise": PRECISE_KEYS}.get(family, KEYS)
    keys = [k for k in pool if k.dtype == dtype and k.head_dim == head_dim]
    cubin, log = cc.compile_for_arch(keys, arch)
    assert cubin, "NVRTC returned no cubin"
    return cc.parse_ptxas_log(log), log


def _group_log(arch: int, dtype: str, head_dim: int) -> dict:
    return _group(arch, "sm80", dtype, head_dim)[0]


@pytest.mark.parametrize("key", SM90_KEYS, ids=str)
def test_sm90_kernel_compiles_for_sm90a_without_spills(key):
    infos, log = _group("90a", "sm90", key.dtype, key.head_dim)
    info = infos.get(key.name)
    assert info is not None and info["arch"] == "sm_90a", f"{key.name}: no ptxas -v record for sm_90a"
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (
        f"{key.name}: {info['spill_stores']} bytes spill stores, {info['spill_loads']} bytes "
        f"spill loads (see sm90/kernel_traits.cuh: kProducerRegs / kConsumerRegs)")
    assert "C7508" not in log and "setmaxnreg" not in log.lower(), f"ptxas ignored setmaxnreg:\n{log}"
    # C7515-C7520: "wgmma.mma_async instructions are serialized" (e.g. a wgmma or an
    # accumulator access in a data-dependent branch) -- correct but ~20% slower (NOTES.md).
    assert "Potential Performance Loss" not in log, f"ptxas serializes wgmma:\n{log}"
    # The entry allocation setmaxnreg redistributes: 384 threads at one CTA per SM.
    assert info["registers"] <= 168


def test_generated_wgmma_header_is_current():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "tools" / "gen_wgmma.py"
    spec = importlib.util.spec_from_file_location("gen_wgmma", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.TARGET.read_text() == gen.render(), "run python tools/gen_wgmma.py"


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


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("key", PRECISE_KEYS, ids=str)
def test_precise_kernel_compiles_without_spills_or_local_memory(arch, key):
    """The float32 / float64 kernels (sm80/flash_fwd_precise.cu) sit at the register cap: no
    spill, and no stack frame either (a register array indexed at run time would live there)."""
    info = _group(arch, "precise", key.dtype, key.head_dim)[0].get(key.name)
    assert info is not None, f"{key.name}: no ptxas -v record for sm_{arch}"
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0 and info["stack"] == 0, (
        f"{key.name} sm_{arch}: {info['spill_stores']} bytes spill stores, {info['spill_loads']} "
        f"bytes spill loads, {info['stack']} bytes stack (sm80/kernel_traits_precise.cuh)")
    tr = cc.traits(key.head_dim, "sm80", key.dtype)
    assert info["registers"] <= tr.register_budget


def test_source_inlines_every_header():
    from cupy_flashattn._cuda import source

    src = source.build_source()
    assert '#include "' not in src
    for name in ("common.cuh", "sm80/mma.cuh", "attn/block_info.cuh", "attn/mask.cuh",
                 "attn/softmax.cuh", "sm80/kernel_traits.cuh"):
        assert f'/{name}"' in src, f"{name} not inlined with a #line directive"
    assert len(source.source_hash()) == 16


def test_kernel_names_are_flat_and_unique():
    names = [k.name for k in KEYS + SM90_KEYS + PRECISE_KEYS]
    assert len(set(names)) == len(names)
    assert all(n.replace("_", "").isalnum() for n in names)


#: The sm90 A/B switches of device runs and the kernels each one changes: FA_SM90_PAGED_TMA=0
#: (the gather-only paged kernels, per head-dim bucket; with the four absent-page flags it was
#: measured with -- under the flag word the D = 128 softcap / ALiBi build spills 4 bytes, and
#: the shipped kernels, which hold the gather beside the TMA producer, do not), FA_SM90_FLAG_WORD=0
#: (the paged consumers' former four flags, D = 256) and FA_SM90_F32_S_CHAINS=2 (the float32
#: kernel's second S accumulator).  Several defines: comma-separated.
SM90_SWITCHES = [("FA_SM90_PAGED_TMA=0,FA_SM90_FLAG_WORD=0", d,
                  [k for k in SM90_KEYS if k.paged and k.dtype == "bf16" and k.head_dim == d])
                 for d in cc.SM90_HEAD_DIM_BUCKETS]
SM90_SWITCHES.append(("FA_SM90_FLAG_WORD=0", 256, [k for k in SM90_KEYS if k.paged and k.dtype == "bf16"
                                                  and k.head_dim == 256]))
SM90_SWITCHES.append(("FA_SM90_F32_S_CHAINS=2", 0, cc.shipped_sm90_f32_keys()))
#: FA_SM90_EARLY_Q=1 (stop 48: measured, its GPU tests not yet run; off by default), every
#: bucket with its own O buffer and the float32 kernels; FA_SM90_CLUSTER_MERGE=0 (the split
#: kernels without the cluster merge, the A/B baseline) at D = 128.
SM90_SWITCHES += [("FA_SM90_EARLY_Q=1", d, [k for k in SM90_KEYS if k.dtype == "bf16" and k.head_dim == d])
                  for d in (64, 128, 192)]
SM90_SWITCHES.append(("FA_SM90_EARLY_Q=1", 0, cc.shipped_sm90_f32_keys()))
#: FA_SM90_LPT_GROUPS=1 (stop 49: the dynamic schedule's grouped claims, in tile_at of every
#: prefill kernel): the dense and paged bf16 kernels at D = 128 and 256.
SM90_SWITCHES += [("FA_SM90_LPT_GROUPS=1", d, [k for k in SM90_KEYS if k.dtype == "bf16" and k.head_dim == d
                                               and not k.split])
                  for d in (128, 256)]
#: FA_SM90_O_BULK=1 with FA_SM90_NEXT_EARLY=1 (stop 49: the epilogue's bulk copies, the next
#: tile resolved before it): the buckets with their own O buffer, bf16.
SM90_SWITCHES += [("FA_SM90_O_BULK=1,FA_SM90_NEXT_EARLY=1,FA_SM90_EARLY_Q=1", d,
                   [k for k in SM90_KEYS if k.dtype == "bf16" and k.head_dim == d])
                  for d in (64, 128, 192)]
SM90_SWITCHES.append(("FA_SM90_CLUSTER_MERGE=0", 128,
                      [k for k in SM90_KEYS if k.dtype == "bf16" and k.split and k.head_dim == 128]))


@pytest.mark.parametrize("define, head_dim, keys", SM90_SWITCHES,
                         ids=[f"{s}-d{d}" for s, d, _ in SM90_SWITCHES])
def test_sm90_ab_switch_compiles_without_spills(define, head_dim, keys, monkeypatch):
    """A build with a device-run A/B switch stays spill-free, without wgmma serialization.
    (The switch is in the environment too, as a device A/B sets it: the host's launch geometry,
    e.g. FA_SM90_O_BULK's shared memory, is evaluated under it.)"""
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", define)
    cubin, log = cc.compile_for_arch(cc.kernel_source(keys), "90a",
                                     extra_options=[f"-D{d}" for d in define.split(",")])
    infos = cc.parse_ptxas_log(log)
    assert {k.name for k in keys} <= set(infos)
    assert all(v["spill_stores"] == 0 and v["spill_loads"] == 0 for v in infos.values()), infos
    assert "Potential Performance Loss" not in log and "C7508" not in log


def test_sm90_timeline_build_exports_its_buffers_without_spills():
    """FA_SM90_DIAG_TIMELINE=1 (sm90/diag_timeline.cuh): the kernels tools/sm90_timeline.py
    times keep their registers, and the module holds the two buffers the tool reads by name."""
    keys = [k for k in SM90_KEYS if k.dtype == "bf16" and not k.paged and not k.transform
            and not k.split and k.head_dim in (64, 128)]
    assert {k.name for k in keys} >= {"fa_fwd_sm90_bf16_d64", "fa_fwd_sm90_bf16_d128",
                                      "fa_fwd_sm90_bf16_d128_wide"}
    cubin, log = cc.compile_for_arch(cc.kernel_source(keys), "90a",
                                     extra_options=["-DFA_SM90_DIAG_TIMELINE=1"])
    infos = cc.parse_ptxas_log(log)
    assert all(v["spill_stores"] == 0 and v["spill_loads"] == 0 for v in infos.values()), infos
    assert b"fa_sm90_timeline\0" in cubin and b"fa_sm90_timeline_span\0" in cubin
    default, _ = cc.compile_for_arch(cc.kernel_source(keys[:1]), "90a", verbose=False)
    assert b"fa_sm90_timeline" not in default  # off: nothing of it in the shipped kernels


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_plane_pre_pass_compiles_without_spills(arch):
    """cuda_src/f32_split.cu (the Hopper float32 kernel's pre-pass; plain CUDA, built for the
    device like the sm80 family)."""
    from cupy_flashattn._cuda.f32_planes import AMAX_NAME, SPLIT_NAME, split_source

    cubin, log = cc.compile_for_arch(split_source(), arch)
    infos = cc.parse_ptxas_log(log)
    assert set(infos) == {AMAX_NAME, SPLIT_NAME}, infos
    assert all(v["spill_stores"] == 0 and v["spill_loads"] == 0 and v["stack"] == 0
               for v in infos.values()), infos

