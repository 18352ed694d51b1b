// kernel_traits.cuh -- tile sizes per head-dim bucket: the tuning table, in one place.
//
// A head dim D (a multiple of 8) runs in the smallest bucket >= D; the D tail is predicated
// (zero-filled loads, skipped stores), so no kernel per size is needed.  Each specialization
// says why it was chosen; measurements are in benchmarks/NOTES.md.
#pragma once
#include "../common.cuh"

namespace fa {

// V-splits (head dims 384 / 512, the dv-split): O of D columns does not fit a thread's
// registers above D = 256 (16 rows x D / 32 lanes fp32 per warp: 256 at D = 512), so kVSplits
// CTAs share each (query tile, head), every one computing S = Q K^T over the whole head dim and
// O for its own kHeadDimV = kHeadDim / kVSplits columns of V (chunk blockIdx.y % kVSplits).
// Q K^T is computed kVSplits times: D = 512 costs 1.5x the FLOPs of one pass, what a
// register-resident O of 256 columns per CTA buys.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kMinBlocksPerSm_,
          int kQInRegs_ = 0, int kVSplits_ = 1>
struct FwdTraitsBase {
  static constexpr int kHeadDim = kHeadDim_;  // Q / K row width (the bucket)
  static constexpr int kVSplits = kVSplits_;
  static constexpr int kHeadDimV = kHeadDim / kVSplits;  // V / O columns of one CTA
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // keys per K/V tile
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kStages = 2;  // K/V double buffering: tile n+1 loads while n computes
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;  // __launch_bounds__ occupancy goal
  // 1: each warp keeps its Q fragments (kHeadDim / 16 x 4 registers per m16 tile) in registers
  // for the whole CTA instead of re-reading them from shared memory with ldmatrix every tile.
  static constexpr bool kQInRegs = kQInRegs_ != 0;

  static constexpr int kWarpM = kBlockM / kNWarps;  // warps split the query rows, never keys
  static constexpr int kMRep = kWarpM / 16;         // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;       // n8 tiles of S per row block
  static constexpr int kDTiles = kHeadDimV / 8;     // n8 tiles of O
  static constexpr int kChunks = kHeadDim / 8;      // 16-byte chunks per Q / K smem row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kChunksV = kHeadDimV / 8;    // ... per V smem row
  static constexpr int kRowBytesV = kHeadDimV * 2;

  static_assert(kWarpM % 16 == 0, "each warp owns whole m16 tiles");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "k16 steps");
  static_assert(kChunks % 4 == 0, "swizzle needs rows of a multiple of 4 chunks");
  static_assert(!kQInRegs || kMRep == 1, "Q fragments in registers: one m16 tile per warp");
  static_assert(kHeadDim % kVSplits == 0 && kHeadDimV % 16 == 0, "whole k16 steps of V");
  static_assert(kVSplits == 1 || (kChunks % 8 == 0 && kChunksV % 8 == 0),
                "V-split tiles: Q/K and V rows swizzle alike (chunk ^ row % 8)");

  // XOR swizzle of the 16-byte chunk index so that ldmatrix (8 rows, same logical chunk) and
  // the cp.async stores hit 8 distinct 16-byte bank groups:
  //  - rows of a multiple of 8 chunks (128 B): chunk ^ (row % 8);
  //  - rows of 4 * odd chunks (D = 32, 96, 160): consecutive rows start 64 B apart mod 128, so
  //    (row % 2) already picks the half line and chunk ^ ((row / 2) % 4) spreads the rest.
  // Both permute chunks inside aligned groups of 8 (resp. 4), never leaving the row.
  static constexpr int kSwzBits = (kChunks % 8 == 0) ? 3 : 2;
  __device__ __forceinline__ static int swizzle(int row, int chunk) {
    return kSwzBits == 3 ? (chunk ^ (row & 7)) : (chunk ^ ((row >> 1) & 3));
  }
  // ldmatrix addresses use chunk = 2 * j + (lane / 16) with rows 16 * r + (lane % 16): the
  // swizzled chunk depends on j only through j % kSwzPeriod, so each lane precomputes
  // kSwzPeriod offsets and every other address is that plus a compile-time constant.
  static constexpr int kSwzPeriod = 1 << (kSwzBits - 1);

  static constexpr int kSmemQ = kBlockM * kRowBytes;
  static constexpr int kSmemKV = kBlockN * kRowBytes;  // one K tile
  static constexpr int kSmemV = kBlockN * kRowBytesV;  // one V tile (= kSmemKV unless V-split)
  // Q, K[kStages], V[kStages] (kSmemV each), then (paged kernels) kTblSlots page-id slots and kTblSlots
  // row-in-page slots of kBlockN ints each: per key row of a tile, its block-table entry
  // (prefetched by cp.async two tiles ahead of its compute) and its row inside that page.  Tile
  // n uses slot n % kTblSlots from its prefetch (iteration n + 2) to its mask (iteration n),
  // so three slots are live at once; four make the slot index a mask.  Dense kernels carry the
  // ~2 KB unused.
  static constexpr int kTblSlots = 4;
  static constexpr int kSmemTable = 2 * kTblSlots * kBlockN * 4;
  static constexpr int kSmemBytes = kSmemQ + kStages * (kSmemKV + kSmemV) + kSmemTable;
};

// The layout of a V tile (kBlockN rows of kHeadDimV), for the tile copies and offsets that take
// a layout (tile_io.cuh): with kVSplits = 1 exactly the traits' own.
template <class Tr>
struct VTileLayout {
  static constexpr int kHeadDim = Tr::kHeadDimV;
  static constexpr int kBlockN = Tr::kBlockN;
  static constexpr int kNThreads = Tr::kNThreads;
  static constexpr int kChunks = Tr::kChunksV;
  static constexpr int kRowBytes = Tr::kRowBytesV;
  __device__ __forceinline__ static int swizzle(int row, int chunk) { return Tr::swizzle(row, chunk); }
};

template <int kHeadDim>
struct FwdTraits;

// Chosen to be spill-free on sm_80 and sm_90 (ptxas 12.9, see tests/test_nvrtc_compile.py) with
// 2 CTAs (8 warps) per SM; registers measured for the plain bf16 kernel on sm_90.  Measurements
// and dead ends: benchmarks/NOTES.md.
// D = 32: 128 x 64 (128 x 128 spilled 16 bytes on sm_80).  ~167 regs, 24 KB smem.
template <> struct FwdTraits<32> : FwdTraitsBase<32, 128, 64, 4, 2> {};
// D = 64: 128 x 64, 32 rows per warp (each K/V fragment used twice).  ~218 regs, 48 KB.
// v2 sweep (bf16, S = 4k): 259 TFLOP/s; 8 warps x 16 rows at 2 CTAs/SM measured 269 but its
// softcap/ALiBi kernel spills 4 B at the 128-register cap on sm_90, so not shipped (needs
// per-feature traits); 8 warps at 1 CTA/SM: 216.
template <> struct FwdTraits<64> : FwdTraitsBase<64, 128, 64, 4, 2> {};
// D = 96: 64 x 64.  ~168 regs, 60 KB.
template <> struct FwdTraits<96> : FwdTraitsBase<96, 64, 64, 4, 2> {};
// D = 128: 64 x 64, 4 warps, 2 CTAs/SM, Q fragments kept in registers (kQInRegs: 32 more
// registers, 8 fewer ldmatrix per tile): ~215 regs, 80 KB.  128 x 64 / 4 warps (flash-attn's
// choice) spills ~100 B (O 128 + S 64 fp32 per thread).  v2 sweep (bf16, S = 4k, non-causal):
// 292 TFLOP/s vs 275 (Q from smem), 282 (128 x 64, 8 warps, Q in regs), 285 (96 x 64, 6 warps),
// 281 (192 x 64, 12 warps; the 168-register variants spill on sm_80).  NOTES.md v2.
template <> struct FwdTraits<128> : FwdTraitsBase<128, 64, 64, 4, 2, 1> {};
// D = 160: 64 x 64.  ~222 regs, 100 KB.
template <> struct FwdTraits<160> : FwdTraitsBase<160, 64, 64, 4, 2> {};
// D = 192: 64 x 32 (K/V stages halved: 72 KB).  ~218 regs.
template <> struct FwdTraits<192> : FwdTraitsBase<192, 64, 32, 4, 2> {};
// D = 256: 128 x 64, 8 warps, 1 CTA/SM (flash-attn's sm80 choice): O is 128 fp32 per thread;
// 194 KB smem; 247 regs (paged 254).  v4 sweep (bf16, S = 4k): see NOTES.md v4 (64 x 32 at
// 2 CTAs/SM, 96 KB, was v1-v4's choice).
template <> struct FwdTraits<256> : FwdTraitsBase<256, 128, 64, 8, 1> {};
// D = 384 / 512 (candle's paged limit): two V-split CTAs of 192 / 256 columns (see above),
// 128 x 32 tiles on 8 warps (16 rows each: O 128 / 96 fp32 per thread), 1 CTA/SM.  512: Q 128 KB
// + K 2 x 32 KB + V 2 x 16 KB = 225 KB of the 227 KB a Hopper CTA may take (like D = 256, more
// than an A100's 163 KB); 384: 169 KB.  The first build, 64 x 32 on 4 warps (161 KB), measured
// 85 TFLOP/s at D = 512 (bf16, S = 4k; torch SDPA efficient 151): 4 warps per SM could not
// hide the ldmatrix latency of a 512-wide Q K^T, and every K tile was read for 64 rows only.
template <> struct FwdTraits<384> : FwdTraitsBase<384, 128, 32, 8, 1, 0, 2> {};
template <> struct FwdTraits<512> : FwdTraitsBase<512, 128, 32, 8, 1, 0, 2> {};

}  // namespace fa
