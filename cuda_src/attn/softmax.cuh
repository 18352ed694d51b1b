// softmax.cuh -- online-softmax state of the rows one thread owns.
//
// A thread holds, per m-tile mi, two rows of the mma accumulators: row g (half 0) and g+8
// (half 1).  The 4 lanes of a quad share those rows, so the row max is quad-reduced every tile;
// the row sum stays a per-thread partial sum and is reduced once, in finalize.
//   m_new = max(m_old, max_j s_j);  p_j = exp2(s_j * c - m_new * c);  alpha = exp2((m_old - m_new) * c)
//   l = l * alpha + sum_j p_j;  O = O * alpha + P V;   at the end O /= l, lse = (m c + log2 l) ln 2.
//
// Non-finite scores (NaN q or k, an inf in k, a NaN ALiBi slope) need no work in the hot loop:
// fmaxf skips a NaN score, so m stays the max of the others, but the NaN score's own p is
// exp2(NaN) = NaN; a +inf score makes m = +inf and its p exp2(inf - inf) = NaN.  Either way that
// p makes l NaN and, through P V, every column of the row's O (NaN * 0 stays NaN through later
// rescalings).  finalize only has to tell that apart from an empty row: l == 0 exactly iff the
// row saw no visible key (a visible finite max contributes exp2(0) = 1), NaN iff a score was.
#pragma once
#include "../common.cuh"

namespace fa {

// ---- The state of one row, and merging states -------------------------------------------------
// A (partial) softmax state is (m, l): the max logit m seen so far (in the units S is held in;
// -inf while no key was visible) and l = sum_j exp2((s_j - m) c).  The rules below are the
// only ones: the online update (OnlineSoftmax), the decode kernel's merge of its warps'
// states, and the combine kernel's merge of split partials (m = lse, l = 1, c = log2 e) all
// call them.

// The amount (in log2 units) subtracted before exp2, for a running max m.  A row with no
// visible key keeps m = -inf: subtracting 0 instead of -inf makes every p = exp2(-inf) = 0
// rather than exp2(-inf - -inf) = NaN.
__device__ __forceinline__ float row_shift(float m, float c) {
  return m == neg_inf() ? 0.f : m * c;
}

// Weight of a state of max m_part in a merged state whose shift is `shift` (row_shift of the
// merged max): exp2(m_part c - shift); 0 for an empty part (m_part = -inf).
__device__ __forceinline__ float part_weight(float m_part, float c, float shift) {
  return exp2_approx(m_part * c - shift);
}

// The natural-log LSE of a finished state (l summed over every lane and part): +inf (flash-
// attn's marker of an empty softmax) or `empty_lse` when l == 0, NaN when l is (a NaN score).
// l == 0 exactly iff no key was visible: a visible finite max contributes exp2(0) = 1.
__device__ __forceinline__ float state_lse(float m, float l, float c, float empty_lse = pos_inf()) {
  return l == 0.f ? empty_lse : (m * c + log2_approx(l)) * kLn2;
}

// An attention sink (FwdParams::sinks): one more softmax term exp(sink) per row with no value
// vector, folded into a FINISHED state -- after every key (and, split-KV, after the combine: a
// split partial leaves it out, so it is counted once).  Given the state's max m (S units, c the
// log2 multiplier) and sum l, the sink in log2 units (-inf: none), and whether the row saw a key:
//   top = max(m c, sink);  w = exp2(m c - top);  l' = l w + exp2(sink - top)
// O (unnormalized) is multiplied by w / l' and the LSE is (top + log2 l') ln 2.  A row that saw
// no key gets w = 0 (O stays 0) and LSE = sink; a NaN sink makes l' NaN (fmaxf skips it in top).
struct SinkFold {
  float o_scale;  // what the unnormalized O is multiplied by (1 / l without a sink)
  float lse;      // natural log
};
__device__ __forceinline__ SinkFold fold_sink(float m, float l, float c, float sink_log2,
                                              float empty_lse = pos_inf()) {
  if (sink_log2 == neg_inf()) return {1.f / l, state_lse(m, l, c, empty_lse)};
  const float m_log2 = l == 0.f ? neg_inf() : m * c;
  const float top = fmaxf(m_log2, sink_log2);
  const float w = exp2_approx(m_log2 - top);
  const float total = l * w + exp2_approx(sink_log2 - top);
  return {w / total, (top + log2_approx(total)) * kLn2};
}

// The sink of query head h in log2 units, or -inf when the call has none.
__device__ __forceinline__ float sink_log2(const float* sinks, int h) {
  return sinks != nullptr ? sinks[h] * kLog2e : neg_inf();
}

template <int kMRep>
struct OnlineSoftmax {
  float row_max[kMRep][2];  // in the units S is held in; -inf while no key was visible
  float row_sum[kMRep][2];  // this lane's partial sum of p

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mi][h] = neg_inf();
        row_sum[mi][h] = 0.f;
      }
  }

  // Turns S into P (in place, fp32) and rescales O.  c: multiplier to log2 units.
  // O is rescaled only when some row of the warp changed its max (one warp vote per tile):
  // alpha is exactly 1 otherwise, and after the first few tiles of a long row the max rarely
  // moves, which saves kMRep x kDTiles x 4 FMULs per thread per tile.
  template <int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(float (&s)[kMRep][kNTiles][4],
                                         float (&o)[kMRep][kDTiles][4], float c) {
    float alpha[kMRep][2];
    if (to_probabilities(s, c, alpha)) rescale(o, alpha);
  }

  // The two halves of update(), for a kernel whose O is still being written by an asynchronous
  // P V of the previous tile (sm90): S -> P and the new row statistics now, returning whether
  // any row of the warp changed its max; rescale(o, alpha) once that P V has completed.
  template <int kNTiles>
  __device__ __forceinline__ bool to_probabilities(float (&s)[kMRep][kNTiles][4], float c,
                                                   float (&alpha)[kMRep][2]) {
    bool changed = false;
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = row_max[mi][h];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          mx = fmaxf(mx, fmaxf(s[mi][nt][2 * h], s[mi][nt][2 * h + 1]));
        mx = quad_max(mx);
        const float m_scaled = row_shift(mx, c);
        changed |= mx != row_max[mi][h];
        alpha[mi][h] = part_weight(row_max[mi][h], c, m_scaled);  // 0 when m_old = -inf
        row_max[mi][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = exp2_approx(fmaf(s[mi][nt][2 * h + e], c, -m_scaled));
            s[mi][nt][2 * h + e] = pv;
            sum += pv;
          }
        row_sum[mi][h] = row_sum[mi][h] * alpha[mi][h] + sum;
      }
    return __any_sync(0xffffffffu, changed);
  }

  template <int kDTiles>
  __device__ __forceinline__ static void rescale(float (&o)[kMRep][kDTiles][4],
                                                 const float (&alpha)[kMRep][2]) {
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mi][dt][2 * h] *= alpha[mi][h];
          o[mi][dt][2 * h + 1] *= alpha[mi][h];
        }
  }

  // This row's l summed over the 4 lanes of the quad that share it.
  __device__ __forceinline__ float row_total(int mi, int h) const { return quad_sum(row_sum[mi][h]); }

  // O /= l and the natural-log LSE.  A row that never saw a key (l == 0: m is still -inf and
  // no score was NaN) outputs 0 and LSE +inf (flash-attn's convention for an empty softmax).
  // A row with a NaN score has l = NaN: inv = 1/l and the LSE come out NaN, so its output and
  // LSE are NaN -- never the empty marker (NaN == 0 is false).  An empty row's O is set to 0,
  // not multiplied by 0: a NaN in the V row of a key masked for it (same key tile) reached its
  // O as P V's 0 * NaN.
  // sink: the rows' attention sink in log2 units (-inf: none; see fold_sink).
  template <int kDTiles>
  __device__ __forceinline__ void finalize(float (&o)[kMRep][kDTiles][4], float c,
                                           float (&lse)[kMRep][2], float sink = neg_inf()) {
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sum = quad_sum(row_sum[mi][h]);
        const bool empty = sum == 0.f;
        const SinkFold fold = fold_sink(row_max[mi][h], sum, c, sink);
        const float inv = fold.o_scale;  // 1 / sum without a sink: NaN when sum is
        lse[mi][h] = fold.lse;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mi][dt][2 * h] = empty ? 0.f : o[mi][dt][2 * h] * inv;
          o[mi][dt][2 * h + 1] = empty ? 0.f : o[mi][dt][2 * h + 1] * inv;
        }
      }
  }
};

}  // namespace fa
