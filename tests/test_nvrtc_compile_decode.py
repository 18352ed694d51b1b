"""CI (no GPU needed): every shipped decode-path instantiation -- the split-KV decode kernels
(flash_decode.cu, one per dtype x head-dim bucket, per dtype x bucket 64/128/256 x float8 K/V
format, and per dtype the 32-key-tile D = 128 kernel), the combine kernel and the
rotary/append kernel (kv_cache.cu) -- compiles with NVRTC for sm_80 and sm_90 (sm_80: the
float8 conversions in integer code; sm_90: cvt), with 0 bytes of spills and within the register
budget of its launch bounds.  One NVRTC program per (arch, source file)."""

from __future__ import annotations

import functools

import pytest

from helpers import require_nvrtc

require_nvrtc()

from cupy_flashattn._cuda import compile as cc  # noqa: E402
from cupy_flashattn._cuda import decode as dc  # noqa: E402

ARCHS = (80, 90)
KEYS = dc.decode_shipped_keys()
SMEM_LIMIT = 227 * 1024  # per block, sm_80 (163 KB) is checked separately below


@functools.cache
def _decode_log(arch: int) -> dict:
    cubin, log = cc.compile_for_arch(dc.decode_source(KEYS, combine=True), arch)
    assert cubin
    return cc.parse_ptxas_log(log)


@functools.cache
def _rope_log(arch: int) -> dict:
    cubin, log = cc.compile_for_arch(dc.rope_source(), arch)
    assert cubin
    return cc.parse_ptxas_log(log)


def _no_spills(name, info, arch, budget=255):
    assert info is not None, f"{name}: no ptxas -v record for sm_{arch}"
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (
        f"{name} sm_{arch}: {info['spill_stores']} B spill stores, {info['spill_loads']} B spill "
        f"loads (registers {info['registers']})"
    )
    assert info["registers"] <= budget, f"{name} sm_{arch}: {info['registers']} registers > {budget}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("key", KEYS, ids=str)
def test_decode_kernel_compiles_without_spills(arch, key):
    _no_spills(key.name, _decode_log(arch).get(key.name), arch, key.register_budget)


@pytest.mark.parametrize("arch", ARCHS)
def test_combine_and_rope_compile_without_spills(arch):
    _no_spills(dc.COMBINE_NAME, _decode_log(arch).get(dc.COMBINE_NAME), arch)
    _no_spills(dc.ROPE_NAME, _rope_log(arch).get(dc.ROPE_NAME), arch)


def test_shared_memory_fits():
    # sm_90: 227 KB per block; sm_80 (A100): 163 KB per block -- the D = 256 kernel needs sm_90
    # (or sm_80 with fewer stages; the launcher checks the device limit).
    for key in KEYS:
        assert key.smem_bytes <= SMEM_LIMIT, key
    assert dc.smem_bytes(64) <= 163 * 1024 and dc.smem_bytes(128) <= 163 * 1024
    for d in dc.TILE32_BUCKETS:  # the 32-key kernels fit an A100 too (2 ring slots)
        assert dc.smem_bytes(d, tile=32) <= 163 * 1024
    # Float8 K/V: the ring holds float8 rows (d + 16 bytes), read by ldmatrix directly -- no
    # 16-bit staging tile -- so the CTA needs less than the 16-bit kernel's.
    for d in dc.FP8_KV_BUCKETS:
        assert dc.smem_bytes(d, "e4m3") < dc.smem_bytes(d)


def test_fp8_keys_cover_both_formats_and_dtypes():
    fp8 = {(k.dtype, k.head_dim, k.kv) for k in KEYS if k.kv}
    assert fp8 == {(dt, d, kv) for dt in ("f16", "bf16") for d in (64, 128, 256)
                   for kv in ("e4m3", "e5m2")}
    assert dc.DecodeKey("bf16", 128, kv="e4m3").name == "fa_decode_bf16_d128_kve4m3"


def test_decode_names_flat_and_unique():
    names = [k.name for k in KEYS] + [dc.COMBINE_NAME, dc.ROPE_NAME]
    assert len(set(names)) == len(names)
    assert all(n.replace("_", "").isalnum() for n in names)


def test_decode_source_inlines_headers():
    src = dc.decode_source(KEYS)
    assert '#include "' not in src
    for name in ("common.cuh", "attn/params.cuh", "attn/block_info.cuh", "sm80/mma.cuh",
                 "attn/fp8.cuh"):
        assert f'/{name}"' in src


def test_decode_args_extend_the_prefill_params():
    """The decode kernel's packed struct is FwdParams' fields (compile.PARAMS, in order) plus
    its own extras, so the prefill launcher's fwd_values() fills both."""
    assert dc.DECODE_ARGS.names == tuple(n for _, n in cc.PARAMS) + tuple(n for _, n in dc.DECODE_EXTRA)
    assert cc.FWD_ARGS.names == tuple(n for _, n in cc.PARAMS)


#: The decode kernel's tuning switches away from the default build (flash_decode.cu) and the
#: keys they change: FA_DECODE_FUSED_COMBINE=0, the A/B baseline of the fused combine (on by
#: default since an H100 run verified it), builds the kernels without it.
SWITCHES = {
    "FA_DECODE_FUSED_COMBINE=0": lambda k: True,  # the combine kernel merges every split
    # The sweep switch of benchmarks/NOTES.md (stops 37-40) for the device's A/B runs: the
    # former 3 float8 CTAs per SM at D = 128 and 1 at D = 256 (D = 64 at 5 spills, so it is left
    # out).  (The 2-stage, 3-CTA 16-bit D = 128 ring, FA_DECODE_STAGES_D128=2,FA_DECODE_CTAS_D128=3,
    # is not listed: slower on MQA in stop 42, 69.7 against 67.0 us, and with the plain-logit
    # path, now the default, it spills 28 bytes on sm_80.)
    "FA_DECODE_FP8_CTAS_D128=3,FA_DECODE_FP8_CTAS_D256=1":
        lambda k: bool(k.kv) and k.head_dim in (128, 256),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("switches", list(SWITCHES))
def test_tuning_switches_compile_without_spills(arch, switches, monkeypatch):
    """Each switch stays buildable: the keys it changes, 0 spills, within their launch bounds'
    register budget (the facts -- shared memory, budgets -- under the same switches)."""
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", switches)
    keys = [k for k in KEYS if SWITCHES[switches](k)]
    src = dc.decode_source(keys, combine=False)
    for define in switches.split(","):
        assert f"#define {define.replace('=', ' ')}\n" in src
    cubin, log = cc.compile_for_arch(src, arch)
    infos = cc.parse_ptxas_log(log)
    for key in keys:
        _no_spills(key.name, infos.get(key.name), arch, key.register_budget)
