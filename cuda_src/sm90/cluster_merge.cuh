// sm90/cluster_merge.cuh -- the split-KV runs of one query tile merged inside a thread-block
// cluster (FA_SM90_CLUSTER_MERGE; the swapped MQA decode's one-round launches,
// _cuda/decode_sm90.py).  Issue 16's B = 1 step: split kernel ~10.9 us, then the kernel boundary
// and the combine kernel ~6.4 us (stop 44, H100) against cuDNN's whole step of 12.5 us.
//
// The host launches the split kernel with a cluster of `splits` CTAs (cuLaunchKernelEx; one
// round: a CTA per work item, so CTA c runs split c % splits of tile c / splits, and the
// cluster's CTAs are exactly one tile's splits -- cluster rank = split).  Each CTA's consumers
// stage their rows' O / l (float32) and LSE in the CTA's own shared memory (Q's buffer and the
// K / V ring, free once both consumer warpgroups' last products completed); one cluster
// barrier; then each CTA merges every `splits`-th row of the tile, reading its peers' staged
// rows over distributed shared memory (mapa + ld.shared::cluster), and stores O and the LSE in
// the caller's layout; a second cluster barrier keeps every CTA's shared memory alive until
// its peers have read it.  No partials in global memory, no counter, no second kernel.
// The merge rule is attn/softmax.cuh's partials_total, as the combine kernel's.
// Signalled at run time by the split arguments (SplitOut): no partials (oaccum null) and more
// than one split -- a launch the host makes only as a cluster (with one split, oaccum null is
// the direct output of one run).
#pragma once
#include "../common.cuh"
#include "../attn/softmax.cuh"

namespace fa {
namespace cluster {

__device__ __forceinline__ int rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ int size() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return (int)r;
}
// Every non-exited thread of every CTA of the cluster arrives, then waits: shared-memory writes
// before the arrival (release) are visible to every thread of the cluster after the wait
// (acquire).  Not .aligned: the producer and the consumers reach it from different code.
__device__ __forceinline__ void sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// The shared::cluster address of `smem_addr` (this CTA's shared window) in CTA `cta`'s memory.
__device__ __forceinline__ u32 map(u32 smem_addr, int cta) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr), "r"(cta));
  return r;
}
__device__ __forceinline__ float ld_f32(u32 cluster_addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr));
  return v;
}
__device__ __forceinline__ float4 ld_f32x4(u32 cluster_addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_addr));
  return v;
}

}  // namespace cluster

// Whether a split launch merges in its cluster (the file comment): no partials, several splits.
__device__ __forceinline__ bool cluster_merge_launch(const float* oaccum, int num_splits) {
  return oaccum == nullptr && num_splits > 1;
}

// The staged rows of one CTA, from `base` (Q's buffer, 1024-byte aligned, and the ring after
// it): the LSE of each of the tile's kBlockM rows, then each row's O / l, kHeadDim float32.
template <class Tr>
struct ClusterStage {
  static constexpr int kLseBytes = Tr::kBlockM * 4;
  static constexpr int kRowBytes = Tr::kHeadDim * 4;
  static constexpr int kBytes = kLseBytes + Tr::kBlockM * kRowBytes;
  static constexpr bool kFits = kBytes <= Tr::kSmemQ + 2 * Tr::kStages * Tr::kSmemKV;

  __device__ static u32 lse(u32 base, int row) { return base + 4 * row; }
  __device__ static u32 o(u32 base, int row, int col) {
    return base + kLseBytes + row * kRowBytes + 4 * col;
  }

  // A consumer warpgroup's rows (its accumulators after softmax.finalize: O / l) and their
  // LSEs; rows from rows_valid on are not staged (no CTA reads them).  The walk over the
  // accumulators is flash_fwd.cu store_rows' (rows g, g + 8; columns 8 dt + 2 t): a visitor
  // shared by the two changed the shipped split kernels' machine code, which no device could
  // test this session (stop 48), so it waits for a session that can.
  __device__ static void stage(u32 base, const float (&acc_o)[1][Tr::kDTiles][4],
                               const float (&lse_rows)[1][2], int cw, int warp, int lane,
                               int rows_valid) {
    static_assert(kFits, "the staged rows must fit Q's buffer and the ring");
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = Tr::kWgRows * cw + 16 * warp + 8 * h + g;
      if (row >= rows_valid) continue;
#pragma unroll
      for (int dt = 0; dt < Tr::kDTiles; ++dt)
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(o(base, row, 8 * dt + 2 * t)),
                     "f"(acc_o[0][dt][2 * h]), "f"(acc_o[0][dt][2 * h + 1])
                     : "memory");
      if (t == 0) st_shared_b32(lse(base, row), __float_as_uint(lse_rows[0][h]));
    }
  }
};

// One warp merges row `row` of the tile over the cluster's n splits (n <= 32: the lanes hold
// the splits' LSEs, partials_total) and stores it: 16-bit O (zeros when no split saw a key) at
// `out_row`, the LSE at `lse_out`.  Lane i owns 16-byte column chunks i and i + 32; the peers'
// chunks are loaded kBatch splits at a time before any is used, so a batch costs one round trip
// over the cluster's shared memory.  A split without keys (LSE +-inf) weighs 0 and its O is not
// read (its rows hold 0 / 0); a NaN LSE weighs NaN, as in the combine kernel.
template <class Tr, class Elem>
__device__ __forceinline__ void cluster_merge_row(u32 base, int row, int n, int lane, int head_dim,
                                                  u16* out_row, float* lse_out) {
  using Stage = ClusterStage<Tr>;
  constexpr int kBatch = 8;
  constexpr int kChunkSets = ceil_div(Tr::kHeadDim / 4, 32);  // 16-byte chunks a lane
  const u32 lse_here = Stage::lse(base, row);
  const PartialsTotal total =
      partials_total(n, neg_inf(), lane, [&](int s) { return cluster::ld_f32(cluster::map(lse_here, s)); });
  const bool lane_keys = lane < n && partial_has_keys(total.lane_lse);
  const float lane_w = lane_keys ? part_weight(total.lane_lse, kLog2e, total.lse_log2) : 0.f;
  const int chunks = head_dim >> 2;
  const u32 row_here = Stage::o(base, row, 0);
  float4 acc[kChunkSets];
#pragma unroll
  for (int j = 0; j < kChunkSets; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < n; s0 += kBatch) {
    float4 v[kBatch][kChunkSets];
    float w[kBatch];
    bool take[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {  // every load of the batch first ...
      const int s = s0 + i;
      w[i] = __shfl_sync(0xffffffffu, lane_w, s & 31);
      take[i] = s < n && __shfl_sync(0xffffffffu, (int)lane_keys, s & 31) != 0;
      const u32 peer_row = cluster::map(row_here, take[i] ? s : 0);
#pragma unroll
      for (int j = 0; j < kChunkSets; ++j) {
        const int ch = lane + 32 * j;
        v[i][j] = take[i] && ch < chunks ? cluster::ld_f32x4(peer_row + 16 * ch)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {  // ... then the adds
      if (!take[i]) continue;
#pragma unroll
      for (int j = 0; j < kChunkSets; ++j) {
        acc[j].x += w[i] * v[i][j].x;
        acc[j].y += w[i] * v[i][j].y;
        acc[j].z += w[i] * v[i][j].z;
        acc[j].w += w[i] * v[i][j].w;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kChunkSets; ++j) {
    const int ch = lane + 32 * j;
    if (ch >= chunks) continue;
    float4 o = total.empty ? make_float4(0.f, 0.f, 0.f, 0.f) : acc[j];
    const u32 lo = Elem::pack(o.x, o.y), hi = Elem::pack(o.z, o.w);
    asm volatile("st.global.v2.b32 [%0], {%1,%2};" ::"l"(out_row + 4 * ch), "r"(lo), "r"(hi) : "memory");
  }
  if (lane == 0) *lse_out = total.lse;
}

}  // namespace fa
