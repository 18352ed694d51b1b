// tile_io.cuh -- moving tiles of the mma.sync kernels between global and shared memory: Q
// tiles, K/V tiles of dense and paged caches (the block-table prefetch and the per-row address
// resolution), by cp.async into a swizzled row layout.  Shared by the 16-bit prefill
// (flash_fwd.cu) and the float32 / float64 one (flash_fwd_precise.cu); a tile row is
// Tr::kChunks 16-byte chunks of chunk_elems<Tr> elements each.
#pragma once
#include "../common.cuh"
#include "mma.cuh"
#include "../attn/params.cuh"
#include "../attn/block_info.cuh"

namespace fa {

// Elements per 16-byte chunk of a tile row: 8 for the 16-bit kernels, 4 float32, 2 float64.
template <class Tr>
constexpr int chunk_elems = Tr::kHeadDim / Tr::kChunks;

// Byte offset of (row, 16-byte chunk) in a swizzled [rows][kHeadDim] shared-memory tile.
// L: the tile's layout (kRowBytes, swizzle): the traits themselves, or one of a kernel's
// per-tile layouts (sm80/flash_fwd_precise.cu swizzles its V tiles differently).
template <class L>
__device__ __forceinline__ u32 tile_offset(int row, int chunk) {
  return (u32)(row * L::kRowBytes + (L::swizzle(row, chunk) << 4));
}

// Q rows [0, rows_valid) of this tile; rows past the sequence and the D tail are zero-filled.
// E: the element type (u16 for f16 / bf16 bits, float, double); chunk_elems<Tr> of them fill
// a 16-byte chunk.
template <class Tr, class L = Tr, class E>
__device__ __forceinline__ void load_q(u32 sQ, const E* q_tile, i64 row_stride, int rows_valid,
                                       int head_dim, int tidx) {
  constexpr int kTotal = Tr::kBlockM * Tr::kChunks;
#pragma unroll
  for (int i = 0; i < ceil_div(kTotal, Tr::kNThreads); ++i) {
    const int idx = i * Tr::kNThreads + tidx;
    if (kTotal % Tr::kNThreads != 0 && idx >= kTotal) break;
    const int row = idx / Tr::kChunks, chunk = idx % Tr::kChunks;
    const bool ok = row < rows_valid && chunk * chunk_elems<Tr> < head_dim;
    const E* src = ok ? q_tile + row * row_stride + chunk * chunk_elems<Tr> : q_tile;
    cp_async_16(sQ + tile_offset<L>(row, chunk), src, ok);
  }
}

// Paged: where key tile n_block's page ids live in shared memory.  `ids` (kBlockN ints, one
// per key row: its block-table entry, by cp.async) and `rows` (its row inside that page, by a
// plain store) of slot n_block % kTblSlots; see FwdTraitsBase::kSmemTable.
struct PageSlot {
  int* ids;
  int* rows;
};
template <class Tr>
__device__ __forceinline__ PageSlot page_slot(int* table0, int n_block) {
  int* ids = table0 + (n_block & (Tr::kTblSlots - 1)) * Tr::kBlockN;
  return {ids, ids + Tr::kTblSlots * Tr::kBlockN};
}

// Paged: fetch the block-table entries of key tile n_block's rows into its slot, two tiles
// ahead of the compute that uses them, so the table lookup latency hides behind a whole tile.
// The position -> (page index, row in page) split happens here, once per row, by a multiply
// and a shift whatever P is (SeqInfo::page) -- never in the K/V copy loop.
// Rows past len_k read nothing (their id is zero-filled; every user checks pos < len_k).
template <class Tr>
__device__ __forceinline__ void prefetch_pages(PageSlot slot, const FwdParams& p,
                                               const SeqInfo& si, int n_block, int tidx) {
  if (tidx < Tr::kBlockN) {
    const int pos = n_block * Tr::kBlockN + tidx;
    const bool ok = pos < si.len_k;  // len_k <= max_blocks_per_seq * P: index in the row
    const int idx = ok ? si.page.div(pos) : 0;
    cp_async_4(smem_u32(slot.ids + tidx), si.table + idx, ok);
    slot.rows[tidx] = pos - idx * p.page_size;
  }
}

// The rows of one K/V tile that this thread copies, resolved once and used for both K and V.
// Thread layout: 4 threads per row, thread t copying chunks t%4, t%4 + 4, ... of rows t/4,
// t/4 + kRowsPerPass, ...; so one warp instruction reads 64 contiguous bytes of each of 8 rows
// (whole 32-byte sectors) and a thread resolves the address of only kBlockN / 32 rows per tile
// (2 at kBlockN = 64) -- the per-row address math is what a paged tile pays on top of a dense
// one (v2 had 16 threads per row: 8 rows per thread, NOTES.md v3).  Smem stores of one
// instruction hit 8 rows x 4 chunks = all 32 banks 4 times (the swizzle spreads row % 8).
// A CTA with more than 4 threads per key row of its tile (8 warps over 32-key tiles, the
// 384 / 512 buckets) takes kNThreads / kBlockN threads per row: 128 contiguous bytes of each of
// 4 rows per instruction, one row per thread.
template <class Tr>
struct KVRows {
  static constexpr int kThreadsPerRow = Tr::kNThreads / Tr::kBlockN > 4 ? Tr::kNThreads / Tr::kBlockN : 4;
  static constexpr int kRowsPerPass = Tr::kNThreads / kThreadsPerRow;
  static constexpr int kRows = Tr::kBlockN / kRowsPerPass;
  static constexpr int kChunksPerThread = Tr::kChunks / kThreadsPerRow;
  static_assert(Tr::kChunks % kThreadsPerRow == 0 && Tr::kBlockN % kRowsPerPass == 0 &&
                    kRowsPerPass % 4 == 0,
                "KVRows: rows of the tile split evenly over the passes");
  i64 off[kRows];  // element offset of row row_t + i * kRowsPerPass (0 when !ok)
  bool ok[kRows];  // a key (pos < len_k) on a present page
};

// Resolve this thread's rows of key tile n_block.  Straight-line (selects, no per-row branch;
// a per-row branch was most of the v2 paged gap, NOTES.md v3):
//  - dense: row r at (k_start + pos0 + r) * row_stride;
//  - paged: per row, its page id and row in page from the tile's page slot -- whatever the
//    page size.  (A one-address-per-tile path for P % kBlockN == 0 measured 3% slower than
//    this: its loads wait on one smem read + multiply chain, NOTES.md v3.)
// Rows past len_k and rows on an absent page (id outside [0, num_pages)) are zero-filled and
// never read.  `absent` becomes true when this thread met a key on an absent page: the OR over
// the CTA (the next barrier, __syncthreads_or) tells whether the tile needs the page mask.
template <class Tr, bool Is_paged>
__device__ __forceinline__ KVRows<Tr> kv_rows(PageSlot slot, const FwdParams& p,
                                              const SeqInfo& si, int n_block, int tidx,
                                              bool& absent) {
  using R = KVRows<Tr>;
  R rows;
  const int pos0 = n_block * Tr::kBlockN;
  const int rows_left = si.len_k - pos0;  // rows r < rows_left are keys
  const i64 row_stride = p.k_row_stride;
  const int row_t = tidx / R::kThreadsPerRow;
#pragma unroll
  for (int i = 0; i < R::kRows; ++i) {
    const int row = row_t + i * R::kRowsPerPass;
    bool ok = row < rows_left;
    i64 off;
    if constexpr (!Is_paged) {
      off = (i64)(si.k_start + pos0 + row) * row_stride;
    } else {
      const unsigned page = slot.ids[row], row_in_page = slot.rows[row];
      const bool present = page_present(page, p.k_rows);
      absent |= ok && !present;
      ok = ok && present;
      off = page_row_offset(page, row_in_page, p.k_page_stride, row_stride);
    }
    rows.off[i] = ok ? off : 0;
    rows.ok[i] = ok;
  }
  return rows;
}

// Issue the cp.async copies of this thread's rows of one K or V tile into smem tile `s`.
// Invalid rows and the D tail are zero-filled by cp.async's src-size 0 -- predicated, no branch.
// Tr: the tile's width (kChunks of chunk_elems<Tr>), e.g. VTileLayout<...> for a V-split tile;
// `rows` may come from another width's KVRows (the same rows of the same key tile).
template <class Tr, class L = Tr, class E, class RowsT>
__device__ __forceinline__ void copy_rows(u32 s, const E* head, const RowsT& rows,
                                          int head_dim, int tidx) {
  using R = KVRows<Tr>;
  static_assert(R::kRows == RowsT::kRows && R::kRowsPerPass == RowsT::kRowsPerPass,
                "copy_rows: the rows were resolved for another thread layout");
  const int lane_chunk = tidx % R::kThreadsPerRow, row_t = tidx / R::kThreadsPerRow;
  // This thread's first chunk of row 0; chunk j of a row is a constant 64 j bytes further, an
  // immediate of the copy instruction -- one 64-bit add per row, not per chunk.
  const E* lane_ptr = head + lane_chunk * chunk_elems<Tr>;
#pragma unroll
  for (int i = 0; i < R::kRows; ++i) {
    const E* row_ptr = lane_ptr + rows.off[i];
#pragma unroll
    for (int j = 0; j < R::kChunksPerThread; ++j) {
      const int chunk = lane_chunk + j * R::kThreadsPerRow;
      // row % 8 is the same in every pass: the swizzled offset of pass i is pass 0's + const.
      const u32 so = tile_offset<L>(row_t, chunk) + i * R::kRowsPerPass * L::kRowBytes;
      // !ok: src-size 0 reads nothing, so the address needs no select.
      cp_async_16(s + so, row_ptr + j * R::kThreadsPerRow * chunk_elems<Tr>,
                  rows.ok[i] && chunk * chunk_elems<Tr> < head_dim);
    }
  }
}

}  // namespace fa
