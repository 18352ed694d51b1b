"""device_facts.py: the host reads tile sizes, occupancy and shared memory from the compiler
(NVRTC evaluates kernel_traits.cuh / flash_decode.cu constexprs into a PTX array), never from a
regex over the headers or a copied formula.  Checked here against the layouts the headers
document, written out independently; the generated entry points static_assert the same values,
so NVRTC (the compile tests) fails on any drift."""

import json

import pytest

from helpers import require_nvrtc

require_nvrtc()

from cupy_flashattn._cuda import compile as cc  # noqa: E402
from cupy_flashattn._cuda import decode as dc  # noqa: E402
from cupy_flashattn._cuda import device_facts as df  # noqa: E402


def _prefill_smem(t):
    """Q tile + 2 stages of K and V tiles (bf16 rows; a V-split V tile holds head_dim / v_splits
    columns) + 4 slots x 2 arrays of block_n ints."""
    row, row_v = 2 * t.head_dim, 2 * t.head_dim // t.v_splits
    return t.block_m * row + 2 * t.block_n * (row + row_v) + 2 * 4 * t.block_n * 4


def _decode_smem(d, stages, v_splits=1):
    """Q (16 rows padded by 16 bytes) + max(4 warps x stages x (K + V) 16-row tiles of unpadded
    (swizzled) rows, fp32 merge buffer); a V-split CTA's V tiles and merge rows hold
    d / v_splits columns."""
    dv = d // v_splits
    return 16 * (d + 8) * 2 + max(4 * stages * 16 * (d + dv) * 2, 4 * 16 * (dv + 8) * 4)


def _decode_smem_fp8(d, stages):
    """Float8 K/V: Q (16 padded 16-bit rows) + max(4 warps x stages x (K + V) 16-row tiles of
    unpadded float8 rows, fp32 merge buffer) -- no float16 staging tile (the direct fragments
    read the float8 ring)."""
    return 16 * (d + 8) * 2 + max(4 * stages * 2 * 16 * d, 4 * 16 * (d + 8) * 4)


@pytest.mark.parametrize("d", cc.HEAD_DIM_BUCKETS)
def test_prefill_traits_come_from_the_compiler(d):
    t = cc.traits(d)
    facts = df.prefill_facts()[d]
    assert (t.block_m, t.block_n, t.num_warps, t.min_blocks_per_sm, t.q_in_regs) == (
        facts["kBlockM"], facts["kBlockN"], facts["kNWarps"], facts["kMinBlocksPerSm"],
        facts["kQInRegs"])
    assert t.smem_bytes == facts["kSmemBytes"] == _prefill_smem(t)
    assert t.block_m % (16 * t.num_warps) == 0 and t.block_n % 16 == 0


@pytest.mark.parametrize("d", dc.DECODE_BUCKETS)
def test_decode_traits_come_from_the_compiler(d):
    key = dc.DecodeKey("bf16", d)
    assert 1 <= key.min_blocks <= 4 and key.stages >= 2
    assert dc.smem_bytes(d) == _decode_smem(d, key.stages, key.v_splits)
    assert key.v_splits == (2 if d > 256 else 1)
    assert dc.smem_bytes(d) * key.min_blocks <= 227 * 1024  # fits an H100/H200 SM


@pytest.mark.parametrize("d", dc.FP8_KV_BUCKETS)
def test_fp8_decode_smem_comes_from_the_compiler(d):
    key = dc.DecodeKey("bf16", d, kv="e4m3")
    assert dc.smem_bytes(d, "e4m3") == dc.smem_bytes(d, "e5m2") == _decode_smem_fp8(d, key.stages)
    assert dc.smem_bytes(d, "e4m3") * key.min_blocks <= 227 * 1024


def test_tuning_override_smem_is_asked_of_the_compiler():
    t = cc.Traits(128, 128, 64, 8, 1, 1)  # not a shipped configuration
    assert t.smem_bytes == _prefill_smem(t)


def test_disk_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    df._facts_for.cache_clear()
    try:
        facts = df._all_facts()
        files = list(tmp_path.glob("cupy_flashattn_device_facts_*.json"))
        assert len(files) == 1
        assert json.loads(files[0].read_text())["decode"][str(dc.DECODE_BUCKETS[0])] == \
            facts["decode"][dc.DECODE_BUCKETS[0]]
        df._facts_for.cache_clear()
        assert df._all_facts() == facts  # read back from the file
    finally:
        df._facts_for.cache_clear()


def test_facts_follow_the_tuning_switches(monkeypatch):
    """A process that changes $CUPY_FLASHATTN_SM90_DEFINES reads the facts of the new switches
    (the memory caches are keyed by them): FA_SM90_BLOCKN_256=64 narrows the sm90 D = 256 key
    tile, so its shared memory shrinks too.  The decode kernel's one switch,
    FA_DECODE_FUSED_COMBINE=0 (the A/B baseline without the fused combine), changes code only:
    its facts stay those of the default build."""
    monkeypatch.delenv("CUPY_FLASHATTN_SM90_DEFINES", raising=False)
    shipped = cc.traits(256, "sm90")
    decode = dc.decode_facts()
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", "FA_SM90_BLOCKN_256=64")
    narrow = cc.traits(256, "sm90")
    assert narrow.block_n == 64 and narrow.smem_bytes < shipped.smem_bytes
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", "FA_DECODE_FUSED_COMBINE=0")
    assert dc.decode_facts() == decode
    monkeypatch.delenv("CUPY_FLASHATTN_SM90_DEFINES")
    assert cc.traits(256, "sm90") == shipped and shipped.block_n == 80
