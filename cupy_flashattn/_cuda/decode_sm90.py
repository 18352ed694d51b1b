"""MQA decode steps on the Hopper prefill kernel (sm90/flash_fwd.cu, its split-KV variant).

A decode step of one query token over one kv head (MQA: H query heads, Hk = 1) is, in memory,
the same thing as a prefill of H query *rows* of a single head: q (B, H, D) rows of one token
read as (B * H, 1, D) -- sequence b's H rows, one head -- cover the same bytes, and so do out
and the split partials.  (flash-attn 2 makes the same swap for its decode path,
``seqlenq_ngroups_swapped``.)  The H rows of a sequence then form one query tile of the sm90
kernel, whose producer streams K / V as 128-key TMA tiles through a multi-stage ring (tens of
KB in flight per SM) -- what the mma.sync decode kernel's per-warp rings could not do for MQA
(0.44 of copy bandwidth at B = 64, benchmarks/NOTES.md stops 39-42).

The swap holds where every query row sees the same keys: one query per sequence (dense q,
Sq = 1; causal and a right window are then no-ops), no left window, no ALiBi (its bias
depends on the query position and the head) and no prefix ranges.  Sinks are per head: the
kernel leaves them out of its partials and the combine kernel adds them in the caller's
coordinates.  Split-KV (the Is_split kernels, flash_fwd.cu SplitOut) runs each sequence's key
tiles as ``splits`` runs on as many persistent CTAs; the decode combine kernel
(sm80/flash_decode.cu combine_states, also for one split: it writes the LSE, whose (H, B) layout
the swapped kernel cannot) merges them into ``out`` and ``softmax_lse``.

A step whose runs take at most half the SMs (CLUSTER_MAX_FILL), at most MAX_CLUSTER_SIZE
splits a sequence, launches each sequence's splits as one thread-block cluster that merges them
in distributed shared memory and stores ``out`` and the LSE itself (sm90/cluster_merge.cuh): no
partials and no combine launch, where the direct output's rules allow (no sinks; one sequence
or an LSE nobody reads).  ``FA_SM90_CLUSTER_MERGE=0`` in ``CUPY_FLASHATTN_SM90_DEFINES`` (the
kernels' A/B switches) turns it off.

``CUPY_FLASHATTN_DECODE_SM90=0`` keeps every decode step on the mma.sync decode kernel (the
A/B baseline).  Like the other switches it is read when a call's plan is made: set it before
the calls (the front end's call cache replays a plan for calls of the same signature)."""

from __future__ import annotations

import dataclasses
import os

from ..problem import AttentionProblem
from .args import Operands, aligned, compute_dtype, problem_pointers
from .compile import (SM90_HEAD_DIM_BUCKETS, SM90_SPLIT_ARGS, SM90_SPLIT_UNSHIPPED, KernelKey,
                      bucket_for, get_kernel, is_precise, kernel_dtype_tag, key_traits)
from .decode import (COMBINE_ARGS, COMBINE_PAIRS_PER_CTA, COMBINE_THREADS,
                     SplitPartials, _combine_kernel, _elem_code, _es, _sm_count, combine_values)
from .launch import needs_transform, prefill_arch
from .launcher import MAX_CLUSTER_SIZE, ClusterLaunch, Launch, TmaLaunch
from .per_stream import PerStream
from .schedule import new_tile_counter, uniform_lengths
from .tma import fwd_geometries

__all__ = [
    "DECODE_SM90_ENV",
    "SM90_SPLIT_UNSHIPPED",
    "Sm90DecodePlan",
    "swapped_decode_applies",
    "swapped_decode_plan",
    "swapped_launch",
    "swapped_splits",
    "swapped_view",
]

DECODE_SM90_ENV = "CUPY_FLASHATTN_DECODE_SM90"

#: Query heads of the kv head from which the swap is taken: a 16-row mma.sync decode tile
#: already serves up to 16 packed rows at once.
SWAP_MIN_HEADS = 16

#: The most split partials a sequence gets.  With the combine kernel's merge of float32 partials
#: (merge_split_partials: every split's loads in flight) a split costs the combine little; past
#: 32 the split kernel's own per-run costs win: H200, stop 44 (MQA 32/1 D = 128 page 16, kernel
#: time, clean L2), B = 1 ctx 32768 took 27.3 / 26.4 / 32.1 us at 32 / 64 / 128 splits.
SWAP_MAX_SPLITS = 32
#: Key tiles a split run gets at least: stop 44's sweep (same rows) found the best counts at
#: 4 tiles a run -- B = 4 ctx 8192: 16 splits (20.6 us; 24.1 at 32), B = 1 ctx 32768: 32 (27.3;
#: 36.5 at 16) -- and at B = 16 ctx 16384 the SM bound (8 splits, 16 tiles).
SWAP_MIN_TILES_PER_SPLIT = 4
#: ... but a launch of fewer than SWAP_FEW_RUNS runs (B x splits) takes runs of 2 tiles up to
#: that many: its time is one run's latency, not DRAM bandwidth.  B = 1 ctx 4096 (32 tiles):
#: 18.0 us at 16 splits against 20.1 at 8 (stop 44, H200; cuDNN 12.9).
SWAP_FEW_RUNS = 16
SWAP_FEW_RUNS_MIN_TILES = 2
#: Head-dim buckets whose split kernels can store one split's output directly (no partials,
#: no combine): sm90/kernel_traits.cuh kSplitDirectOut (tests/test_decode_sm90_plan.py asks
#: the compiler that the two agree).
SWAP_DIRECT_MAX_HEAD_DIM = 192
#: A batch that alone fills this fraction of the SMs runs one split per sequence where the
#: direct output applies: the combine it saves costs more than the SMs it leaves idle.
#: H100, stop 45 (MQA 32/1, D = 128, page 16; decode_sm90_parts.py, the step in us, one
#: direct split / the rule's splits + partials + combine): B = 48 ctx 4096 48.9 / 50.4 (2
#: splits), B = 64 ctx 4096 54.5 / 62.6 (2), B = 96 ctx 2048 41.9 / 52.9 and B = 128 ctx 2048
#: 52.6 / 65.3 (both 1 split: the combine alone); B = 32 ctx 8192 86.1 (one split, kernel
#: alone) / 60.4 (4).  The boundary lies between 32 and 48 of 132 SMs.
SWAP_DIRECT_MIN_FILL = 0.35


def _enabled() -> bool:
    return os.environ.get(DECODE_SM90_ENV, "1").strip() != "0"


#: Clusters only where the step's CTAs take at most this fraction of the SMs.  Measured (stop
#: 48, H100, MQA 32/1 D = 128 page 16, LSE unread, step us without / with clusters): B = 1
#: ctx 1024 17.6 / 13.2, ctx 2048 17.4 / 13.9, ctx 4096 17.6 / 15.5; ctx 4096 B = 2 20.7 / 16.1,
#: B = 4 22.1 / 16.8, B = 8 (64 CTAs) 24.7 / 17.7 -- but B = 16 (128 CTAs) 27.5 / 32.4, B = 20
#: (120) 30.6 / 36.7, B = 40 (120) 45.5 / 55.5: a grid of clusters near the SM count packs
#: badly into the GPCs (one CTA per SM, a cluster's CTAs in one GPC).
CLUSTER_MAX_FILL = 0.5


def cluster_merge_enabled() -> bool:
    """Whether the split kernels are built with the cluster merge (sm90/kernel_traits.cuh
    FA_SM90_CLUSTER_MERGE, on unless $CUPY_FLASHATTN_SM90_DEFINES sets it to 0): only then may
    a plan launch them as clusters without partials -- a kernel built without it would store
    every split's rows over each other."""
    from .compile import _tuning_defines

    return "-DFA_SM90_CLUSTER_MERGE=0" not in _tuning_defines()


def swapped_decode_applies(problem: AttentionProblem, device_cc=None) -> bool:
    """Whether this decode step runs on the sm90 split-KV kernel with swapped rows (module
    docstring): MQA with at least SWAP_MIN_HEADS query heads, dense q of one token per
    sequence, 16-bit q / k / v (no float8 K/V), head dim <= 256, no left window, ALiBi or
    prefix ranges, arrays the kernel reads and writes in place, on a GPU whose prefill family
    is sm90."""
    p = problem
    if not _enabled() or p.num_heads_k != 1 or p.num_heads < SWAP_MIN_HEADS:
        return False
    if p.cu_seqlens_q is not None or int(p.seqlen_q) != 1 or int(p.max_seqlen_q) != 1:
        return False
    if p.kv_float8 is not None or is_precise(kernel_dtype_tag(p.q.dtype)):
        return False
    if p.window_left >= 0 or p.alibi_slopes is not None:
        return False
    if p.mm_prefix_ranges is not None and p.mm_prefix_ranges.size:
        return False
    if p.head_dim > SM90_HEAD_DIM_BUCKETS[-1] or p.head_dim % 8 or p.total_q == 0:
        return False
    bucket = bucket_for(p.head_dim, SM90_HEAD_DIM_BUCKETS)
    if (bucket, needs_transform(p), p.paged) in SM90_SPLIT_UNSHIPPED:
        return False
    try:
        if prefill_arch(p.head_dim, needs_transform(p), p.paged, device_cc) != "sm90":
            return False
    except ValueError:
        return False
    return _swappable(p)


def _swappable(p: AttentionProblem) -> bool:
    """q and out hold each token's H rows D elements apart and the tokens H * D apart (so
    (B * H, 1, D) is a view of the same bytes; not, e.g., q sliced from a packed QKV tensor),
    every operand is in the kernel's dtype and 16-byte aligned, and the LSE is a plain (H, B)
    array."""
    dt = compute_dtype(kernel_dtype_tag(p.q.dtype))
    row = p.num_heads * p.head_dim
    for a in (p.q, p.out):
        if a.dtype != dt or not aligned(a) or a.strides[1] != a.itemsize * p.head_dim:
            return False
        if a.shape[0] > 1 and a.strides[0] != a.itemsize * row:
            return False
    if p.k.dtype != dt or p.v.dtype != dt:
        return False
    if not (aligned(p.k) and aligned(p.v) and p.k.strides == p.v.strides):
        return False
    lse = p.softmax_lse
    return lse.ndim == 2 and lse.strides[-1] == lse.itemsize


def _rows_view(a, rows: int, head_dim: int):
    """(rows, 1, D) view of a (B, H, D) array whose heads are D apart (_swappable)."""
    import cupy

    item = a.itemsize
    return cupy.ndarray((rows, 1, head_dim), dtype=a.dtype, memptr=a.data,
                        strides=(item * head_dim, item * head_dim, item))


def swapped_view(problem: AttentionProblem) -> AttentionProblem:
    """The problem the kernel runs: sequence b's H query heads as H query rows of one head
    (q, out (B * H, 1, D)), non-causal (Sq = 1: causal and a right window hide no key), no
    sinks (the combine adds them), LSE a (1, B * H) view (the split kernel writes none)."""
    p = problem
    B, H, D = int(p.batch_size), p.num_heads, p.head_dim
    lse = p.softmax_lse.reshape(1, -1)
    return dataclasses.replace(
        p, q=_rows_view(p.q, B * H, D), out=_rows_view(p.out, B * H, D), softmax_lse=lse,
        seqlen_q=H, max_seqlen_q=H, window_left=-1, window_right=-1, sinks=None)


def direct_output_applies(problem: AttentionProblem) -> bool:
    """Whether a one-split step may store O and the LSE straight into the caller's arrays (no
    partials, no combine kernel): no sinks (the combine adds them), a head-dim bucket whose
    split kernels have the direct store (SWAP_DIRECT_MAX_HEAD_DIM), and an LSE whose order the
    kernel's (B, H) rows match -- one sequence -- or that nobody reads (``lse_unread``)."""
    p = problem
    return (p.sinks is None and bucket_for(p.head_dim, SM90_HEAD_DIM_BUCKETS) <= SWAP_DIRECT_MAX_HEAD_DIM
            and (int(p.batch_size) == 1 or p.lse_unread))


def swapped_splits(problem: AttentionProblem, block_n: int, sm_count: int) -> int:
    """Key runs per sequence: the user's ``num_splits`` when given; else one where the direct
    output applies and the batch fills SWAP_DIRECT_MIN_FILL of the SMs; else enough runs for
    the sequences to occupy every SM once (B * splits <= sm_count; the persistent grid has one
    CTA per SM), at most SWAP_MAX_SPLITS and at least SWAP_MIN_TILES_PER_SPLIT key tiles a
    run (SWAP_FEW_RUNS_MIN_TILES where that leaves fewer than SWAP_FEW_RUNS runs in all), and
    no run without a key tile: the count is
    ceil(tiles / per) for per = ceil(tiles / wanted), so every run gets ``per`` tiles but the
    last."""
    p = problem
    tiles = max(1, -(-int(p.max_seqlen_k) // block_n))
    batch = max(1, int(p.batch_size))
    if p.num_splits and p.num_splits > 0:
        wanted = int(p.num_splits)
    elif batch >= SWAP_DIRECT_MIN_FILL * int(sm_count) and direct_output_applies(p):
        wanted = 1
    else:
        wanted = max(1, min(SWAP_MAX_SPLITS, int(sm_count) // batch, tiles // SWAP_MIN_TILES_PER_SPLIT))
        if batch * wanted < SWAP_FEW_RUNS:  # a latency-bound launch: shorter runs, more of them
            wanted = max(wanted, min(SWAP_FEW_RUNS // batch, tiles // SWAP_FEW_RUNS_MIN_TILES))
    per = -(-tiles // max(1, min(wanted, tiles)))
    return -(-tiles // per)


@dataclasses.dataclass(frozen=True)
class SwappedLaunch:
    """The host's numbers of a swapped decode step (host-only, no GPU needed)."""

    key: KernelKey
    splits: int
    tiles_m: int  # query tiles per sequence of the swapped view: ceil(H / block_m)
    grid: tuple  # (persistent CTAs, 1, 1): one per work item up to one per SM
    dynamic: bool  # the CTAs claim items from a counter (lengths on the device)
    direct: bool  # stored straight into out / softmax_lse: no partials, no combine
    cluster: int = 1  # > 1: each tile's splits run as one cluster that merges them (direct)


def swapped_launch(problem: AttentionProblem, sm_count: int, max_cluster=None) -> SwappedLaunch:
    """Kernel, split count and persistent grid of a swapped decode step on ``sm_count`` SMs.

    ``max_cluster``: the largest cluster the step may merge its splits in (default
    MAX_CLUSTER_SIZE where cluster_merge_enabled(), else 1: none).  A cluster needs the direct
    output's rules, more than one split and at most max_cluster of them, and every work item
    on its own CTA (one round: CTA c runs split c % splits, the cluster rank) within
    CLUSTER_MAX_FILL of the SMs."""
    p = problem
    key = KernelKey(kernel_dtype_tag(p.q.dtype), bucket_for(p.head_dim, SM90_HEAD_DIM_BUCKETS),
                    needs_transform(p), p.paged, "sm90", split=True)
    tr = key_traits(key)
    splits = swapped_splits(p, tr.block_n, sm_count)
    tiles_m = -(-p.num_heads // tr.block_m)
    items = tiles_m * int(p.batch_size) * splits
    grid = (max(1, min(items, int(sm_count))), 1, 1)
    if max_cluster is None:
        max_cluster = MAX_CLUSTER_SIZE if cluster_merge_enabled() else 1
    direct = direct_output_applies(p)
    fits = items <= CLUSTER_MAX_FILL * int(sm_count)
    cluster = splits if direct and 1 < splits <= max_cluster and fits else 1
    # The prefill launches' rule (schedule.dynamic_schedule): claims from a counter where the
    # lengths are on the device and there are fewer CTAs than items.
    return SwappedLaunch(key, splits, tiles_m, grid, grid[0] < items and not uniform_lengths(p),
                         direct and (splits == 1 or cluster > 1), cluster)


def swapped_decode_plan(problem: AttentionProblem, sm_count: int) -> dict:
    """``describe_launches``' entry for a swapped decode step (its kernel and the combine)."""
    s = swapped_launch(problem, sm_count)
    tr = key_traits(s.key)
    return dict(kind="decode_sm90", kernel=s.key.name, arch="sm90", grid=s.grid,
                block=(tr.num_threads,), smem=tr.smem_bytes, splits=s.splits, len_q=(1, 1),
                combine=not s.direct, cluster=s.cluster)


class Sm90DecodePlan:
    """Host-side decisions of one swapped decode step (module docstring): the split kernel's
    key, grid and packed arguments made from the swapped view, and the combine launch in the
    caller's coordinates.  :meth:`run` rebinds the call's arrays (the view shares their
    addresses, so the caller's arrays bind directly) and launches both (no host sync,
    CUDA-graph safe)."""

    direct = True

    def __init__(self, problem: AttentionProblem, sm_count=None):
        p = problem
        view = swapped_view(p)
        if sm_count is None:
            import cupy

            sm_count = _sm_count(cupy.cuda.Device().id)
        s = swapped_launch(p, sm_count)
        tr = key_traits(s.key)
        ops = Operands(view, compute_dtype(s.key.dtype))
        assert ops.direct, "swapped_decode_applies admits only arrays the kernel reads in place"
        values = ops.fwd_values(tiles_m=s.tiles_m)
        values.update(tile_counter=None, oaccum=None, lse_accum=None, num_splits=s.splits)
        args = (get_kernel(s.key), s.grid, (tr.num_threads,), tr.smem_bytes, SM90_SPLIT_ARGS,
                SM90_SPLIT_ARGS.new(values), fwd_geometries(values, tr.block_m, tr.block_n, p.paged))
        self.launch = ClusterLaunch(*args, s.cluster) if s.cluster > 1 else None
        if self.launch is not None and self.launch.max_active_clusters() < 1:
            s = swapped_launch(p, sm_count, max_cluster=1)  # no GPC takes the cluster: combine
            self.launch = None
        if self.launch is None:
            self.launch = TmaLaunch(*args)
        self.key, self.splits, self.tiles_m, self.grid = s.key, s.splits, s.tiles_m, s.grid
        self.dynamic = s.dynamic  # lengths on the device: CTAs claim items from a counter
        self.cluster = s.cluster
        # Stored straight into out / softmax_lse (direct_output_applies): one split, or the
        # splits merged in their cluster; no partials and no combine launch.
        self.direct_out = s.direct
        B, H, D = int(p.batch_size), p.num_heads, p.head_dim
        self.oacc_shape = (self.splits, B, H, D)
        self.lacc_shape = (self.splits, B * H)
        self._init_buffers()
        self.combine_launch = None
        if self.direct_out:
            return
        # The combine in the caller's coordinates: pair (row b, head h) reads partial row
        # b * H + h of the swapped view (o: split, b, h, d; lse: split, b * H + h) and writes
        # out[b, h] and softmax_lse[h, b]; the call's sinks join here.
        out, lse = p.out, p.softmax_lse
        cvals = combine_values(
            None, None, out, lse, sinks=p.sinks, splits=self.splits, rows=B, heads=H, head_dim=D,
            o_split=B * H * D, o_row=H * D, o_head=D, lse_split=B * H, lse_rows=1, lse_batch=H,
            lse_head=1, out_row=_es(out, 0), out_head=_es(out, 1), lse_out_batch=1,
            lse_out_head=lse.strides[0] // lse.itemsize, in_type=0, out_type=_elem_code(out.dtype))
        self.combine_launch = Launch(_combine_kernel(), (-(-(B * H) // COMBINE_PAIRS_PER_CTA),),
                                     (COMBINE_THREADS,), 0, COMBINE_ARGS, COMBINE_ARGS.new(cvals))

    def _init_buffers(self):
        """Kept per CUDA stream (per_stream.py): the dynamic schedule's counter (the kernel
        leaves it at 0) and the split partials (decode.SplitPartials; none for the direct
        output)."""
        self._counter = PerStream(new_tile_counter) if self.dynamic else None
        self._partials = None if self.direct_out else SplitPartials(self.oacc_shape, self.lacc_shape)

    def stream_buffers(self):
        """(oaccum, lse_accum, tile counter or None) for a step on the current CUDA stream
        (no partials for the direct output)."""
        counter = self._counter.get() if self._counter else None
        if self._partials is None:
            return None, None, counter
        return (*self._partials.get(), counter)

    def run(self, p: AttentionProblem) -> None:
        oacc, lacc, counter = self.stream_buffers()
        pointers = problem_pointers(p)
        pointers.update(sinks=None, oaccum=oacc, lse_accum=lacc, tile_counter=counter)
        self.launch(pointers)
        if self.combine_launch is None:  # the direct output: the kernel wrote out and the LSE
            return
        self.combine_launch({"o_in": oacc, "lse_in": lacc, "o_out": p.out,
                             "lse_out": p.softmax_lse, "sinks": p.sinks})
