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
// Each rule is written once for every accumulator type: M is the family's arithmetic
// (common.cuh FastMath / Fp32Math / Fp64Math); the 16-bit kernels and decode use the default.
template <class M = FastMath>
__device__ __forceinline__ typename M::T row_shift(typename M::T m, typename M::T c) {
  using T = typename M::T;
  return m == T(neg_inf()) ? T(0) : m * c;
}

// Weight of a state of max m_part in a merged state whose shift is `shift` (row_shift of the
// merged max): exp2(m_part c - shift); 0 for an empty part (m_part = -inf).
template <class M = FastMath>
__device__ __forceinline__ typename M::T part_weight(typename M::T m_part, typename M::T c,
                                                     typename M::T shift) {
  return M::exp2(m_part * c - shift);
}

// The natural-log LSE of a finished state (l summed over every lane and part): +inf (flash-
// attn's marker of an empty softmax) or `empty_lse` when l == 0, NaN when l is (a NaN score).
// l == 0 exactly iff no key was visible: a visible finite max contributes exp2(0) = 1.
template <class M = FastMath>
__device__ __forceinline__ typename M::T state_lse(typename M::T m, typename M::T l,
                                                   typename M::T c,
                                                   typename M::T empty_lse = pos_inf()) {
  using T = typename M::T;
  return l == T(0) ? empty_lse : (m * c + M::log2(l)) * T(ln2_f64());
}

// An attention sink (FwdParams::sinks): one more softmax term exp(sink) per row with no value
// vector, folded into a FINISHED state -- after every key (and, split-KV, after the combine: a
// split partial leaves it out, so it is counted once).  Given the state's max m (S units, c the
// log2 multiplier) and sum l, the sink in log2 units (-inf: none), and whether the row saw a key:
//   top = max(m c, sink);  w = exp2(m c - top);  l' = l w + exp2(sink - top)
// O (unnormalized) is multiplied by w / l' and the LSE is (top + log2 l') ln 2.  A row that saw
// no key gets w = 0 (O stays 0) and LSE = sink; a NaN sink makes l' NaN (fmaxf skips it in top).
template <class T>
struct SinkFoldOf {
  T o_scale;  // what the unnormalized O is multiplied by (1 / l without a sink)
  T lse;      // natural log
};
using SinkFold = SinkFoldOf<float>;
template <class M = FastMath>
__device__ __forceinline__ SinkFoldOf<typename M::T> fold_sink(typename M::T m, typename M::T l,
                                                               typename M::T c,
                                                               typename M::T sink_log2,
                                                               typename M::T empty_lse = pos_inf()) {
  using T = typename M::T;
  if (sink_log2 == T(neg_inf())) return {T(1) / l, state_lse<M>(m, l, c, empty_lse)};
  const T m_log2 = l == T(0) ? T(neg_inf()) : m * c;
  const T top = max_skip_nan(m_log2, sink_log2);
  const T w = M::exp2(m_log2 - top);
  const T total = l * w + M::exp2(sink_log2 - top);
  return {w / total, (top + M::log2(total)) * T(ln2_f64())};
}

// The sink of query head h in log2 units, or -inf when the call has none.
template <class M = FastMath>
__device__ __forceinline__ typename M::T sink_log2(const float* sinks, int h) {
  using T = typename M::T;
  return sinks != nullptr ? T(sinks[h]) * T(log2e_f64()) : T(neg_inf());
}

// The merged state of one (row, head) pair's split partials, by one warp (the combine kernel
// and the decode kernel's last split CTA, sm80/flash_decode.cu; the sm90 split kernels' cluster
// merge, sm90/cluster_merge.cuh): the total's lse (natural units, and times log2 e), and
// whether no partial saw a key.  Partial s is the state (m = lse_s, l = 1) in natural units
// (c = log2 e); the rules above give the total.
// A partial whose lse is +-inf saw no key: it is neither weighed nor read (its O was never
// written).  NaN (a NaN score) is weighed.  The lanes hold 32 splits' LSEs at once (lane i:
// split s0 + i): one round trip per 32 splits.
struct PartialsTotal {
  float lse, lse_log2;
  float lane_lse;  // the LSE of split `lane` (-inf past the splits), as loaded
  bool empty;      // no partial with a key (NaN: not empty)
};
__device__ __forceinline__ bool partial_has_keys(float lse) { return fabsf(lse) != pos_inf(); }
template <class LoadLse>
__device__ __forceinline__ PartialsTotal partials_total(int n, float sink, int lane, LoadLse lse_of) {
  auto lse_at = [&](int s) { return s < n ? lse_of(s) : neg_inf(); };
  const float l_first = lse_at(lane);  // splits 0 .. 31, kept (decode splits rarely pass 32)
  float mx = neg_inf();
  for (int s0 = 0; s0 < n; s0 += 32) {
    const float l = s0 == 0 ? l_first : lse_at(s0 + lane);
    if (partial_has_keys(l)) mx = fmaxf(mx, l);  // finite or NaN (fmaxf skips NaN)
  }
  mx = fmaxf(warp_max(mx), sink);
  const float shift = row_shift(mx, kLog2e);
  float total = 0.f;
  for (int s0 = 0; s0 < n; s0 += 32) {
    const float l = s0 == 0 ? l_first : lse_at(s0 + lane);
    if (partial_has_keys(l)) total += part_weight(l, kLog2e, shift);
  }
  total = warp_sum(total) + part_weight(sink, kLog2e, shift);  // sink -inf: + 0
  PartialsTotal t;
  t.lane_lse = l_first;
  t.empty = total == 0.f;
  t.lse = state_lse(mx, total, kLog2e);
  t.lse_log2 = t.lse * kLog2e;
  return t;
}

template <int kMRep, class M = FastMath>
struct OnlineSoftmax {
  using T = typename M::T;
  T row_max[kMRep][2];  // in the units S is held in; -inf while no key was visible
  T row_sum[kMRep][2];  // this lane's partial sum of p

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mi][h] = T(neg_inf());
        row_sum[mi][h] = T(0);
      }
  }

  // Turns S into P (in place, fp32) and rescales O.  c: multiplier to log2 units.
  // O is rescaled only when some row of the warp changed its max (one warp vote per tile):
  // alpha is exactly 1 otherwise, and after the first few tiles of a long row the max rarely
  // moves, which saves kMRep x kDTiles x 4 FMULs per thread per tile.
  template <int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(T (&s)[kMRep][kNTiles][4],
                                         T (&o)[kMRep][kDTiles][4], T c) {
    T alpha[kMRep][2];
    if (to_probabilities(s, c, alpha)) rescale(o, alpha);
  }

  // The two halves of update(), for a kernel whose O is still being written by an asynchronous
  // P V of the previous tile (sm90): S -> P and the new row statistics now, returning whether
  // any row of the warp changed its max; rescale(o, alpha) once that P V has completed.
  template <int kNTiles>
  __device__ __forceinline__ bool to_probabilities(T (&s)[kMRep][kNTiles][4], T c,
                                                   T (&alpha)[kMRep][2]) {
    bool changed = false;
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        T mx = row_max[mi][h];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          mx = max_skip_nan(mx, max_skip_nan(s[mi][nt][2 * h], s[mi][nt][2 * h + 1]));
        mx = quad_max(mx);
        const T m_scaled = row_shift<M>(mx, c);
        changed |= mx != row_max[mi][h];
        alpha[mi][h] = part_weight<M>(row_max[mi][h], c, m_scaled);  // 0 when m_old = -inf
        row_max[mi][h] = mx;
        T sum = T(0);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const T pv = M::exp2(fma(s[mi][nt][2 * h + e], c, -m_scaled));
            s[mi][nt][2 * h + e] = pv;
            sum += pv;
          }
        row_sum[mi][h] = row_sum[mi][h] * alpha[mi][h] + sum;
      }
    return __any_sync(0xffffffffu, changed);
  }

  template <int kDTiles>
  __device__ __forceinline__ static void rescale(T (&o)[kMRep][kDTiles][4],
                                                 const T (&alpha)[kMRep][2]) {
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
  __device__ __forceinline__ T row_total(int mi, int h) const { return quad_sum(row_sum[mi][h]); }

  // O /= l and the natural-log LSE.  A row that never saw a key (l == 0: m is still -inf and
  // no score was NaN) outputs 0 and LSE +inf (flash-attn's convention for an empty softmax).
  // A row with a NaN score has l = NaN: inv = 1/l and the LSE come out NaN, so its output and
  // LSE are NaN -- never the empty marker (NaN == 0 is false).  An empty row's O is set to 0,
  // not multiplied by 0: a NaN in the V row of a key masked for it (same key tile) reached its
  // O as P V's 0 * NaN.
  // sink: the rows' attention sink in log2 units (-inf: none; see fold_sink).
  template <int kDTiles>
  __device__ __forceinline__ void finalize(T (&o)[kMRep][kDTiles][4], T c,
                                           T (&lse)[kMRep][2], T sink = neg_inf()) {
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const T sum = quad_sum(row_sum[mi][h]);
        const bool empty = sum == T(0);
        const SinkFoldOf<T> fold = fold_sink<M>(row_max[mi][h], sum, c, sink);
        const T inv = fold.o_scale;  // 1 / sum without a sink: NaN when sum is
        lse[mi][h] = fold.lse;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mi][dt][2 * h] = empty ? T(0) : o[mi][dt][2 * h] * inv;
          o[mi][dt][2 * h + 1] = empty ? T(0) : o[mi][dt][2 * h + 1] * inv;
        }
      }
  }
};

}  // namespace fa
