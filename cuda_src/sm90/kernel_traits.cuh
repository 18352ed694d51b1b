// sm90/kernel_traits.cuh -- tile sizes of the Hopper (sm_90a) prefill kernel per head-dim bucket.
//
// One CTA = one producer warpgroup (loads K/V/Q into a kStages ring, few registers) and two
// consumer warpgroups (64 query rows each, so kBlockM = 128), 384 threads, one CTA per SM.
// Registers: 168 per thread at entry (__launch_bounds__(384, 1)); setmaxnreg moves them to
// kProducerRegs / kConsumerRegs with the same total (e.g. 128 x 56 + 256 x 224 = 384 x 168), so
// the consumers' increase never waits on registers another CTA holds.
// Shared memory: Q (kBlockM x D), kStages K and V tiles (kBlockN x D), the O staging tile
// (kSeparateO), all in the SW128 layout of wgmma.cuh, 1024-byte aligned (the O tile in plain
// padded rows with FA_SM90_O_BULK); then the mbarriers, (paged) the page ids per stage and the
// tile scheduler's mailbox.
#pragma once
#include "../common.cuh"

// Tuning switches (NVRTC -D, e.g. through $CUPY_FLASHATTN_SM90_DEFINES in device sweeps).
#ifndef FA_SM90_OVERLAP
#define FA_SM90_OVERLAP 1
#endif
#ifndef FA_SM90_PINGPONG
#define FA_SM90_PINGPONG 1
#endif
// Diagnostics only (their results are wrong): skip the K/V copies after the first ring round
// (2: paged, also the page-id reads and stores), or the softmax -- to measure how far the loads,
// the paged bookkeeping or the softmax hold the kernel back.
#ifndef FA_SM90_DIAG_NO_LOADS
#define FA_SM90_DIAG_NO_LOADS 0
#endif
#ifndef FA_SM90_DIAG_NO_SOFTMAX
#define FA_SM90_DIAG_NO_SOFTMAX 0
#endif
// Paged K/V by TMA (flash_fwd.cu, tma_paged_tile) where a page holds whole 8-row boxes and P
// is a power of two (boxes of min(P, kBlockN's lowest set bit) rows); other page sizes gather.  Measured (NOTES.md, sm90 v6, D = 128 S = 4k, TFLOP/s, TMA / gather): P = 16
// 479 / 440, P = 256 607 / 444 (dense 633).  0 builds the gather for every page size (A/B
// runs); the host encodes the paged maps only when on (tma.paged_tma_enabled).
// FA_SM90_FLAG_WORD (paged): the four producer warps' absent-page flags of a stage as the bytes
// of one word, which each consumer warp loads with one LDS before it issues the tile's Q K^T
// (flash_fwd.cu issue_s), off the path from the wait for S to the softmax; 0 (the A/B
// baseline): four int flags, four LDS, four R2UR and their OR per warp and key tile after that
// wait.  The paged D = 256 consumers issued 3.7% more instructions than the dense ones (ncu,
// stop 40: 667 M vs 644 M warp instructions, bf16 S = 4096 page 16), about 27 a warp and tile,
// mostly these.  Measured (H100, quickbench TFLOP/s, two runs each, off -> on): D = 256 S = 2048
// p16 616 / 613 -> 624 / 623, D = 128 S = 4096 p16 650 / 647 -> 657 / 655, D = 256 S = 4096 p16
// 647 / 641 -> 644 / 639 (dense 671-680) -- about +1% where it shows, within run-to-run noise
// at D = 256 S = 4096.
#ifndef FA_SM90_FLAG_WORD
#define FA_SM90_FLAG_WORD 1
#endif
#ifndef FA_SM90_PAGED_TMA
#define FA_SM90_PAGED_TMA 1
#endif
#ifndef FA_SM90_STAGES_128
#define FA_SM90_STAGES_128 2
#endif
// Key-tile width per head-dim bucket (device sweeps; the values below are the shipped ones; a
// width needs its S = Q K^T wrapper in tools/gen_wgmma.py's SHAPES).
#ifndef FA_SM90_BLOCKN_64
#define FA_SM90_BLOCKN_64 128
#endif
#ifndef FA_SM90_BLOCKN_128
#define FA_SM90_BLOCKN_128 128
#endif
#ifndef FA_SM90_BLOCKN_128_WIDE
#define FA_SM90_BLOCKN_128_WIDE 176
#endif
#ifndef FA_SM90_BLOCKN_256
#define FA_SM90_BLOCKN_256 80
#endif
// Three trims of the issue slots the consumers spend besides the math, from stop 46's Nsight
// Compute comparison with cuDNN (H100, bf16 D = 128 S = 2k: our kernel 200 M warp
// instructions, cuDNN's 158 M for the same products), each applied where Sm90FwdTraitsBase says
// (kWaitHintNs, kDescAdd, kPvWide: head dims from FA_SM90_TRIMS_MIN_D = 65 up):
//  - FA_SM90_WAIT_HINT_NS (sm90/pipeline.cuh bar_try_wait): try_wait's suspend-time hint, here
//    CUTLASS's 10 ms (until the phase completes).  Without it each wait retried ~6 times: 7.3 M
//    SYNCS with 7.8 M BRA and 6.0 M YIELD around them, against cuDNN's 1.2 M SYNCS.
//  - FA_SM90_DESC_ADD (sm90/wgmma.cuh desc_sw128_at): a step's wgmma descriptor as the tile's
//    plus an offset instead of rebuilt from its address (14 M ULOP3 and 7.4 M USHF, ~0 in
//    cuDNN's).
//  - FA_SM90_PV_WIDE (flash_fwd.cu issue_pv): O += P V as one wgmma of N = D per 16 keys
//    instead of one N = 64 wgmma per 64-column block (6.3 M HGMMA against cuDNN's 4.2 M), the V
//    descriptor's leading byte offset stepping between the blocks; not in the split kernels
//    (the D = 128 paged one spilled 8 bytes with it).
// Measured together (stop 47, H100, quickbench TFLOP/s, bf16, two rounds, default -> on): D = 128
// S = 2k 606-608 -> 615-616, S = 8k 679-689 -> 695-698, D = 256 S = 2k 640 -> 651-653; but
// D = 64 S = 2k 414-420 -> 394-397 and causal 335-341 -> 324, so D = 64 keeps the old forms
// (which of the two that act there -- the hint or the descriptors -- costs it, is not measured).
#ifndef FA_SM90_WAIT_HINT_NS
#define FA_SM90_WAIT_HINT_NS 10000000
#endif
#ifndef FA_SM90_DESC_ADD
#define FA_SM90_DESC_ADD 1
#endif
#ifndef FA_SM90_PV_WIDE
#define FA_SM90_PV_WIDE 1
#endif
// FA_SM90_EARLY_Q (flash_fwd.cu consumer; stop 48): where O has its own staging buffer
// (kSeparateO), each consumer releases Q right after its last Q K^T of the tile instead of
// after the epilogue, so the producer loads the next tile's Q -- and, right behind it, its
// first K / V, whose ring stages are free by then -- under the last softmax, P V and epilogue.
// Measured (stop 48, H100, quickbench TFLOP/s, two rounds alternating, off -> on): D = 128
// S = 2k 609 / 614 -> 622 / 624, causal 510 / 512 -> 520 / 519; D = 64 S = 2k 415 / 415 ->
// 417 / 420; S = 4k / 8k, D = 256 unchanged.  The timeline (below) shows why it is small: the
// median wait for Q between tiles was already ~50 ns; EARLY_Q takes its tail (p90 445 -> 88 ns).
// Why: from stop 46's graph-replayed times (bf16 D = 128, 2048 query tiles of 128 rows at
// S = 2k and 8k alike on 132 SMs, 16 rounds), t = 16 (a + b n_k) gives per 128-key tile
// b = 1.60 us (cuDNN 1.66) but per query tile a = 3.4 us (cuDNN 0.6): the S = 2k gap is what
// each query tile costs besides its key tiles, and the next tile's Q (32 KB, ~1-2 us from HBM
// at an SM's share) and first K / V were requested only once both consumers had finished the
// epilogue.  Predicted: +2-5% at S = 2k (D = 64 / 128), ~0 at S = 8k.  The diagnostic
// timeline (FA_SM90_DIAG_TIMELINE, tools/sm90_timeline.py) measured the phases between tiles
// (H100, D = 128 S = 2k, medians): key tile 1.65 us; between two tiles 2.6 us = epilogue 1.3
// + to the next tile's start 0.7 + the wait for Q 0.06 + the first S 0.5.
// Off by default until the GPU tests have run with it (stop 48 measured its speed only).
#ifndef FA_SM90_EARLY_Q
#define FA_SM90_EARLY_Q 0
#endif
// FA_SM90_CLUSTER_MERGE (sm90/cluster_merge.cuh; stop 48): the split kernels can merge a
// one-round launch's splits inside a thread-block cluster; the host launches them so
// (_cuda/decode_sm90.py) unless the define is 0.  Measured there (H100).
#ifndef FA_SM90_CLUSTER_MERGE
#define FA_SM90_CLUSTER_MERGE 1
#endif
// FA_SM90_LPT_GROUPS (tile_scheduler.cuh TileScheduler::coords; stop 49): the dynamic
// schedule of a causal / local launch (varlen, paged caches) claims its tiles in even groups of
// (sequence, head) pairs of about two rounds of tiles each, each group's heaviest query tiles
// first, instead of one head's tiles at a time.  Head-major claims leave the last heads'
// heaviest tiles to the end of the launch (stop 46: paged D = 256 causal one call, dynamic,
// 0.89 of dense against 0.93 static).  0 = head-major (stop 48's order).
#ifndef FA_SM90_LPT_GROUPS
#define FA_SM90_LPT_GROUPS 0
#endif
// FA_SM90_NEXT_EARLY (flash_fwd.cu consumer's next_tile; stop 49): each consumer resolves its
// next tile (the schedule's next index and tile_at: integer divisions, the window's ranges)
// right after its tile's last product instead of after the epilogue's stores; the timeline's
// "to the next tile's start" was 0.7 us of every query tile (stop 48, D = 128 S = 2k).
#ifndef FA_SM90_NEXT_EARLY
#define FA_SM90_NEXT_EARLY 0
#endif
// FA_SM90_O_BULK (flash_fwd.cu epilogue; stop 49): each row of O leaves shared memory by one
// bulk copy (cp.async.bulk, the TMA unit; no tensor map) issued by one thread, instead of
// 16-byte loads and global stores by every thread of the warpgroup; the consumers go on to the
// next tile while the copies run.  The timeline put the epilogue at 1.3 us of every query tile
// (stop 48, D = 128 S = 2k).  Where O has its own buffer (D <= 192).
#ifndef FA_SM90_O_BULK
#define FA_SM90_O_BULK 0
#endif
#ifndef FA_SM90_TRIMS_MIN_D  // 64: D = 64 takes them too (the A/B of stop 47's -5%)
#define FA_SM90_TRIMS_MIN_D 65
#endif

namespace fa {

// kPlanes_ = 2: the float32 kernel (flash_fwd.cu, "Float32 as two float16 planes"): Q, K and V
// each come as a high and a low float16 plane, both in shared memory.
template <int kHeadDim_, int kBlockN_, int kStages_, int kProducerRegs_ = 56, int kPlanes_ = 1>
struct Sm90FwdTraitsBase {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  // Two: three (FlashAttention-3's D = 64 CTA, 192 x 80 tiles without ping-pong at 40 / 152
  // registers) and one (the split kernels: a 64-row CTA with 3-6 K / V stages) were measured
  // in stop 45 and did not pay (benchmarks/NOTES.md).
  static constexpr int kConsumerWGs = 2;
  static constexpr int kWgRows = 64;  // wgmma M
  static constexpr int kBlockM = kConsumerWGs * kWgRows;
  static constexpr int kNThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kNWarps = kNThreads / 32;
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kQInRegs = 0;
  static constexpr int kVSplits = 1;  // D > 256 runs on the sm80 family
  static constexpr int kProducerRegs = kProducerRegs_;
  static constexpr int kPlanes = kPlanes_;
  // Registers per thread at entry: the 64K register file over the CTA's threads, a multiple of
  // 8 (384 threads: 168).  The consumers get the rest of it, a multiple of 8.
  static constexpr int kEntryRegs = 65536 / kNThreads / 8 * 8;
  static constexpr int kConsumerRegs =
      (kEntryRegs * kNThreads - 128 * kProducerRegs) / (128 * kConsumerWGs) / 8 * 8;
  static_assert(kConsumerRegs <= 256 && kProducerRegs >= 24, "setmaxnreg's range");
  // Named barriers (id 0 is __syncthreads): 1 and 2 the ping-pong turns of consumer warpgroups
  // 0 and 1, kEpilogueBar + cw the epilogue of consumer warpgroup cw, kProducerBar the
  // producer warpgroup's (the paged gather's ids).  16 exist.
  // kConsumersBar: both consumer warpgroups (256 threads; the cluster merge's staging).
  static constexpr int kEpilogueBar = 3;
  static constexpr int kProducerBar = kEpilogueBar + kConsumerWGs;
  static constexpr int kConsumersBar = kProducerBar + 1;
  static_assert(kConsumersBar < 16, "named barrier ids");

  // Whether the consumers overlap the softmax of tile n with P V of tile n + 1 (flash_fwd.cu).
  // Measured with ping-pong on (NOTES.md sm90-v3, bf16 S = 4k, TFLOP/s with / without): D = 64
  // 410 / 342, D = 128 584 / 556, D = 256 555 / 600 -- at D = 256 the extra live registers
  // (S, P and O = 128 at once) cost more than the overlap gains, so it runs without.
  __host__ __device__ static constexpr bool overlap(bool paged, bool transform) {
    return FA_SM90_OVERLAP && kHeadDim != 256 && kPlanes == 1;
  }
  // Ping-pong (FlashAttention-3): the two consumer warpgroups take turns issuing their
  // matrix products (named barriers), so one's softmax runs under the other's wgmma
  // (D = 128: 584 TFLOP/s with, 491 without).  The D = 256 softcap/ALiBi paged kernel spills
  // 8 bytes with it (at 56 / 224 registers; at 40 / 232 the producer spills), so not there.
  __host__ __device__ static constexpr bool pingpong(bool paged, bool transform) {
    return FA_SM90_PINGPONG && !(paged && transform && kHeadDim == 256);
  }

  // Whether the split kernels (flash_fwd.cu Is_split) can also store one split's O and LSE
  // straight into the output (no partials, no combine: _cuda/decode_sm90.py's direct launch).
  // Not at D = 256: the second epilogue costs the paged kernels 12 bytes of spills (ptxas).
  static constexpr bool kSplitDirectOut = kHeadDim <= 192;
  // Whether the split kernels can merge a one-round launch's splits inside a thread-block
  // cluster (FA_SM90_CLUSTER_MERGE, sm90/cluster_merge.cuh):
  // where the direct output is (the same host rule decides: _cuda/decode_sm90.py), 16-bit.
  static constexpr bool kClusterMerge = FA_SM90_CLUSTER_MERGE && kSplitDirectOut && kPlanes_ == 1;

  static constexpr int kNTiles = kBlockN / 8;    // n8 tiles of S per row
  // The issue-slot trims above (FA_SM90_WAIT_HINT_NS, FA_SM90_DESC_ADD, FA_SM90_PV_WIDE): on
  // above D = 64, where they measured faster; D = 64 measured slower with them.
  static constexpr bool kTrimmed = kHeadDim >= FA_SM90_TRIMS_MIN_D;
  static constexpr int kWaitHintNs = kTrimmed ? FA_SM90_WAIT_HINT_NS : 0;
  static constexpr bool kDescAdd = kTrimmed && FA_SM90_DESC_ADD;
  static constexpr bool kPvWide = kTrimmed && FA_SM90_PV_WIDE;
  static constexpr int kDTiles = kHeadDim / 8;   // n8 tiles of O per row
  static constexpr int kDBlocks = kHeadDim / 64; // 128-byte column blocks per row
  static constexpr int kChunks = kHeadDim / 8;   // 16-byte chunks per row

  static_assert(kHeadDim % 64 == 0, "whole 128-byte swizzle blocks");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256,
                "P V takes 16 keys per wgmma; S = Q K^T has N <= 256 (wgmma_ops.cuh: ss_qk)");
  static_assert(kStages >= 2, "the producer signals tile n after issuing tile n + 1");

  static_assert(kPlanes == 1 || kPlanes == 2, "16-bit operands, or float32 as hi / lo planes");
  static constexpr int kSmemQPlane = kBlockM * kHeadDim * 2;
  static constexpr int kSmemKVPlane = kBlockN * kHeadDim * 2;
  // A Q buffer / a K or V stage holds its planes one after the other (each 1024-byte aligned).
  static constexpr int kSmemQ = kPlanes * kSmemQPlane;
  static constexpr int kSmemKV = kPlanes * kSmemKVPlane;
  // The epilogue stages O (kBlockM x D, 16-bit) in shared memory for row-contiguous 16-byte
  // stores.  Its own buffer where it fits (D <= 192: at most 195 KB in all), so a persistent
  // CTA's producer loads the next tile's Q while the consumers still write this tile's O; at
  // D = 256 (192 KB of Q + ring) O reuses Q's buffer and the next Q waits for the epilogue.
  static constexpr int kSmemRing = kSmemQ + 2 * kStages * kSmemKV;
  static constexpr int kSmemLimit = 227 * 1024;  // sm_90's opt-in maximum per block
  // q_full, q_empty, k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages],
  // then the tile scheduler's mailbox barriers (full[2], empty[2], posted[2];
  // tile_scheduler.cuh): 8 bytes each.
  static constexpr int kNumBars = 2 + 4 * kStages + 6;
  static constexpr int kSmemBars = ceil_div(kNumBars * 8, 16) * 16;
  // Paged: per stage, the page id of each key row (the mask's absent-page test) and one
  // "some key is on an absent page" flag per producer warp.
  static constexpr int kSmemIds = kStages * kBlockN * 4;
  static constexpr int kSmemFlags = kStages * 4 * 4;
  // The tile scheduler's mailbox: two claimed tile indices (16 bytes with padding), then per
  // slot the four words posted with a claim (tile_scheduler.cuh).
  static constexpr int kSmemSchedSlots = 16 + 2 * 16;
  // + 1024: the dynamic shared memory base is only 16-byte aligned; the kernel rounds it up.
  static constexpr int kSmemRest = 1024 + kSmemBars + kSmemIds + kSmemFlags + kSmemSchedSlots;
  // The float32 kernel stores its float32 O from registers (8-byte pairs fill whole 32-byte
  // sectors), so it stages nothing and its Q is free as soon as the last S is computed.
  static constexpr bool kStageO = kPlanes == 1;
  static constexpr bool kSeparateO = !kStageO || kSmemRing + kSmemQPlane + kSmemRest <= kSmemLimit;
  // FA_SM90_O_BULK: O staged in plain rows padded by 16 bytes (kORowBytesBulk: the 8 rows of one
  // 32-bit store then fall on 8 different 4-bank groups) so that each row leaves by one bulk
  // copy; where the padded buffer fits beside the ring (D = 64 / 128 / 192).
  static constexpr int kORowBytesBulk = kHeadDim * 2 + 16;
  static constexpr bool kOBulk = FA_SM90_O_BULK && kStageO && kSeparateO &&
                                 kSmemRing + kBlockM * kORowBytesBulk + kSmemRest <= kSmemLimit;
  static constexpr int kSmemO = kStageO && kSeparateO ? (kOBulk ? kBlockM * kORowBytesBulk : kSmemQPlane) : 0;
  // Q released after the tile's last Q K^T (FA_SM90_EARLY_Q); without kSeparateO the epilogue
  // stages O in Q's buffer, so Q is released after it.
  static constexpr bool kEarlyQ = FA_SM90_EARLY_Q && kSeparateO;
  // (not float32, nor above D = 128: 4 / 4 / 68 B of spills at float32 D = 128 with LPT_GROUPS,
  // D = 192 transform paged with every candidate, D = 256 transform paged)
  static constexpr bool kNextEarly = FA_SM90_NEXT_EARLY && kPlanes == 1 && kHeadDim <= 128;
  static constexpr int kSmemTiles = kSmemRing + kSmemO;
  static constexpr int kSmemBytes = kSmemTiles + kSmemRest;
  static_assert(kSmemBytes <= kSmemLimit, "Q, the K/V ring and the barriers must fit 227 KB");
};

// Traits per (head-dim bucket, paged K/V).  A paged kernel holds one page id per producer
// thread (kBlockN <= 128) and loads its tiles by TMA in boxes that never cross a page (flash_fwd.cu
// PagedBoxes: kBlockN's lowest set bit of rows at most): the paged kernels take the dense ones'
// traits except where the dense tile is wider.
// Is_wide (compile.SM90_WIDE_BUCKETS): the dense kernel without softcap / ALiBi for problems
// without a causal / local window, where a wider key tile pays (FlashAttention-3 tile_size.h
// makes the same split).
template <int kHeadDim, bool Is_paged = false, bool Is_wide = false>
struct Sm90FwdTraits;
template <int kHeadDim>
struct Sm90FwdTraits<kHeadDim, true, false> : Sm90FwdTraits<kHeadDim, false, false> {};
template <int kHeadDim>  // buckets without a wide tile (the host never selects them)
struct Sm90FwdTraits<kHeadDim, false, true> : Sm90FwdTraits<kHeadDim, false, false> {};

// First version (NOTES.md sm90-v1): the largest key tile whose 2-stage ring fits 227 KB.
// D = 64: 128 x 128, 3 stages (16 + 96 KB).
// Three consumer warpgroups (192 x 80) measured slower everywhere (stop 45, H100: S = 4096
// 441 -> 399 TFLOP/s, causal 398 -> 331).
template <> struct Sm90FwdTraits<64> : Sm90FwdTraitsBase<64, FA_SM90_BLOCKN_64, 3> {};
// D = 128: 128 x 128, 2 stages (32 + 128 KB).  S 64 + O 64 fp32 registers per consumer thread.
// 3 stages (224 KB) measured the same (579 vs 584 TFLOP/s, S = 4k): the producer keeps up.
template <> struct Sm90FwdTraits<128> : Sm90FwdTraitsBase<128, FA_SM90_BLOCKN_128, FA_SM90_STAGES_128> {};
// Wide (no window): 128 x 176, 2 stages (32 + 176 KB; O shares Q's buffer).  S 88 + P 44 + O 64
// registers per consumer thread.  Measured against 128 x 128 (NOTES.md, sm90 key-tile widths;
// H100, bf16, TFLOP/s, S = 2k / 4k / 8k): 604 / 643 / 682 vs 605 / 635 / 643; causal on 176
// lost (471 vs 500 at S = 2k), so windowed problems keep 128, and so do keys shorter than
// compile.SM90_WIDE_MIN_KEYS (no gain at S = 2k).  160 (separate O, 28 B of spills) measured
// the same as 128; the softcap / ALiBi kernel spills at 176.
template <> struct Sm90FwdTraits<128, false, true> : Sm90FwdTraitsBase<128, FA_SM90_BLOCKN_128_WIDE, 2> {};
// D = 192: 128 x 64, 2 stages (48 + 96 KB).
template <> struct Sm90FwdTraits<192> : Sm90FwdTraitsBase<192, 64, 2> {};
// D = 256: 128 x 80, 2 stages (64 + 160 KB; O shares Q's buffer).  O is 128 fp32 registers per
// consumer thread.  Measured against 128 x 64 (NOTES.md, sm90 key-tile widths; H100, bf16,
// TFLOP/s, S = 4k full / causal, 8k full): 670 / 605 / 660 vs 629 / 587 / 641 -- FlashAttention-3's
// choice too.  Paged takes the same 80 keys (5 boxes of 16 rows per column block at P >= 16;
// with 64 keys, paged ran 0.87-0.91x of dense at 80: NOTES.md, stop 35).
template <> struct Sm90FwdTraits<256> : Sm90FwdTraitsBase<256, FA_SM90_BLOCKN_256, 2> {};

// The float32 kernel (float32 inputs at float32 accuracy; flash_fwd.cu "Float32 as two float16
// planes"): three float16 products per matrix product, so twice a 16-bit tile's shared memory
// per operand.  128 x 64 tiles, 2 stages: D = 128 is 64 KB of Q planes + 2 x 64 KB of K / V
// planes = 192 KB; per consumer thread O 64 + the tile's fresh P V accumulators 64 + S 32 +
// P hi / lo 32 fp32 registers.  Dense and varlen K/V only (the paged float32 path is sm80's).
template <int kHeadDim>
struct Sm90F32Traits : Sm90FwdTraitsBase<kHeadDim, 64, 2, 56, 2> {};

}  // namespace fa
