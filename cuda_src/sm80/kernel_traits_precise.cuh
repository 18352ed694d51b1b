// kernel_traits_precise.cuh -- tile sizes of the float32 / float64 prefill
// (flash_fwd_precise.cu), per element type and head-dim bucket, with the reason for each.
// A header of its own: only that kernel includes it (the static members of every specialized
// traits class end up as symbols in a module's cubin, so the 16-bit modules stay as they were).
#pragma once
#include "../common.cuh"

namespace fa {

// ---- float32 / float64 prefill (flash_fwd_precise.cu) ------------------------------------------
// One m16 tile per warp (kBlockM = 16 kNWarps); K/V double-buffered as above, in the input's own
// element type: kChunkElems = 16 / sizeof(T) elements per 16-byte chunk, rows of
// kHeadDim * sizeof(T) bytes.  Every entry fits an A100's 163 KB of shared memory per CTA (the
// family runs on any GPU >= 8.0).  Fragment reads (sm80/mma_precise.cuh):
//  - Q and K: each thread reads chunk t of a 4-chunk group of rows g (and g + 8), 16 bytes; a
//    phase of 8 lanes reads 2 rows x 64 bytes, so rows r and r + 1 must fall in different
//    halves of a 128-byte line: chunk ^ 4 (row & 1).
//  - V: element d = 8 dt + g of key rows 2t + j (one 4- or 8-byte read); a phase reads 4 rows
//    r = j, 2 + j, 4 + j, 6 + j, each 32 contiguous bytes (2 chunks), so those rows must take
//    4 different chunk pairs of the line: chunk ^ 2 ((row >> 1) & 3).
template <class T_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kMinBlocksPerSm_>
struct PreciseTraitsBase {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kStages = 2;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr int kQInRegs = 0;
  static constexpr int kVSplits = 1;  // no V-split (kernel_traits.cuh): D <= 256
  static constexpr int kWarpM = kBlockM / kNWarps;
  static constexpr int kMRep = kWarpM / 16;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kChunkElems = 16 / (int)sizeof(T);
  static constexpr int kChunks = kHeadDim / kChunkElems;
  static constexpr int kRowBytes = kHeadDim * (int)sizeof(T);
  static_assert(kMRep == 1, "one m16 tile per warp");
  static_assert(kChunks % 8 == 0, "rows of whole 128-byte lines (the swizzles stay inside one)");

  __device__ __forceinline__ static int swizzle(int row, int chunk) { return chunk ^ ((row & 1) << 2); }
  struct VLayout {
    static constexpr int kRowBytes = PreciseTraitsBase::kRowBytes;
    __device__ __forceinline__ static int swizzle(int row, int chunk) {
      return chunk ^ (((row >> 1) & 3) << 1);
    }
  };

  static constexpr int kSmemQ = kBlockM * kRowBytes;
  static constexpr int kSmemKV = kBlockN * kRowBytes;
  static constexpr int kTblSlots = 4;  // as FwdTraitsBase
  static constexpr int kSmemTable = 2 * kTblSlots * kBlockN * 4;
  static constexpr int kSmemBytes = kSmemQ + 2 * kStages * kSmemKV + kSmemTable;
};

template <class T, int kHeadDim>
struct PreciseFwdTraits;
// Registers decide these (ptxas 12.9/13, sm_80 and sm_90, -Xptxas -v; every entry spill-free,
// tests/test_nvrtc_compile.py): O is kHeadDim / 2 floats (kHeadDim doubles) per thread and the
// 3xTF32 operands double the fragments, so most entries sit at the 255-register cap.
// float32: 64 x 64 (D = 96 / 128 at one CTA per SM: 120 / 160 KB; 64 x 32 at two CTAs spilled
// 44 / 8 bytes), 64 x 32 at D = 160 / 192, 32 x 32 on 2 warps at D = 256 (160 KB).
template <> struct PreciseFwdTraits<float, 32> : PreciseTraitsBase<float, 32, 64, 64, 4, 2> {};
template <> struct PreciseFwdTraits<float, 64> : PreciseTraitsBase<float, 64, 64, 64, 4, 2> {};
template <> struct PreciseFwdTraits<float, 96> : PreciseTraitsBase<float, 96, 64, 64, 4, 1> {};
template <> struct PreciseFwdTraits<float, 128> : PreciseTraitsBase<float, 128, 64, 64, 4, 1> {};
template <> struct PreciseFwdTraits<float, 160> : PreciseTraitsBase<float, 160, 64, 32, 4, 1> {};
template <> struct PreciseFwdTraits<float, 192> : PreciseTraitsBase<float, 192, 64, 32, 4, 1> {};
template <> struct PreciseFwdTraits<float, 256> : PreciseTraitsBase<float, 256, 32, 32, 2, 1> {};
// float64: D <= 128 (O alone would be 256 registers at D = 256); D = 128 on 32 x 16 keys, 2
// warps (32 x 32 spilled 16 bytes in the softcap/ALiBi + paged kernel on sm_90).
template <> struct PreciseFwdTraits<double, 32> : PreciseTraitsBase<double, 32, 64, 32, 4, 2> {};
template <> struct PreciseFwdTraits<double, 64> : PreciseTraitsBase<double, 64, 64, 32, 4, 2> {};
template <> struct PreciseFwdTraits<double, 96> : PreciseTraitsBase<double, 96, 64, 32, 4, 1> {};
template <> struct PreciseFwdTraits<double, 128> : PreciseTraitsBase<double, 128, 32, 16, 2, 2> {};

}  // namespace fa
