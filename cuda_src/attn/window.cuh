// window.cuh -- which keys a query row sees: the one visibility rule of every kernel.
//
// Bottom-right aligned (see cupy_flashattn/problem.py): with shift = len_k - len_q, query row i
// sees key j iff  0 <= j < len_k  and  (left < 0 or j >= i + shift - left)  and
// (right < 0 or j <= i + shift + right).  Causal is right = 0, left = -1.  Windows are run-time
// values; the host caps them at 2^30 (_cuda/args.py WINDOW_CAP) so these sums stay in int32.
#pragma once
#include "params.cuh"

namespace fa {

struct Window {
  int len_k, shift, left, right;

  __device__ Window(int len_k_, int shift_, int left_, int right_)
      : len_k(len_k_), shift(shift_), left(left_), right(right_) {}
  __device__ Window(const FwdParams& p, int len_k_, int shift_)
      : Window(len_k_, shift_, p.window_left, p.window_right) {}

  // First / last key row `row` sees (first may be negative: no left limit inside the
  // sequence; last <= len_k - 1, below first when the row sees nothing).
  __device__ __forceinline__ int first_key(int row) const {
    return left >= 0 ? row + shift - left : 0;
  }
  __device__ __forceinline__ int last_key(int row) const {
    return right >= 0 ? imin(len_k - 1, row + shift + right) : len_k - 1;
  }

  // Keys [begin, end) that any of rows [row_first, row_last] can see, within [0, len_k];
  // end <= begin when none.
  __device__ __forceinline__ void key_range(int row_first, int row_last, int& begin,
                                            int& end) const {
    end = len_k;
    begin = 0;
    if (right >= 0) end = imin(end, row_last + shift + right + 1);
    if (left >= 0) begin = imax(0, row_first + shift - left);
  }

  // Tiles of kTile keys [n_min, n_max) that rows [row_first, row_last] can see at all; tiles
  // outside are skipped entirely (never loaded).  n_max <= n_min means nothing is visible.
  template <int kTile>
  __device__ __forceinline__ void tile_range(int row_first, int row_last, int& n_min,
                                             int& n_max) const {
    int begin, end;
    key_range(row_first, row_last, begin, end);
    n_min = begin / kTile;
    n_max = end > 0 ? ceil_div(end, kTile) : 0;
  }

  // Does any key of tile n_block need masking for rows [row_first, row_last]?
  template <int kTile>
  __device__ __forceinline__ bool tile_needs_mask(int n_block, int row_first, int row_last) const {
    const int col_first = n_block * kTile, col_last = col_first + kTile - 1;
    bool need = col_last >= len_k;
    if (right >= 0) need |= col_last > row_first + shift + right;
    if (left >= 0) need |= col_first < row_last + shift - left;
    return need;
  }
};

}  // namespace fa
