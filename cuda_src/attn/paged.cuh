// paged.cuh -- the one rule that maps a key position of a sequence to its row in a paged pool.
//
// Position pos of sequence b lives in page table[b][pos / P], row pos % P of that page, i.e. at
// element page * page_stride + (pos % P) * row_stride (+ head offset) of the pool.  A page id
// outside [0, num_pages) is ABSENT: its keys are masked by attention and dropped by the append
// (kv_cache.cu), never read or written.  Every kernel resolves pages through this header.
#pragma once
#include "../common.cuh"

namespace fa {

// Division of a key position by the page size P without a divide instruction (paged
// kernels divide once per key row per tile): div(n) = (umulhi(n, mul) + n) >> shift with
// shift = ceil(log2 P), mul = floor(2^(32 + shift) / P) + 1 - 2^32.  This is the round-up
// multiplier of Granlund & Montgomery (1994): exact for every 0 <= n < 2^31, since
// mul' * P - 2^(32 + shift) <= P <= 2^shift (mul' = mul + 2^32), and the sum cannot overflow
// 32 bits there.  P = 1 gives mul = 1, shift = 0: div(n) = n; P = 2^k gives n >> k.
struct PageDiv {
  unsigned mul;
  int shift;
  __device__ static PageDiv make(int P) {
    PageDiv d;
    d.shift = 32 - __clz(P - 1);
    d.mul = (unsigned)((1ull << (32 + d.shift)) / (unsigned long long)P + 1ull - (1ull << 32));
    return d;
  }
  __device__ __forceinline__ int div(int n) const {
    return (int)((__umulhi((unsigned)n, mul) + (unsigned)n) >> shift);
  }
};

// Is this block-table entry a page of the pool?  (One unsigned compare also rejects ids < 0.)
__device__ __forceinline__ bool page_present(unsigned page, int num_pages) {
  return page < (unsigned)num_pages;
}

// Element offset of row `row_in_page` of a present page (head 0).  Unsigned: a present id is
// non-negative, and the zero-extension is one instruction cheaper than a sign-extension.
__device__ __forceinline__ i64 page_row_offset(unsigned page, unsigned row_in_page,
                                               i64 page_stride, i64 row_stride) {
  return (i64)page * page_stride + (i64)row_in_page * row_stride;
}

// One sequence's pages: its block-table row and the pool's geometry.
struct PagedKeys {
  const int* table;  // this sequence's block-table row
  PageDiv page;
  int page_size, num_pages;
  i64 page_stride, row_stride;

  __device__ PagedKeys(const int* table_, int page_size_, int num_pages_, i64 page_stride_,
                       i64 row_stride_)
      : table(table_), page(PageDiv::make(page_size_)), page_size(page_size_),
        num_pages(num_pages_), page_stride(page_stride_), row_stride(row_stride_) {}

  // Element offset (head 0) of key position pos (0 <= pos < table width * P), or -1 when its
  // page is absent.
  __device__ __forceinline__ i64 row_offset(int pos) const { return row_offset(pos, page_id(pos)); }
  // row_offset in two steps, for a caller that loads the id early and uses it late (the load's
  // latency then hides behind other work instead of stalling at the present test): the page id
  // of key position pos as the table holds it, then the offset from it.
  __device__ __forceinline__ int page_id(int pos) const { return table[page.div(pos)]; }
  __device__ __forceinline__ i64 row_offset(int pos, int id) const {
    if (!page_present(id, num_pages)) return -1;
    return page_row_offset(id, pos - page.div(pos) * page_size, page_stride, row_stride);
  }
};

}  // namespace fa
