"""The CUDA launch plan as plain data (``_cuda.describe_launches``), decided without a GPU: which
kernels run, their grids, blocks, shared memory and split counts.  The plans that launch
(``PrefillPlan``, ``DecodePlan``) compute the same values through the same functions (``route``,
``select_kernel``, ``prefill_grid``, ``decode.plan``); these tests pin the decisions."""

import dataclasses

import numpy as np

import cupy_flashattn
import pytest

from helpers import require_nvrtc

require_nvrtc()  # traits and shared memory come from the compiler (device_facts.py)

from cupy_flashattn._cuda import describe_launches, route  # noqa: E402
from cupy_flashattn._cuda import compile as cc  # noqa: E402
from cupy_flashattn._cuda import decode as dc  # noqa: E402
from cupy_flashattn.problem import AttentionProblem  # noqa: E402

H100_SMS = 132


@pytest.fixture(autouse=True)
def mma_sync_decode(monkeypatch):
    """These tests pin the mma.sync decode kernel's plans; on compute capability 9.0 an MQA step
    would take the sm90 split kernel instead (its plans: tests/test_decode_sm90_plan.py)."""
    monkeypatch.setenv("CUPY_FLASHATTN_DECODE_SM90", "0")


def _problem(*, H=32, Hk=8, D=128, B=2, max_q=1, max_k=4096, varlen=False, paged=False,
             dtype=np.float16, softcap=0.0, alibi=False, num_splits=0, scale=0.1):
    rows = 64
    q = np.zeros((rows, H, D), dtype)
    k = np.zeros((16, 16, Hk, D) if paged else (rows, Hk, D), dtype)
    return AttentionProblem(
        q=q, k=k, v=k, out=np.zeros((rows, H, D), dtype),
        softmax_lse=np.zeros((H, rows), np.float32), batch_size=B,
        seqlen_q=0 if varlen else max_q, seqlen_k=0 if varlen else max_k, max_seqlen_q=max_q,
        max_seqlen_k=max_k, cu_seqlens_q=np.zeros(B + 1, np.int32) if varlen else None,
        cu_seqlens_k=np.zeros(B + 1, np.int32) if varlen else None,
        block_table=np.zeros((B, 8), np.int32) if paged else None,
        page_block_size=16 if paged else 0, softmax_scale=scale, softcap=softcap,
        alibi_slopes=np.zeros((B, H), np.float32) if alibi else None, num_splits=num_splits,
    )


def test_small_decode_runs_the_decode_kernel_split_to_fill_the_gpu():
    p = _problem(B=1, max_q=1, max_k=4096)
    assert route(p) == ("decode", None)
    (launch,) = describe_launches(p, sm_count=H100_SMS, device_cc=80)
    # GQA 32/8 at D = 128: one 16-row tile a kv head, so the 32-key kernel (one CTA per SM).
    assert launch["kernel"] == "fa_decode_f16_d128_t32" and launch["arch"] == "sm80"
    # 1 packed 16-row tile x 8 kv heads x 1 sequence = 8 CTAs: split the 4096 keys.
    assert launch["splits"] == dc.num_splits_heuristic(8, 4096, H100_SMS, 1) > 1
    assert launch["grid"] == (launch["splits"], 8, 1)
    assert launch["block"] == (dc.DECODE_THREADS,) and launch["smem"] == dc.smem_bytes(128, tile=32)


@pytest.mark.parametrize("H,Hk,D,fp8,switch,tile", [
    (32, 8, 128, False, "", 32), (8, 8, 128, False, "", 32), (16, 1, 128, False, "", 32),
    (32, 1, 128, False, "", 16),  # MQA: two 16-row tiles a kv head
    (32, 8, 64, False, "", 16), (32, 8, 256, False, "", 16),  # no 32-key kernel there
    (32, 8, 128, True, "", 16),  # float8 K/V keep 16-key tiles
    (32, 8, 128, False, "FA_DECODE_TILE32=0", 16),  # the A/B baseline
])
def test_decode_key_tiles(H, Hk, D, fp8, switch, tile, monkeypatch):
    """32-key warp tiles where a kv head has at most 16 packed rows, K/V are 16-bit and the head
    dim is 128 (decode.decode_tile); the key's own kernel, CTAs per SM and shared memory."""
    from cupy_flashattn import fp8 as f8

    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", switch)
    p = _problem(B=4, max_q=1, max_k=4096, H=H, Hk=Hk, D=D, paged=True)
    if fp8:
        p.k = p.v = np.zeros(p.k.shape, f8.FLOAT8_E4M3FN)
    key, m_blocks, splits = dc.plan(p, sm_count=H100_SMS)
    assert key.tile == tile and ("_t32" in key.name) == (tile == 32)
    (launch,) = describe_launches(p, sm_count=H100_SMS, device_cc=90)
    assert launch["kernel"] == key.name and launch["smem"] == key.smem_bytes
    if tile == 32:
        assert key.min_blocks == 1 and key.smem_bytes == dc.smem_bytes(128, tile=32)
        assert splits == dc.num_splits_heuristic(Hk * 4, 4096, H100_SMS, 1,
                                                 merge_rows=min(16, H // Hk))


def test_large_decode_batch_is_not_split_and_explicit_splits_win():
    p = _problem(B=64, max_q=1, max_k=4096)
    assert describe_launches(p, sm_count=H100_SMS, device_cc=80)[0]["splits"] == 1  # 512 CTAs fill 132 SMs
    p = _problem(B=64, max_q=1, max_k=4096, num_splits=3)
    assert describe_launches(p, sm_count=H100_SMS, device_cc=80)[0]["grid"] == (3, 8, 64)


def test_prefill_grid_block_and_shared_memory_come_from_the_tile_table():
    p = _problem(B=4, max_q=1000, max_k=1000, H=16, Hk=16, D=80, dtype=np.float32)
    assert route(p) == ("prefill", None)
    (launch,) = describe_launches(p, device_cc=80)
    # D = 80 runs in the 96 bucket; float32 on the float32 (3xTF32) kernel and its tile table.
    tr = cc.traits(96, "sm80", "f32")
    assert launch["kernel"] == "fa_fwd_f32_d96" and launch["arch"] == "sm80"
    assert launch["grid"] == (-(-1000 // tr.block_m), 16, 4)
    assert launch["block"] == (tr.num_threads,) and launch["smem"] == tr.smem_bytes
    cupy_flashattn.set_float32_precision("medium")  # float32 on the bf16 kernels
    try:
        (launch,) = describe_launches(p, device_cc=80)
    finally:
        cupy_flashattn.set_float32_precision("highest")
    tr = cc.traits(96)
    assert launch["kernel"] == "fa_fwd_bf16_d96" and launch["arch"] == "sm80"
    assert launch["grid"] == (-(-1000 // tr.block_m), 16, 4)
    assert launch["block"] == (tr.num_threads,) and launch["smem"] == tr.smem_bytes


@pytest.mark.parametrize("softcap,alibi,scale,transform", [
    (0.0, False, 0.1, False), (30.0, False, 0.1, True), (0.0, True, 0.1, True),
    (0.0, False, -0.5, True),  # a scale <= 0 cannot be folded into exp2 after the row max
])
def test_feature_flags_pick_the_transform_kernel(softcap, alibi, scale, transform):
    p = _problem(B=2, max_q=512, max_k=512, H=8, Hk=8, paged=True, softcap=softcap, alibi=alibi,
                 scale=scale)
    (launch,) = describe_launches(p, device_cc=80)
    assert launch["kernel"] == f"fa_fwd_f16_d128{'_transform' if transform else ''}_paged"


def test_mixed_varlen_batch_splits_between_the_two_kernels():
    p = _problem(B=8, max_q=300, max_k=2048, varlen=True)
    kind, limit = route(p)
    assert (kind, limit) == ("mixed", dc.decode_len_q_limit(32, 8))
    decode, prefill = describe_launches(p, sm_count=H100_SMS, device_cc=80)
    assert decode["kernel"].startswith("fa_decode_") and decode["splits"] == 1
    assert decode["len_q"] == (1, limit) and prefill["len_q"] == (limit + 1, None)
    assert prefill["kernel"] == "fa_fwd_f16_d128"


def test_decode_bucket_and_long_queries():
    p = _problem(B=1, max_q=1, D=200)  # D = 200 decodes in the 256 bucket
    assert describe_launches(p, sm_count=H100_SMS, device_cc=80)[0]["kernel"] == "fa_decode_f16_d256"
    p = _problem(B=1, max_q=64, H=8, Hk=8)  # 64 query rows of one head: prefill's job
    assert route(p) == ("prefill", None)


@pytest.mark.parametrize("H,Hk,max_q,D", [
    (32, 1, 1, 128), (32, 1, 1, 64), (32, 1, 1, 80),  # MQA: 32 rows, two 16-row tiles a head
    (32, 1, 2, 128),  # 64 rows: four tiles
    (16, 2, 3, 128),  # GQA g = 8, 3 queries: 24 rows, two tiles (8 rows of padding)
    (32, 8, 1, 128), (8, 8, 1, 128), (16, 1, 1, 128),  # 16 rows or fewer: one tile
    (32, 1, 1, 256), (32, 1, 1, 200),
])
def test_wide_groups_take_several_16_row_tiles(H, Hk, max_q, D):
    """More than 16 packed rows per kv head: the grid's m-blocks are 16-row tiles, and the
    launch is the bucket's one decode kernel with its own shared memory."""
    p = _problem(B=4, max_q=max_q, max_k=4096, H=H, Hk=Hk, D=D, paged=True)
    assert route(p) == ("decode", None)
    key, m_blocks, splits = dc.plan(p, sm_count=H100_SMS)
    m = -(-max_q * (H // Hk) // 16)
    assert key == dc.DecodeKey("f16", dc.decode_bucket(D), tile=dc.decode_tile(m, dc.decode_bucket(D)))
    assert m_blocks == m
    (launch,) = describe_launches(p, sm_count=H100_SMS, device_cc=90)
    assert launch["kernel"] == key.name and launch["grid"] == (splits * m_blocks, Hk, 4)
    assert launch["smem"] == key.smem_bytes


def test_mqa_b1_splits_are_capped_by_the_merge():
    """MQA 32/1, B = 1: two 16-row CTAs; the plan's split count is the merge-capped one."""
    p = _problem(B=1, max_q=1, max_k=32768, H=32, Hk=1, D=128, paged=True)
    key, m_blocks, splits = dc.plan(p, sm_count=H100_SMS)
    assert key.tile == 16 and m_blocks == 2 and splits == dc.merge_split_cap(32768, 16) == 42


def test_float8_mqa_takes_two_16_row_tiles():
    from cupy_flashattn import fp8

    p = _problem(B=4, max_q=1, max_k=4096, H=32, Hk=1, D=128, paged=True)
    p.k = p.v = np.zeros(p.k.shape, fp8.FLOAT8_E4M3FN)
    key, m_blocks, _ = dc.plan(p, sm_count=H100_SMS)
    assert key == dc.DecodeKey("f16", 128, kv="e4m3") and m_blocks == 2


def test_kernel_keys_name_their_family_and_build_from_its_directory():
    """The arch field picks cuda_src/<arch>/; sm80's entry-point names predate the field."""
    key = cc.KernelKey("bf16", 128, transform=True, paged=True)
    assert key.arch == "sm80" and key.name == "fa_fwd_bf16_d128_transform_paged"
    assert dc.DecodeKey("f16", 64).name == "fa_decode_f16_d64"
    assert cc.family_prefix("fwd", "sm90") == "fa_fwd_sm90"
    with pytest.raises(ValueError, match="arch"):
        cc.KernelKey("bf16", 128, arch="sm75")
    assert 'cuda_src/sm80/flash_fwd.cu"' in cc.kernel_source([key])


def test_float32_and_float64_run_the_precise_kernels():
    """float64 goes to the mma.sync float64 kernel on 8.x and 9.0 alike, for every query length
    (no decode kernel); float32 (default "highest") to the mma.sync float32 kernel on 8.x and on
    a 9.0 device to the sm90 float32 kernel (float16 planes) for dense / varlen K/V of D <= 128
    -- paged K/V, a KV cache's lengths and larger head dims stay on sm80; "high" picks the TF32
    instantiation on sm80 (and the planes where they serve), "medium" the bf16 kernels of the
    device's family."""
    for dtype, tag in ((np.float32, "f32"), (np.float64, "f64")):
        for cc_ in (80, 90):
            for max_q in (1, 1000):
                p = _problem(B=2, max_q=max_q, max_k=700, H=8, Hk=2, D=64, dtype=dtype)
                assert route(p) == ("prefill", None)
                (launch_,) = describe_launches(p, sm_count=H100_SMS, device_cc=cc_)
                if tag == "f32" and cc_ == 90:
                    tr = cc.traits(64, "sm90", "f32")
                    assert launch_["kernel"] == "fa_fwd_sm90_f32_d64" and launch_["arch"] == "sm90"
                    assert launch_["block"] == (384,) and launch_["smem"] == tr.smem_bytes
                    continue
                tr = cc.traits(64, "sm80", tag)
                assert launch_["kernel"] == f"fa_fwd_{tag}_d64" and launch_["arch"] == "sm80"
                assert launch_["grid"] == (-(-max_q // tr.block_m), 8, 2) and launch_["smem"] == tr.smem_bytes
    f32 = dict(B=2, max_q=1000, max_k=700, H=8, Hk=2, dtype=np.float32)
    for kw, kernel in ((dict(D=128, varlen=True), "fa_fwd_sm90_f32_d128"),
                       (dict(D=80, softcap=30.0), "fa_fwd_sm90_f32_d128_transform"),
                       (dict(D=128, paged=True), "fa_fwd_f32_d128_paged"),
                       (dict(D=192), "fa_fwd_f32_d192")):
        assert describe_launches(_problem(**f32, **kw), device_cc=90)[0]["kernel"] == kernel, kw
    cache = dataclasses.replace(_problem(**f32, D=64), seqused_k=np.zeros(2, np.int32))
    assert describe_launches(cache, device_cc=90)[0]["kernel"] == "fa_fwd_f32_d64"
    p = _problem(**f32, D=64)
    try:
        cupy_flashattn.set_float32_precision("high")  # TF32 on sm80; sm90 runs the planes, faster
        assert describe_launches(p, device_cc=80)[0]["kernel"] == "fa_fwd_tf32_d64"
        assert describe_launches(p, device_cc=90)[0]["kernel"] == "fa_fwd_sm90_f32_d64"
        cupy_flashattn.set_float32_precision("medium")
        assert describe_launches(p, device_cc=90)[0]["kernel"] == "fa_fwd_sm90_bf16_d64"
    finally:
        cupy_flashattn.set_float32_precision("highest")


def test_a_9_0_device_runs_prefill_on_the_hopper_family():
    """Compute capability 9.0 picks the sm90 family (its own buckets: D = 80 -> 128); decode
    stays sm80; forcing works both ways."""
    from cupy_flashattn._cuda import launch

    p = _problem(B=4, max_q=1000, max_k=1000, H=16, Hk=16, D=80, dtype=np.float16)
    (launch_,) = describe_launches(p, device_cc=90)
    tr = cc.traits(128, "sm90")
    assert launch_["kernel"] == "fa_fwd_sm90_f16_d128" and launch_["arch"] == "sm90"
    # No causal / local window and keys at least SM90_WIDE_MIN_KEYS long: the wide key tile.
    long_keys = dataclasses.replace(p, seqlen_k=cc.SM90_WIDE_MIN_KEYS, max_seqlen_k=cc.SM90_WIDE_MIN_KEYS)
    assert describe_launches(long_keys, device_cc=90)[0]["kernel"] == "fa_fwd_sm90_f16_d128_wide"
    assert cc.traits(128, "sm90", wide=True).block_n > tr.block_n
    for window in ((-1, 0), (100, -1), (-1, 100)):  # causal, local: the narrow tile
        banded = dataclasses.replace(long_keys, window_left=window[0], window_right=window[1])
        assert describe_launches(banded, device_cc=90)[0]["kernel"] == "fa_fwd_sm90_f16_d128"
    # Softcap / ALiBi and paged K/V keep the narrow tile too.
    n = cc.SM90_WIDE_MIN_KEYS
    for other in (dict(softcap=30.0), dict(alibi=True), dict(paged=True)):
        name = describe_launches(_problem(B=4, max_q=1000, max_k=n, H=16, Hk=16, **other),
                                 device_cc=90)[0]["kernel"]
        assert not name.endswith("_wide"), (other, name)
    # Persistent: 8 query tiles x 16 heads x 4 sequences = 512 tiles on one CTA per SM.
    assert launch_["grid"] == (H100_SMS, 1, 1) and tr.block_m == 128
    small = _problem(B=1, max_q=200, max_k=200, H=4, Hk=4, D=128)
    assert describe_launches(small, device_cc=90)[0]["grid"] == (2 * 4, 1, 1)  # fewer tiles than SMs
    assert launch_["block"] == (384,) and launch_["smem"] == tr.smem_bytes <= 227 * 1024
    p = _problem(B=2, max_q=512, max_k=512, H=8, Hk=8, D=256, paged=True, softcap=30.0)
    assert (describe_launches(p, device_cc=90)[0]["kernel"]
            == "fa_fwd_sm90_f16_d256_transform_paged")
    p = _problem(B=1, max_q=1, max_k=4096)
    assert describe_launches(p, sm_count=H100_SMS, device_cc=90)[0]["arch"] == "sm80"
    p = _problem(B=4, max_q=1000, max_k=1000, H=16, Hk=16, D=128)
    assert describe_launches(p, device_cc=80)[0]["arch"] == "sm80"
    assert describe_launches(p, device_cc=90, arch="sm80")[0]["kernel"] == "fa_fwd_f16_d128"
    try:
        launch.force_prefill_arch("sm80")
        assert describe_launches(p, device_cc=90)[0]["arch"] == "sm80"
        launch.force_prefill_arch("sm90")
        with pytest.raises(ValueError, match="9.0"):
            describe_launches(p, device_cc=80)
    finally:
        launch.force_prefill_arch(None)


def test_info_line_names_the_prefill_family_and_how_it_was_chosen(monkeypatch):
    from cupy_flashattn._cuda.launch import PREFILL_ARCH_ENV, describe_prefill_path

    monkeypatch.delenv(PREFILL_ARCH_ENV, raising=False)
    assert describe_prefill_path(90).startswith("sm90 (wgmma") and "auto for compute capability 9.0" in describe_prefill_path(90)
    assert "float32: 'highest' (3xTF32, float32 accuracy" in describe_prefill_path(80)
    assert "float32: 'highest' (float32 accuracy: float16 hi / lo planes on sm90" in describe_prefill_path(90)
    assert describe_prefill_path(80).startswith("sm80 (mma.sync")
    monkeypatch.setenv(PREFILL_ARCH_ENV, "sm80")
    assert describe_prefill_path(90).startswith("sm80") and f"{PREFILL_ARCH_ENV}=sm80" in describe_prefill_path(90)
    monkeypatch.setenv(PREFILL_ARCH_ENV, "sm90")
    assert describe_prefill_path(86).startswith("none:") and "9.0" in describe_prefill_path(86)


def _makespan(work, ctas):
    """The heaviest CTA's work when CTA c runs tile c of even rounds of ``ctas`` tiles and tile
    ctas - 1 - c of odd rounds (flash_fwd.cu's tile_of_round), counted tile by tile."""
    per_cta = [0] * ctas
    for i, w in enumerate(work):
        r, j = divmod(i, ctas)
        per_cta[ctas - 1 - j if r % 2 else j] += w
    return max(per_cta)


def test_persistent_grid_balances_causal_tiles_over_the_ctas():
    """Causal S = 2k..16k (16k tokens per batch): query tile m of a head visits 16 .. 1 (S = 2k)
    key tiles.  The chosen CTA count and the snake order must split the work within 4% of
    even; the plain order c, c + 132, ... would give CTA 0 the tiles 16, 12, 8, 4 over and
    over and CTA 3 13, 9, 5, 1 (a factor 4 shared with 16)."""
    from cupy_flashattn._cuda import schedule

    tr = cc.traits(128, "sm90")
    for S in (2048, 4096, 8192, 16384):
        p = _problem(B=16384 // S, max_q=S, max_k=S, H=16, Hk=16, D=128)
        p.window_right = 0
        (ctas, one, one_) = schedule.persistent_grid(p, tr, H100_SMS)
        assert (one, one_) == (1, 1) and H100_SMS - 16 <= ctas <= H100_SMS
        tiles_m = S // 128
        per_head = list(schedule._tile_work(p, tiles_m, 128, 128))
        assert per_head == [k + 1 for k in range(tiles_m, 0, -1)]  # heavy first, + 1 of fill
        work = per_head * (16 * p.batch_size)
        assert schedule.snake_makespan(np.array(work), ctas) == _makespan(work, ctas)
        assert _makespan(work, ctas) <= 1.04 * sum(work) / H100_SMS, S
        if S == 2048:
            plain = max(sum(work[c::H100_SMS]) for c in range(H100_SMS))
            assert plain > 1.15 * sum(work) / H100_SMS  # what the snake avoids
    p.window_right = -1  # no window: every tile costs the same, every SM gets a CTA
    assert schedule.persistent_grid(p, tr, H100_SMS) == (H100_SMS, 1, 1)


def test_sequences_of_unknown_lengths_claim_tiles_dynamically_on_sm90():
    """Varlen / paged (cu_seqlens, seqused_k): the host does not know the tiles' work, so one
    CTA per SM claims tiles from a counter (sm90/tile_scheduler.cuh) instead of static rounds;
    known lengths keep the static rounds (no counter); few tiles get one CTA each."""
    from cupy_flashattn._cuda import schedule

    tr = cc.traits(128, "sm90")
    p = _problem(B=8, max_q=2048, max_k=2048, H=16, Hk=16, D=128, varlen=True)
    assert not schedule.uniform_lengths(p)
    grid = schedule.persistent_grid(p, tr, H100_SMS)
    assert grid == (H100_SMS, 1, 1) and schedule.dynamic_schedule(p, tr, "sm90", grid)
    assert not schedule.dynamic_schedule(p, tr, "sm80", grid)
    one_per_tile = (16 * 16 * 8, 1, 1)  # CUPY_FLASHATTN_SM90_GRID=tiles: one round, no counter
    assert not schedule.dynamic_schedule(p, tr, "sm90", one_per_tile)
    few = _problem(B=1, max_q=256, max_k=256, H=4, Hk=4, D=128, varlen=True)  # 8 tiles
    assert schedule.persistent_grid(few, tr, H100_SMS) == (8, 1, 1)
    assert not schedule.dynamic_schedule(few, tr, "sm90", (8, 1, 1))
    p = _problem(B=8, max_q=2048, max_k=2048, H=16, Hk=16, D=128)
    assert schedule.uniform_lengths(p) and schedule.persistent_grid(p, tr, H100_SMS) == (H100_SMS, 1, 1)
    assert not schedule.dynamic_schedule(p, tr, "sm90", (H100_SMS, 1, 1))


def test_sm90_grid_switch_for_ab_runs_and_many_round_tests(monkeypatch):
    """CUPY_FLASHATTN_SM90_GRID: "tiles" = one CTA per tile; "ctas=N" = at most N persistent
    CTAs for any problem (tests/gpu/test_sm90_persistent.py); default persistent."""
    from cupy_flashattn._cuda import schedule

    tr = cc.traits(128, "sm90")
    p = _problem(B=4, max_q=1000, max_k=1000, H=16, Hk=16, D=128, varlen=True)
    monkeypatch.setenv(schedule.SM90_GRID_ENV, "ctas=3")
    assert schedule.launch_grid(p, tr, "sm90", sm_count=H100_SMS) == (3, 1, 1)
    monkeypatch.setenv(schedule.SM90_GRID_ENV, "tiles")
    assert schedule.launch_grid(p, tr, "sm90", sm_count=H100_SMS) == (8 * 16 * 4, 1, 1)
    assert schedule.launch_grid(p, tr, "sm80", sm_count=H100_SMS) == (8, 16, 4)


@pytest.mark.parametrize("D,bucket", [(264, 384), (384, 384), (448, 512), (512, 512)])
@pytest.mark.parametrize("device_cc", [80, 90])
def test_head_dims_above_256_run_v_split_kernels_on_both_architectures(D, bucket, device_cc):
    """sm90 stops at 256: prefill of such a head dim is the sm80 kernel with two V-split CTAs
    per (query tile, head); a decode step the decode kernel with two per (tile, kv head)."""
    p = _problem(B=3, max_q=700, max_k=900, H=8, Hk=2, D=D, dtype=np.float16)
    assert route(p) == ("prefill", None)
    (launch,) = describe_launches(p, sm_count=H100_SMS, device_cc=device_cc)
    tr = cc.traits(bucket)
    assert tr.v_splits == 2
    assert launch["kernel"] == f"fa_fwd_f16_d{bucket}" and launch["arch"] == "sm80"
    assert launch["grid"] == (-(-700 // tr.block_m), 8 * 2, 3)
    assert launch["smem"] == tr.smem_bytes <= 227 * 1024  # a Hopper CTA's limit
    p = _problem(B=3, max_q=1, max_k=4096, H=8, Hk=2, D=D, dtype=np.float16)
    assert route(p) == ("decode", None)
    (launch,) = describe_launches(p, sm_count=H100_SMS, device_cc=device_cc)
    key = dc.DecodeKey("f16", bucket)
    assert key.v_splits == 2 and launch["kernel"] == f"fa_decode_f16_d{bucket}"
    # 1 tile x 2 kv heads x 2 V-splits x 3 sequences = 12 CTAs: split the keys.
    assert launch["splits"] == dc.num_splits_heuristic(12, 4096, H100_SMS, key.min_blocks) > 1
    assert launch["grid"] == (launch["splits"], 2 * 2, 3)


def test_the_validated_head_dim_limits_are_the_kernels_buckets():
    """validate.py's limits restate the largest bucket of each kernel table: they must agree."""
    from cupy_flashattn import validate

    assert validate.MAX_HEAD_DIM == validate.MAX_GPU_HEAD_DIM == cc.HEAD_DIM_BUCKETS[-1]
    assert validate.MAX_GPU_HEAD_DIM == dc.DECODE_BUCKETS[-1]
    assert validate.MAX_GPU_HEAD_DIM_F32 == cc.PRECISE_HEAD_DIM_BUCKETS["f32"][-1]
    assert validate.MAX_GPU_HEAD_DIM_F64 == cc.PRECISE_HEAD_DIM_BUCKETS["f64"][-1]


def test_float8_kv_plans_the_float8_decode_kernel():
    """A float8 cache (k / v in ml_dtypes float8) plans the decode kernel that reads float8 rows
    (DecodeKey.kv), with its own shared-memory size, for every query length; 16-bit K/V keep
    the plain kernel; head dims that are not whole 16-byte float8 chunks are refused by name."""
    import copy

    from cupy_flashattn import fp8

    p = _problem(B=4, max_q=1, max_k=4096, H=32, Hk=8, D=128, paged=True, dtype=np.float16)
    assert dc.plan(p, sm_count=H100_SMS)[0].kv == ""
    for dt, fmt in ((fp8.FLOAT8_E4M3FN, "e4m3"), (fp8.FLOAT8_E5M2, "e5m2")):
        p8 = copy.copy(p)
        p8.k = p8.v = np.zeros(p.k.shape, dt)
        key = dc.plan(p8, sm_count=H100_SMS)[0]
        assert key == dc.DecodeKey("f16", 128, kv=fmt) and key.name == f"fa_decode_f16_d128_kv{fmt}"
        assert dc.smem_bytes(128, fmt) < dc.smem_bytes(128)  # float8 rows: a smaller ring
    # Every query length goes to the decode kernel (the only one that reads float8 K/V).
    p8 = _problem(B=2, max_q=64, max_k=4096, H=8, Hk=8, D=128, paged=True, dtype=np.float16)
    assert route(p8) == ("prefill", None)
    p8.k = p8.v = np.zeros(p8.k.shape, fp8.FLOAT8_E4M3FN)
    assert route(p8) == ("decode", None)
    (launch,) = describe_launches(p8, sm_count=H100_SMS, device_cc=90)
    assert launch["kernel"] == "fa_decode_f16_d128_kve4m3"
    assert launch["smem"] == dc.smem_bytes(128, "e4m3")
    p8 = copy.copy(p)
    p8.q = p8.out = np.zeros((64, 32, 72), np.float16)
    p8.k = p8.v = np.zeros((16, 16, 8, 72), fp8.FLOAT8_E4M3FN)
    with pytest.raises(ValueError, match="multiple of 16"):
        dc.plan(p8, sm_count=H100_SMS)


def test_float8_bytes_plan_like_float8_arrays_and_their_splits_balance_waves():
    """uint8 K/V with ``kv_dtype`` (a GPU float8 cache: CuPy has no float8 dtype) plan the same
    float8 kernel as float8 arrays.  The float8 kernel runs 4 CTAs per SM at D = 128 (stop 38),
    so B = 64 x 8 kv heads (512 CTAs) is 0.97 of one wave of an H100's 528 slots and stays
    unsplit; at 3 CTAs per SM (396 slots, 1.3 waves) the wave balance splits it in 2."""
    import copy

    from cupy_flashattn import fp8

    p = _problem(B=64, max_q=1, max_k=4096, H=32, Hk=8, D=128, paged=True, dtype=np.float16)
    p8 = copy.copy(p)
    p8.k = p8.v = np.zeros(p.k.shape, np.uint8)
    p8.kv_dtype = fp8.FLOAT8_E4M3FN
    assert p8.kv_float8 == fp8.FLOAT8_E4M3FN and p.kv_float8 is None
    key, m_blocks, splits = dc.plan(p8, sm_count=H100_SMS)
    assert key.name == "fa_decode_f16_d128_kve4m3" and key.min_blocks == 4
    assert m_blocks * 8 * 64 == 512 and splits == 1
    assert dc.num_splits_heuristic(512, 4096, H100_SMS, 4, balance_waves=True) == 1
    assert dc.plan(p, sm_count=H100_SMS)[2] == 1
    assert dc.num_splits_heuristic(512, 4096, H100_SMS, 3) == 1  # flash-attn's rule: full grid
    assert dc.num_splits_heuristic(512, 4096, H100_SMS, 3, balance_waves=True) == 2
    # A grid that is already close to whole waves stays unsplit.
    assert dc.num_splits_heuristic(396 * 2, 4096, H100_SMS, 3, balance_waves=True) == 1


def test_small_grids_split_until_every_sm_has_a_cta():
    """B = 1 (8 CTAs on 132 SMs): flash-attn's wave rule, at least 256 keys a split, gives 2
    splits at context 512 and 14 at 4096; a step is then one CTA's latency chain, so the grid
    splits until each SM has a CTA (16 splits at 8 CTAs), down to 64 keys a split."""
    assert dc.num_splits_heuristic(8, 512, H100_SMS, 2) == 8       # 64 keys a split
    assert dc.num_splits_heuristic(8, 4096, H100_SMS, 2) == 16     # 132 // 8
    assert dc.num_splits_heuristic(8, 32768, H100_SMS, 2) == 29    # the wave rule's count stays
    assert dc.num_splits_heuristic(8, 100, H100_SMS, 2) == 2
    assert dc.num_splits_heuristic(8, 64, H100_SMS, 2) == 1
    assert dc.num_splits_heuristic(16, 4096, H100_SMS, 2) == 14    # the wave rule's count is more
    assert dc.num_splits_heuristic(8, 512, H100_SMS, 3, balance_waves=True) == 8
    # Capped by the split merge's cost (merge_rows: real packed rows a CTA): 16 rows a CTA (MQA)
    # take 15 splits at context 4096 and 42 at 32768 where the rules above take 64 and 109;
    # GQA 32/8's 4 rows (one a merging warp) leave its grid's counts as they were.
    assert dc.num_splits_heuristic(2, 4096, H100_SMS, 2, merge_rows=16) == 15
    assert dc.num_splits_heuristic(2, 4096, H100_SMS, 2) == 64
    assert dc.num_splits_heuristic(2, 32768, H100_SMS, 2, merge_rows=16) == 42
    assert dc.num_splits_heuristic(2, 32768, H100_SMS, 2) == 109
    assert dc.num_splits_heuristic(8, 4096, H100_SMS, 1, merge_rows=4) == 16
    assert dc.num_splits_heuristic(8, 32768, H100_SMS, 4, balance_waves=True, merge_rows=4) == \
        dc.num_splits_heuristic(8, 32768, H100_SMS, 4, balance_waves=True) == 57
    assert [dc.merge_split_cap(32768, r) for r in (1, 4, 5, 16)] == [83, 83, 59, 42]
    # 8 CTAs of 16 rows at ctx 8192: the wave rule's 28 is past the cap (21), so one CTA per
    # SM (16), the count measured fastest.
    assert dc.num_splits_heuristic(8, 8192, H100_SMS, 2) == 28
    assert dc.num_splits_heuristic(8, 8192, H100_SMS, 2, merge_rows=16) == 16
    # More CTAs than SMs: the wave rule alone (200 CTAs on 264 slots: 5 splits, 3.8 waves).
    assert dc.num_splits_heuristic(200, 4096, H100_SMS, 2) == 5
    assert dc.num_splits_heuristic(8, 10 ** 6, H100_SMS, 2, max_splits=128) <= 128
