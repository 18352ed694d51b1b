// mask.cuh -- the logit variant on mma accumulator fragments: transform (softcap, ALiBi), then
// the mask (window.cuh's visibility rule, plus absent pages).  Prefill and decode both apply
// these; they differ only in which sequence row (and ALiBi slope) an accumulator row holds:
// prefill rows are consecutive query rows of one head, decode rows are packed (query, head)
// pairs of one kv head.  So each fragment function takes `row_of(mi, h)` (the query row of
// accumulator rows mi*16 + h*8 + lane/4) and the transform `slope_of(mi, h)`.
//
// The hot loop never branches per element on a feature: without Has_transform,
// LogitTransform::apply is empty; the prefill kernel trims the key range (Window::tile_range),
// decides per tile whether masking is needed at all (Window::tile_needs_mask), and masks only
// those tiles.
//
// Fragment layout (mma m16n8k16, fp32 accumulators s[mi][nt][e]): element e of n-tile nt is
// row g + 8 (e >> 1) of m-tile mi and column 8 nt + 2 (lane % 4) + (e & 1) of the tile.
#pragma once
#include "params.cuh"
#include "window.cuh"
#include "paged.cuh"

namespace fa {

// s = scale * q.k  ->  s = cap * tanh(s / cap) (softcap)  ->  s -= slope * |i + shift - j| (ALiBi).
// Has_transform kernels do softcap and ALiBi (each switched by a CTA-uniform run-time value:
// softcap > 0, slope != 0 -- one instantiation serves both, halving what CI must compile).
// log2_scale is what multiplies the values left in S to get log2 units for the softmax: with no
// transform the scale is folded there (one FFMA per element: exp2(s * scale*log2e - m * scale*log2e));
// with a transform S already holds natural-unit logits, so it is just log2(e).
// M: the family's arithmetic (common.cuh); the float64 kernels pass their scale and softcap
// in double (FwdParams holds float32 copies, whose rounding would cost 1e-8 of every logit).
template <bool Has_transform, class M = FastMath>
struct LogitTransform {
  using T = typename M::T;
  T scale;          // softmax_scale
  T cap;            // softcap (0: none)
  T scale_div_cap;  // softmax_scale / softcap
  int shift;
  T log2_scale;

  __device__ LogitTransform(const FwdParams& p, int shift_)
      : LogitTransform(p.softmax_scale, p.softcap, shift_) {}
  __device__ LogitTransform(T scale_, T cap_, int shift_) : scale(scale_), cap(cap_), shift(shift_) {
    scale_div_cap = (Has_transform && cap_ > T(0)) ? scale_ / cap_ : T(0);
    log2_scale = Has_transform ? T(log2e_f64()) : scale_ * T(log2e_f64());  // == kLog2e for float
  }

  // ALiBi slope of (batch b, query head h); 0 when no slopes were given.
  __device__ static float slope(const FwdParams& p, int b, int h) {
    return (Has_transform && p.alibi_slopes != nullptr)
               ? p.alibi_slopes[(i64)b * p.alibi_batch_stride + (i64)h * p.alibi_head_stride]
               : 0.f;
  }

  // col0: key position of element 0 of n-tile 0.
  template <int kMRep, int kNTiles, class RowOf, class SlopeOf>
  __device__ __forceinline__ void apply(T (&s)[kMRep][kNTiles][4], const RowOf& row_of,
                                        const SlopeOf& slope_of, int col0) const {
    if constexpr (Has_transform) {
      if (cap > T(0)) {
#pragma unroll
        for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mi][nt][e] = cap * M::tanh(s[mi][nt][e] * scale_div_cap);
      } else {
#pragma unroll
        for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mi][nt][e] *= scale;
      }
      // ALiBi (slope 0 when absent): -slope * |row + shift - col|.
#pragma unroll
      for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row_of(mi, e >> 1);
            const int col = col0 + nt * 8 + (e & 1);
            s[mi][nt][e] -= slope_of(mi, e >> 1) * fabs(T(row + shift - col));
          }
    }
  }
};

// One bit per column of a lane's fragment (2 per n8 tile): 32 bits up to 128-key tiles, 64
// for wider ones (the sm90 kernel's 176-key tiles).
template <int kNTiles> using column_bits_t = conditional_t<(2 * kNTiles > 32), u64, unsigned>;

// Set the logits of keys a row does not see to -inf.  Row (mi, h) sees keys [lo, hi] that
// keys_of(mi, h, lo, hi) gives (Window::row_keys of its query row, so keys past len_k are
// excluded too); bit 2nt+e of `absent` marks column 8nt + e (of this lane) as a key on an
// absent page.  col0: key position of element 0 of n-tile 0.
template <int kMRep, int kNTiles, class T, class KeysOf>
__device__ __forceinline__ void mask_fragment(T (&s)[kMRep][kNTiles][4], const KeysOf& keys_of,
                                              int col0, column_bits_t<kNTiles> absent) {
  static_assert(2 * kNTiles <= 64, "one bit per column of this lane");
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int lo, hi;
      keys_of(mi, h, lo, hi);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + nt * 8 + e;
          const bool visible = col <= hi && col >= lo && !((absent >> (2 * nt + e)) & 1u);
          if (!visible) s[mi][nt][2 * h + e] = T(neg_inf());
        }
    }
}

// The prefix range of each of a thread's accumulator rows (m-tile mi, half h: sequence row
// row0 + 16 mi + 8 h), looked up once per query tile (Window::row_range): index + 1 in bits
// 16 h .. 16 h + 15 of ids[mi], 0 for none (validate.py caps max_ranges at 65535).  One
// register per m-tile.  [hull_start, hull_end): Window::range_hull of the query tile's rows;
// when it is empty no row has a range and nothing is looked up, so a tile that no range
// reaches pays one pass over the ranges (the hull's), not one per row (measured: with a pass
// per row, 4 unused ranges cost the sm90 causal kernel 2.4-7.1% at S = 1k, benchmarks/NOTES.md).
template <int kMRep>
struct RowRangeIds {
  unsigned ids[kMRep];

  __device__ RowRangeIds(const Window& w, int row0, int hull_start, int hull_end) {
    const bool any = hull_end > hull_start;  // uniform across the CTA
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
      ids[mi] = any ? unsigned(w.row_range(row0 + 16 * mi) + 1) |
                          (unsigned(w.row_range(row0 + 16 * mi + 8) + 1) << 16)
                    : 0u;
  }
  __device__ __forceinline__ int operator()(int mi, int h) const {
    return int((ids[mi] >> (16 * h)) & 0xffffu) - 1;
  }
};

// The prefill mask: consecutive query rows (row0 = sequence row of accumulator row g of
// m-tile 0) over one key tile, absent pages from the tile's page ids in shared memory.
template <bool Is_paged>
struct Mask {
  Window window;
  int num_pages;  // paged: page ids must be below this (p.k_rows)

  // b: the batch index (its prefix ranges).
  __device__ Mask(const FwdParams& p, int len_k_, int shift_, int b)
      : window(p, len_k_, shift_, b), num_pages(p.k_rows) {}

  // absent_ids (paged caches; null unless the tile has a key on an absent page): the tile's
  // page id per key, in shared memory.  Each row's prefix range was looked up once per query
  // tile by the caller (RowRangeIds): the lookup's loop does not sit beside S and O in the
  // masked tile (inside it, it spilled the sm90 D=128 consumers and the float32 D=256 kernel).
  template <int kMRep, int kNTiles, class T>
  __device__ __forceinline__ void apply(T (&s)[kMRep][kNTiles][4], int row0, int tile_col0,
                                        int col_in_tile0, const int* absent_ids,
                                        const RowRangeIds<kMRep>& range_ids) const {
    column_bits_t<kNTiles> absent = 0;  // warp-uniform test: null for almost every tile
    if (Is_paged && absent_ids != nullptr) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          absent |= column_bits_t<kNTiles>(!page_present(absent_ids[col_in_tile0 + nt * 8 + e], num_pages))
                     << (2 * nt + e);
    }
    const Window w = window;
    mask_fragment(
        s,
        [&](int mi, int h, int& lo, int& hi) {
          w.row_keys(row0 + mi * 16 + h * 8, range_ids(mi, h), lo, hi);
        },
        tile_col0 + col_in_tile0, absent);
  }
};

}  // namespace fa
