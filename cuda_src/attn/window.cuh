// window.cuh -- which keys a query row sees: the one visibility rule of every kernel.
//
// Bottom-right aligned (see cupy_flashattn/problem.py): with shift = len_k - len_q, query row i
// sees key j iff  0 <= j < len_k  and  (left < 0 or j >= i + shift - left)  and
// (right < 0 or j <= i + shift + right).  Causal is right = 0, left = -1.  Windows are run-time
// values; the host caps them at 2^30 (_cuda/args.py WINDOW_CAP) so these sums stay in int32.
//
// Prefix ranges (candle's mm_prefix_ranges, image tokens of multimodal prompts): a row whose
// diagonal d = i + shift lies in one of its sequence's [start, end) ranges also sees every key
// of that range.  The row's window holds d too, so window u range is still ONE interval per
// row: [min(first, start), max(last, end - 1)] -- the mask code below stays interval-based.
// Tiles that need no mask under the window alone need none with ranges (ranges only add
// visible keys), so a causal batch keeps its mask-free fast path; only the tile range grows to
// the hull of the ranges that meet the CTA's rows.
#pragma once
#include "params.cuh"

namespace fa {

// The prefix ranges of one sequence: `count` [start, end) pairs at r (count 0 without ranges:
// every loop below is then empty).  Unused entries have start >= end; the host checks that the
// used ones are sorted and disjoint (validate.prefix_ranges), so at most one holds a diagonal.
struct PrefixRanges {
  const int* r;
  int count;

  __device__ PrefixRanges(const FwdParams& p, int b)
      : r(p.prefix_ranges != nullptr ? p.prefix_ranges + (i64)b * p.prefix_ranges_batch_stride
                                     : nullptr),
        count(p.prefix_ranges != nullptr ? p.prefix_ranges_count : 0) {}

  // The index of the range that holds diagonal d; -1 when none does.  Branch-free and
  // unrolled (no early exit: at most one range holds d), so the loads of two ranges are in
  // flight together: a lookup costs about one cache latency per two ranges, not one per range
  // (measured: the one-at-a-time loop cost the sm90 causal kernel 9% at S = 1k with 4 unused
  // ranges, benchmarks/NOTES.md).
  __device__ __forceinline__ int holding(int d) const {
    int found = -1;
#pragma unroll 2
    for (int i = 0; i < count; ++i) {
      const int a = __ldg(r + 2 * i), z = __ldg(r + 2 * i + 1);
      found = (a <= d && d < z) ? i : found;
    }
    return found;
  }
  // Range i as [start, end); i = -1: the empty range [0, 0).
  __device__ __forceinline__ void at(int i, int& start, int& end) const {
    start = end = 0;
    if (i >= 0) {
      start = __ldg(r + 2 * i);
      end = __ldg(r + 2 * i + 1);
    }
  }

  // Hull [start, end) of the ranges that hold one of diagonals [d_first, d_last];
  // end <= start when none does.
  __device__ __forceinline__ void hull(int d_first, int d_last, int& start, int& end) const {
    start = 0x7fffffff;
    end = -0x7fffffff - 1;
#pragma unroll 2
    for (int i = 0; i < count; ++i) {  // branch-free, as holding()
      const int a = __ldg(r + 2 * i), z = __ldg(r + 2 * i + 1);
      const bool meets = a < z && a <= d_last && z > d_first;
      start = meets ? imin(start, a) : start;
      end = meets ? imax(end, z) : end;
    }
  }
};

struct Window {
  int len_k, shift, left, right;
  PrefixRanges ranges;

  // b: the batch index (whose prefix ranges apply).
  __device__ Window(const FwdParams& p, int len_k_, int shift_, int b)
      : len_k(len_k_), shift(shift_), left(p.window_left), right(p.window_right), ranges(p, b) {}

  // Keys [first, last] that row `row`'s window alone shows (first may be negative: no left
  // limit inside the sequence; last <= len_k - 1, below first when the row sees nothing).
  __device__ __forceinline__ void window_keys(int row, int& first, int& last) const {
    const int d = row + shift;
    first = left >= 0 ? d - left : 0;
    last = right >= 0 ? imin(len_k - 1, d + right) : len_k - 1;
  }
  // Widen [first, last] by the row's prefix range [start, end) (none: start >= end).
  __device__ __forceinline__ void widen(int start, int end, int& first, int& last) const {
    if (start < end) {
      first = imin(first, start);
      last = imax(last, imin(len_k, end) - 1);
    }
  }
  // The index of the prefix range that holds row `row`'s diagonal; -1 for none.
  __device__ __forceinline__ int row_range(int row) const {
    return ranges.count > 0 ? ranges.holding(row + shift) : -1;
  }
  // Keys [first, last] that row `row` sees: its window, widened by its prefix range (range
  // index `range`, from row_range).
  __device__ __forceinline__ void row_keys(int row, int range, int& first, int& last) const {
    window_keys(row, first, last);
    int start, end;
    ranges.at(range, start, end);
    widen(start, end, first, last);
  }
  __device__ __forceinline__ void row_keys(int row, int& first, int& last) const {
    row_keys(row, row_range(row), first, last);
  }

  // The hull [start, end) of the prefix ranges that hold one of rows [row_first, row_last]'s
  // diagonals, where ranges matter: empty (end <= start) without ranges, and without a window
  // (every row sees every key already).  A query tile computes it once; when it is empty no
  // row of the tile has a range, so the rows' own lookups are skipped (RowRangeIds).
  __device__ __forceinline__ void range_hull(int row_first, int row_last, int& start,
                                             int& end) const {
    start = end = 0;
    if (ranges.count > 0 && (right >= 0 || left >= 0))
      ranges.hull(row_first + shift, row_last + shift, start, end);
  }

  // Keys [begin, end) that any of rows [row_first, row_last] can see, within [0, len_k];
  // end <= begin when none.  [hull_start, hull_end): range_hull of those rows, or of rows
  // around them (a superset only adds keys that the mask then hides).
  __device__ __forceinline__ void key_range(int row_first, int row_last, int hull_start,
                                            int hull_end, int& begin, int& end) const {
    end = len_k;
    begin = 0;
    if (right >= 0) end = imin(end, row_last + shift + right + 1);
    if (left >= 0) begin = imax(0, row_first + shift - left);
    if (hull_end > hull_start) {
      begin = imin(begin, imax(0, hull_start));
      end = imax(end, imin(len_k, hull_end));
    }
  }
  __device__ __forceinline__ void key_range(int row_first, int row_last, int& begin,
                                            int& end) const {
    int hull_start, hull_end;
    range_hull(row_first, row_last, hull_start, hull_end);
    key_range(row_first, row_last, hull_start, hull_end, begin, end);
  }

  // Tiles of kTile keys [n_min, n_max) that rows [row_first, row_last] can see at all; tiles
  // outside are skipped entirely (never loaded).  n_max <= n_min means nothing is visible.
  // The hull (range_hull) given, or looked up here.
  template <int kTile>
  __device__ __forceinline__ void tile_range(int row_first, int row_last, int hull_start,
                                             int hull_end, int& n_min, int& n_max) const {
    int begin, end;
    key_range(row_first, row_last, hull_start, hull_end, begin, end);
    n_min = begin / kTile;
    n_max = end > 0 ? ceil_div(end, kTile) : 0;
  }
  template <int kTile>
  __device__ __forceinline__ void tile_range(int row_first, int row_last, int& n_min,
                                             int& n_max) const {
    int hull_start, hull_end;
    range_hull(row_first, row_last, hull_start, hull_end);
    tile_range<kTile>(row_first, row_last, hull_start, hull_end, n_min, n_max);
  }

  // Does any key of tile n_block need masking for rows [row_first, row_last]?  (The window
  // alone decides: a tile it shows whole to every row, ranges can only show more of.)
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
