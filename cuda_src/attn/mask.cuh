// mask.cuh -- masks and logit transforms as small policy structs.
//
// The hot loop never branches per element on a feature: without Has_transform,
// LogitTransform::apply is empty; Mask trims the key range (tile_range), decides per tile
// whether masking is needed at all (tile_needs_mask), and apply() runs only on those tiles.
//
// Geometry (bottom-right aligned, see problem.py): shift = len_k - len_q; query row i sees key j
// iff  j < len_k  and  (left < 0 or j >= i + shift - left)  and  (right < 0 or j <= i + shift + right).
// Causal is right = 0, left = -1.
#pragma once
#include "params.cuh"

namespace fa {

// s = scale * q.k  ->  s = cap * tanh(s / cap) (softcap)  ->  s -= slope * |i + shift - j| (ALiBi).
// Has_transform kernels do softcap and ALiBi (each switched by a CTA-uniform run-time value:
// softcap > 0, slope != 0 -- one instantiation serves both, halving what CI must compile).
// log2_scale is what multiplies the values left in S to get log2 units for the softmax: with no
// transform the scale is folded there (one FFMA per element: exp2(s * scale*log2e - m * scale*log2e));
// with a transform S already holds natural-unit logits, so it is just log2(e).
template <bool Has_transform>
struct LogitTransform {
  float scale;          // softmax_scale
  float cap;            // softcap (0: none)
  float scale_div_cap;  // softmax_scale / softcap
  float slope;          // ALiBi slope of (batch, head); 0 when no slopes were given
  int shift;
  float log2_scale;

  __device__ LogitTransform(const FwdParams& p, int b, int h, int shift_)
      : scale(p.softmax_scale), cap(p.softcap), shift(shift_) {
    scale_div_cap = (Has_transform && p.softcap > 0.f) ? p.softmax_scale / p.softcap : 0.f;
    slope = (Has_transform && p.alibi_slopes != nullptr)
                ? p.alibi_slopes[(i64)b * p.alibi_batch_stride + (i64)h * p.alibi_head_stride]
                : 0.f;
    log2_scale = Has_transform ? kLog2e : p.softmax_scale * kLog2e;
  }

  // row0: sequence row of accumulator rows g (element pairs 0,1; rows g+8 hold pairs 2,3) of
  // m-tile 0; col0: key position of element 0 of n-tile 0.
  template <int kMRep, int kNTiles>
  __device__ __forceinline__ void apply(float (&s)[kMRep][kNTiles][4], int row0, int col0) const {
    if constexpr (Has_transform) {
      if (cap > 0.f) {
#pragma unroll
        for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mi][nt][e] = cap * tanh_accurate(s[mi][nt][e] * scale_div_cap);
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
            const int row = row0 + mi * 16 + (e >> 1) * 8;
            const int col = col0 + nt * 8 + (e & 1);
            s[mi][nt][e] -= slope * fabsf((float)(row + shift - col));
          }
    }
  }
};

// Causal / local windows are run-time values (left, right; -1 = unlimited): they only trim the
// tile range, pick the masked tiles and add two compares per element of those tiles.
template <bool Is_paged>
struct Mask {
  int len_k, shift, left, right;
  int num_pages;  // paged: page ids must be below this (p.k_rows)

  __device__ Mask(const FwdParams& p, int len_k_, int shift_)
      : len_k(len_k_), shift(shift_), left(p.window_left), right(p.window_right),
        num_pages(p.k_rows) {}

  // Key tiles [n_min, n_max) that rows [row_first, row_last] can see at all; tiles outside are
  // skipped entirely (never loaded).  n_max <= n_min means every row is fully masked.
  template <int kBlockN>
  __device__ __forceinline__ void tile_range(int row_first, int row_last, int& n_min,
                                             int& n_max) const {
    int end = len_k;  // one past the last visible key of any row
    int begin = 0;
    if (right >= 0) end = imin(end, row_last + shift + right + 1);
    if (left >= 0) begin = imax(0, row_first + shift - left);
    n_min = begin / kBlockN;
    n_max = end > 0 ? ceil_div(end, kBlockN) : 0;
  }

  // Does any element of tile n_block need masking for rows [row_first, row_last]?
  template <int kBlockN>
  __device__ __forceinline__ bool tile_needs_mask(int n_block, int row_first, int row_last) const {
    const int col_first = n_block * kBlockN, col_last = col_first + kBlockN - 1;
    bool need = col_last >= len_k;
    if (right >= 0) need |= col_last > row_first + shift + right;
    if (left >= 0) need |= col_first < row_last + shift - left;
    return need;
  }

  // Set masked logits to -inf.  absent_ids (paged caches; null unless the tile has a key on an
  // absent page): the tile's page id per key, in shared memory; ids outside [0, num_pages)
  // mask their keys.
  template <int kMRep, int kNTiles>
  __device__ __forceinline__ void apply(float (&s)[kMRep][kNTiles][4], int row0, int tile_col0,
                                        int col_in_tile0, const int* absent_ids) const {
    static_assert(2 * kNTiles <= 32, "one bit per column of this lane");
    // Bit 2nt+e: column col_in_tile0 + 8nt + e sits on an absent page (warp-uniform test).
    unsigned absent = 0;
    if (Is_paged && absent_ids != nullptr) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          absent |= unsigned((unsigned)absent_ids[col_in_tile0 + nt * 8 + e] >=
                             (unsigned)num_pages) << (2 * nt + e);
    }
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mi * 16 + h * 8;
        int hi = len_k - 1;  // last visible key of this row
        int lo = 0;          // first visible key
        if (right >= 0) hi = imin(hi, row + shift + right);
        if (left >= 0) lo = row + shift - left;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = tile_col0 + col_in_tile0 + nt * 8 + e;
            const bool visible = col <= hi && col >= lo && !((absent >> (2 * nt + e)) & 1u);
            if (!visible) s[mi][nt][2 * h + e] = neg_inf();
          }
      }
  }
};

}  // namespace fa
