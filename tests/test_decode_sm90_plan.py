"""The swapped MQA decode plan (_cuda/decode_sm90.py) decided without a GPU: which decode steps
the sm90 split-KV kernel takes on a compute capability 9.0 device, its split counts and grid,
and the split kernels CI compiles (tests/test_nvrtc_compile.py builds every shipped one)."""

import numpy as np
import pytest

from helpers import require_nvrtc

require_nvrtc()  # traits come from the compiler (device_facts.py)

from cupy_flashattn._cuda import compile as cc  # noqa: E402
from cupy_flashattn._cuda import describe_launches, route  # noqa: E402
from cupy_flashattn._cuda import decode  # noqa: E402
from cupy_flashattn._cuda import decode_sm90 as ds  # noqa: E402
from cupy_flashattn.problem import AttentionProblem  # noqa: E402

SMS = 132


def _problem(*, H=32, Hk=1, D=128, B=4, Sq=1, max_k=4096, paged=True, dtype=np.float16,
             window_left=-1, alibi=False, softcap=0.0, num_splits=0, varlen=False,
             lse_unread=False, sinks=False):
    q = np.zeros((B * Sq, H, D), dtype)
    k = np.zeros((64, 16, Hk, D) if paged else (B * max_k, Hk, D), dtype)
    return AttentionProblem(
        q=q, k=k, v=k, out=np.zeros((B * Sq, H, D), dtype),
        softmax_lse=np.zeros((H, B * Sq), np.float32), batch_size=B, seqlen_q=Sq,
        seqlen_k=max_k, max_seqlen_q=Sq, max_seqlen_k=max_k,
        cu_seqlens_q=np.arange(B + 1, dtype=np.int32) * Sq if varlen else None,
        seqused_k=np.full(B, max_k, np.int32),
        block_table=np.zeros((B, 256), np.int32) if paged else None,
        page_block_size=16 if paged else 0, softmax_scale=0.1, window_left=window_left,
        softcap=softcap, alibi_slopes=np.zeros((B, H), np.float32) if alibi else None,
        num_splits=num_splits, lse_unread=lse_unread,
        sinks=np.zeros(H, np.float32) if sinks else None)


def test_mqa_decode_takes_the_sm90_split_kernel_on_hopper_only():
    p = _problem()
    assert route(p, device_cc=90) == ("decode_sm90", None)
    assert route(p, device_cc=80) == ("decode", None)
    (launch,) = describe_launches(p, sm_count=SMS, device_cc=90)
    assert launch["kind"] == "decode_sm90" and launch["kernel"] == "fa_fwd_sm90_f16_d128_paged_split"
    # 4 sequences x 8 runs of 4 of the 32 key tiles.
    assert launch["splits"] == 8 and launch["grid"] == (32, 1, 1)


@pytest.mark.parametrize("change", [
    dict(Hk=2), dict(Hk=8), dict(H=8), dict(Sq=2), dict(varlen=True), dict(window_left=64),
    dict(alibi=True), dict(D=59), dict(D=320), dict(dtype=np.float32),
])
def test_what_the_swap_cannot_serve_keeps_the_other_kernels(change):
    """GQA (the kv heads' rows are not one strided run of q), fewer than 16 heads, several
    query tokens or varlen queries, a left window or ALiBi (per-position), a head dim that is
    not a multiple of 8 or above 256, float32."""
    assert route(_problem(**change), device_cc=90)[0] != "decode_sm90"


def test_strided_queries_keep_the_decode_kernel():
    """q rows further apart than H * D (q sliced from a packed QKV tensor): (B * H, 1, D) would
    not be a view of the same bytes."""
    p = _problem()
    packed = np.zeros((p.q.shape[0], 3 * p.num_heads, p.head_dim), p.q.dtype)
    p.q = packed[:, : p.num_heads]
    assert route(p, device_cc=90) == ("decode", None)


def test_switch_and_unshipped(monkeypatch):
    # The unshipped split kernel (it spills): D = 256 with softcap over pages.
    assert route(_problem(D=256, softcap=30.0), device_cc=90)[0] == "decode"
    assert route(_problem(D=200, softcap=30.0, paged=False), device_cc=90)[0] == "decode_sm90"
    assert route(_problem(D=256), device_cc=90)[0] == "decode_sm90"
    assert route(_problem(softcap=30.0), device_cc=90)[0] == "decode_sm90"
    monkeypatch.setenv(ds.DECODE_SM90_ENV, "0")
    assert route(_problem(), device_cc=90) == ("decode", None)


@pytest.mark.parametrize("B,ctx,splits", [
    (64, 4096, 2), (16, 16384, 8), (1, 32768, 32), (4, 8192, 16), (2, 4096, 8),
    (1, 4096, 16), (1, 1024, 4), (2, 2048, 8),
    (1, 100, 1), (1, 129, 1), (132, 4096, 1), (300, 4096, 1),
])
def test_split_counts(B, ctx, splits):
    """One item per SM at most (B x splits <= 132), SWAP_MAX_SPLITS at most, 4 key tiles (of
    128 keys) a run at least -- 2 where that leaves fewer than 16 runs in all (B = 1 ctx 4096:
    16 x 2 tiles, not 8 x 4; B = 2 ctx 4096 keeps 8 x 4) -- and no run without a key tile."""
    p = _problem(B=B, max_k=ctx)
    assert ds.swapped_splits(p, 128, SMS) == splits
    s = ds.swapped_launch(p, SMS)
    assert s.splits == splits and s.grid == (min(B * splits, SMS), 1, 1)
    assert s.dynamic == (B * splits > SMS)  # seqused_k: lengths on the device


@pytest.mark.parametrize("B,ctx,lse_unread,splits,direct", [
    (64, 4096, True, 1, True),  # fills 0.35 of the SMs, LSE unread: one split, no combine
    (48, 4096, True, 1, True),
    (64, 4096, False, 2, False),  # the LSE is read in (H, B) order: partials + combine
    (32, 8192, True, 4, False),  # below the fill: splits and the combine win (stop 45)
    (300, 4096, True, 1, True),
    (1, 100, False, 1, True),  # one sequence: the kernel's (B, H) LSE is the caller's (H, B)
    (1, 4096, False, 16, True),  # 16 splits merged in their cluster (test_cluster_merge_rule)
])
def test_direct_output(B, ctx, lse_unread, splits, direct):
    """Where one split (or a cluster of them) stores straight into out / softmax_lse
    (SWAP_DIRECT_MIN_FILL, direct_output_applies), which describe_launches reports as a launch
    without combine."""
    p = _problem(B=B, max_k=ctx, lse_unread=lse_unread)
    s = ds.swapped_launch(p, SMS)
    assert (s.splits, s.direct) == (splits, direct)
    (launch,) = describe_launches(p, sm_count=SMS, device_cc=90)
    assert launch["combine"] == (not direct)


@pytest.mark.parametrize("change", [dict(sinks=True), dict(D=256), dict(B=2)])
def test_direct_output_needs_no_sinks_a_kernel_with_it_and_an_lse_in_order(change):
    """Sinks join in the combine; the D = 256 split kernels have no direct store
    (kSplitDirectOut); two sequences whose LSE is read need its (H, B) order."""
    p = _problem(**{"B": 1, "max_k": 100, **change})
    assert not ds.direct_output_applies(p) and ds.swapped_launch(p, SMS).direct is False


def test_direct_output_buckets_agree_with_the_kernel_traits():
    """SWAP_DIRECT_MAX_HEAD_DIM is the host's copy of sm90/kernel_traits.cuh kSplitDirectOut."""
    from cupy_flashattn._cuda.device_facts import _evaluate
    from cupy_flashattn._cuda.source import build_source

    kernel = _evaluate(build_source("sm90/kernel_traits.cuh"),
                       [f"fa::Sm90FwdTraits<{d}>::kSplitDirectOut" for d in cc.SM90_HEAD_DIM_BUCKETS])
    assert [bool(x) for x in kernel] == [d <= ds.SWAP_DIRECT_MAX_HEAD_DIM for d in cc.SM90_HEAD_DIM_BUCKETS]


@pytest.mark.parametrize("forced,expect", [(1, 1), (3, 3), (70, 32), (5, 5)])
def test_forced_split_counts_never_leave_a_run_empty(forced, expect):
    """A user's num_splits is honoured up to the key tiles (32 at ctx 4096), rounded so that
    every run has a tile: ceil(32 / ceil(32 / s))."""
    assert ds.swapped_splits(_problem(max_k=4096, num_splits=forced), 128, SMS) == expect


def test_split_kernels_are_shipped_for_every_bucket():
    keys = [k for k in cc.shipped_keys("sm90") if k.split]
    assert len(keys) == 2 * len(cc.SM90_HEAD_DIM_BUCKETS) * 4 - 2 * len(cc.SM90_SPLIT_UNSHIPPED)
    assert all(k.name.endswith("_split") for k in keys)
    assert {k.head_dim for k in keys} == set(cc.SM90_HEAD_DIM_BUCKETS)
    with pytest.raises(ValueError):
        cc.KernelKey("bf16", 128, arch="sm80", split=True)


class _FakeCupy:
    """Enough of CuPy for Sm90DecodePlan.stream_buffers: a current stream and NumPy arrays."""

    class cuda:  # noqa: N801
        stream_ptr = 1

        @classmethod
        def get_current_stream(cls):
            return type("Stream", (), {"ptr": cls.stream_ptr})()

    empty = staticmethod(np.empty)
    zeros = staticmethod(np.zeros)


@pytest.mark.parametrize("keep,dynamic", [(True, True), (True, False), (False, True)])
def test_partials_and_counter_are_kept_per_stream(monkeypatch, keep, dynamic):
    """Small partials and the dynamic schedule's counter are made once per stream and reused;
    partials too large to keep are new every call, the counter still kept."""
    monkeypatch.setitem(__import__("sys").modules, "cupy", _FakeCupy)
    plan = object.__new__(ds.Sm90DecodePlan)
    plan.oacc_shape, plan.lacc_shape = (2, 3, 32, 8), (2, 96)
    if not keep:  # partials above the size the plans keep
        monkeypatch.setattr(decode, "SPLIT_WORKSPACE_KEEP_BYTES", 0)
    plan.dynamic, plan.direct_out = dynamic, False
    plan._init_buffers()
    a, b = plan.stream_buffers(), plan.stream_buffers()
    assert a[0].shape == plan.oacc_shape and a[1].shape == plan.lacc_shape
    assert (a[0] is b[0]) == keep and (a[1] is b[1]) == keep
    assert (a[2] is None) == (not dynamic) and a[2] is b[2]
    _FakeCupy.cuda.stream_ptr = 2  # another stream: its own buffers
    try:
        c = plan.stream_buffers()
    finally:
        _FakeCupy.cuda.stream_ptr = 1
    assert c[0] is not a[0] and (c[2] is None or c[2] is not a[2])


@pytest.mark.parametrize("B,ctx,lse_unread,sinks,expect", [
    (1, 4096, False, False, 16),  # 16 runs of 2 tiles: one cluster, no combine
    (1, 2048, False, False, 8),
    (1, 1024, False, False, 4),
    (1, 100, False, False, 1),     # one split: the plain direct output
    (1, 32768, False, False, 1),   # 32 splits: more than a cluster holds -> partials + combine
    (2, 4096, False, False, 1),    # two sequences whose LSE is read in (H, B) order
    (2, 4096, True, False, 8),     # ... nobody reads it: a cluster of 8 per sequence
    (1, 4096, False, True, 1),     # sinks join in the combine
    (8, 4096, True, False, 8),     # 8 x 8 splits = 64 CTAs: at most half the SMs
    (20, 4096, True, False, 1),    # 20 x 6 = 120 CTAs: clusters pack badly (stop 48)
    (40, 4096, True, False, 1),    # 40 x 3 = 120
    (50, 4096, True, False, 1),    # 50 sequences fill 0.35 of the SMs: one split, no cluster
])
def test_cluster_merge_rule(monkeypatch, B, ctx, lse_unread, sinks, expect):
    """A step whose runs take at most CLUSTER_MAX_FILL of the SMs and at most
    MAX_CLUSTER_SIZE splits merges them in one cluster per sequence and stores directly;
    FA_SM90_CLUSTER_MERGE=0 (the kernels built without it) makes no cluster."""
    p = _problem(B=B, max_k=ctx, lse_unread=lse_unread, sinks=sinks)
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", "FA_SM90_CLUSTER_MERGE=0")
    assert ds.swapped_launch(p, SMS).cluster == 1
    monkeypatch.delenv("CUPY_FLASHATTN_SM90_DEFINES")
    s = ds.swapped_launch(p, SMS)
    assert s.cluster == expect
    if expect > 1:
        assert s.splits == expect and s.direct and not s.dynamic
        assert s.grid == (B * s.splits, 1, 1) and s.grid[0] % s.cluster == 0
        (launch,) = describe_launches(p, sm_count=SMS, device_cc=90)
        assert launch["cluster"] == expect and launch["combine"] is False
    else:
        assert s.direct == (s.splits == 1 and ds.direct_output_applies(p))
    assert ds.swapped_launch(p, SMS, max_cluster=1).cluster == 1


def test_cluster_launch_config_matches_cuda_h():
    """launcher's ctypes mirrors of CUlaunchAttribute (72 bytes: id, pad, 64-byte value) and
    CUlaunchConfig (56 bytes on 64-bit hosts), which cuLaunchKernelEx reads."""
    import ctypes

    from cupy_flashattn._cuda import launcher

    assert ctypes.sizeof(launcher._LaunchAttribute) == 72
    assert launcher._LaunchAttribute.cluster_dim.offset == 8
    assert ctypes.sizeof(launcher._LaunchConfig) == 56
    assert [launcher._LaunchConfig.stream.offset, launcher._LaunchConfig.attrs.offset,
            launcher._LaunchConfig.num_attrs.offset] == [32, 40, 48]
