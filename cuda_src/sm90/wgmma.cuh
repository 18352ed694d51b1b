// sm90/wgmma.cuh -- warpgroup MMA (sm_90a): shared-memory matrix descriptors, the fences that
// order wgmma against ordinary register and shared-memory accesses, and the tile layout the
// descriptors describe.
//
// Tile layout in shared memory (Q, K and V alike): a [rows][D] tile of 16-bit elements is
// stored as D/64 column blocks of [rows][64] (128 bytes per row), each block 128-byte swizzled:
// the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of that row.  Blocks start 1024-byte
// aligned.  This is the "SW128" canonical layout of the wgmma descriptors and also what a TMA
// box of 64 columns with CU_TENSOR_MAP_SWIZZLE_128B writes, so either copy path fills it.
//   K-major operand (Q as A, K as B of S = Q K^T: rows are M / N, the 64 columns are K):
//     8-row groups 1024 bytes apart (SBO); the leading offset is unused with this swizzle;
//     k step kk (16 columns = 32 bytes) starts 32 kk bytes into the block (the hardware
//     applies the swizzle to the final address, so a start inside the 128-byte row is fine).
//   MN-major operand (V as B of O = P V: rows are K = keys, the 64 columns are N = d):
//     64-column blocks LBO bytes apart (rows * 128), 8-key groups 1024 bytes apart (SBO);
//     k step kk (16 keys) starts 16 * 128 kk bytes into the block.
#pragma once
#include "../common.cuh"

namespace fa {
namespace wgmma {

constexpr int kSwizzleRowBytes = 128;  // one row of a column block: 64 16-bit elements
constexpr int kBlockCols = 64;

// Byte offset of 16-byte chunk `chunk` (0 .. D/8 - 1) of row `row` in a [rows][D] tile.
template <int kRows>
__device__ __forceinline__ u32 tile_offset(int row, int chunk) {
  return (u32)((chunk >> 3) * (kRows * kSwizzleRowBytes) + row * kSwizzleRowBytes +
               (((chunk & 7) ^ (row & 7)) << 4));
}

// The 64-bit descriptor: start address, leading / stride byte offsets (all >> 4), base offset 0
// (blocks are 1024-byte aligned), layout type 1 = 128-byte swizzle (bits 62-63).
__device__ __forceinline__ u64 desc_sw128(u32 smem_addr, u32 lbo_bytes, u32 sbo_bytes) {
  return (u64)((smem_addr & 0x3FFFF) >> 4) | ((u64)(lbo_bytes >> 4) << 16) |
         ((u64)(sbo_bytes >> 4) << 32) | (1ull << 62);
}

// The descriptor of `tile + offset`.  kAdd (Sm90FwdTraits::kDescAdd; kernel_traits.cuh
// FA_SM90_DESC_ADD: where it is on, and the measurement): the tile's descriptor plus
// offset >> 4, added to the low word in 32 bits.  Exact: the start-address field (bits 0-13)
// holds (addr & 0x3FFFF) >> 4 and a shared-memory address plus any offset inside a tile stays
// below 2^18 (227 KB), so the add never carries out of the field (a 64-bit add cost an IMAD.X
// per descriptor).  With kk a constant of an unrolled loop the tile's descriptor is computed
// once and each wgmma costs one add; without, every step's address is masked and shifted anew:
// four uniform-datapath instructions per wgmma (ULOP3 / USHF / ULOP3 / UIADD3), 14 M ULOP3 and
// 7.4 M USHF of the D = 128 S = 2k kernel's 200 M warp instructions (ncu, stop 46).
template <bool kAdd>
__device__ __forceinline__ u64 desc_sw128_at(u32 tile, u32 offset, u32 lbo_bytes, u32 sbo_bytes) {
  if constexpr (kAdd) {
    const u64 d = desc_sw128(tile, lbo_bytes, sbo_bytes);
    return (d & 0xFFFFFFFF00000000ull) | (u32)((u32)d + (offset >> 4));
  } else {
    return desc_sw128(tile + offset, lbo_bytes, sbo_bytes);
  }
}

// K-major operand: k step kk of a [rows][D] tile at `tile`.
template <int kRows, bool kAdd>
__device__ __forceinline__ u64 desc_k_major(u32 tile, int kk) {
  return desc_sw128_at<kAdd>(tile, (kk >> 2) * (kRows * kSwizzleRowBytes) + (kk & 3) * 32, 16, 1024);
}

// MN-major operand: keys 16 kk .. 16 kk + 15, d columns of block db, of a [rows][D] tile.
template <int kRows, bool kAdd>
__device__ __forceinline__ u64 desc_mn_major(u32 tile, int kk, int db) {
  return desc_sw128_at<kAdd>(tile, db * (kRows * kSwizzleRowBytes) + kk * 16 * kSwizzleRowBytes,
                       kRows * kSwizzleRowBytes, 1024);
}

// Before the first wgmma of a batch: orders the warpgroup's earlier register writes
// (accumulators rescaled by the softmax, P packed) before wgmma reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// The compiler does not know that a wgmma writes its accumulators (and reads its register A
// operand) asynchronously, until wait(): pinning each register with an empty volatile asm
// after wait() keeps it from reading an accumulator early or reusing an operand register
// while the instruction still runs.
template <int kT>
__device__ __forceinline__ void fence_operands(float (&d)[kT][4]) {
#pragma unroll
  for (int i = 0; i < kT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
template <int kA>
__device__ __forceinline__ void fence_operands(u32 (&a)[kA][4]) {
#pragma unroll
  for (int i = 0; i < kA; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

}  // namespace wgmma
}  // namespace fa
