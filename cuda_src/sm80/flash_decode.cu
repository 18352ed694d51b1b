// flash_decode.cu -- split-KV decode attention (flash-decoding) with GQA packing, and the
// combine kernel that merges split partials (also serves merge_attention_states).
//
// Decode is memory-bound: per kv head, all H / Hk query heads that share it (and all of the
// sequence's few query tokens) are the rows of ONE tile, so each K/V byte is read once per kv
// head instead of once per query head.  Packed row r of a CTA -> query token i = r / g and query
// head hk * g + r % g (g = H / Hk).  kDecodeRows = 16 rows per CTA (one mma m16 tile); more
// packed rows go to further m-blocks (blockIdx.x), which re-read K/V mostly from L2.
//
// Grid (num_splits * m_blocks, Hk, B); 4 warps.  The split's key tiles (kTileN = 16 keys, or 32:
// DecodeTile) are dealt round-robin to the warps; each warp streams ITS tiles through its own cp.async ring of kStages slots
// (no CTA barrier in the main loop: only __syncwarp), keeps its own online-softmax state
// (m, l, O), and the 4 states are merged through shared memory at the end.
//
// Per key tile and warp:  S(16 x kTileN) = Q(16xD) K^T (mma m16n8k16, packed rows as M; padding
// rows masked), then the prefill kernel's own pieces: the logit transform and the mask
// (mask.cuh: window.cuh's visibility rule, with each packed row's query index and ALiBi slope),
// the online softmax (softmax.cuh: OnlineSoftmax), and O(16xD) += P V with P in registers.
// The 4 warps' states are merged with softmax.cuh's merge rules; so is the combine kernel's.
//
// Outputs: num_splits == 1 -> out (16-bit) + lse (H, total_q) directly (a row with no visible
// key: out 0, lse +inf).  num_splits > 1 -> float32 partial O (normalized) into
// oaccum (num_splits, total_q, H, D) and lse_accum (num_splits, H, total_q); an empty split
// writes lse -inf and O = 0 (the merges give a -inf split weight 0; they load its O anyway).
// Non-finite scores (NaN q / k / ALiBi slope, an inf in k): as in softmax.cuh, a NaN or +inf
// score gives p = NaN, hence l = NaN and O = NaN; the row (or split) then reports out NaN and
// lse NaN -- never the empty marker, which is l == 0 exactly -- and the combine keeps it NaN.
//
// Masks, softcap, ALiBi and paged addressing are run-time switches (uniform branches): the
// kernel waits on memory, and one instantiation per (dtype, head-dim bucket) keeps CI's compile
// time small.
//
// FP8 K/V (Kv = KvE4M3 / KvE5M2, attn/fp8.cuh; head dims 64 / 128 / 256, a multiple of 16):
// the ring holds the float8 rows as read (half the bytes of a 16-bit tile).  The tensor cores
// run in float16 whatever the query type -- float16 holds every float8 value exactly -- so
// bfloat16 queries are rescaled to float16 once per CTA, a power of two per row (below).  The
// dequantization scales of the kv head (k_scale, v_scale: one float per kv head, vLLM's
// x = float(x8) * scale, times the conversion's own power of two) multiply S before the logit
// transform and O at the end.
//
// Direct fragments: ldmatrix reads the float8 ring itself, each 16-bit "element" a pair of
// float8 bytes, and byte-pair conversions in registers (Kv::to_f16x2, exact) make the mma
// fragments (fp8_direct_* below).  They replaced a float16 staging tile per warp, into which
// each landed tile was converted for the 16-bit ldmatrix / mma code: on an H100 (2026-12-06;
// GQA 32/8, D = 128, kernel time) the direct fragments took 230 us against the staging tile's
// 257 us at B = 64, context 4096, page 16 (230 vs 242 us at page 256; B = 16, context 16384:
// 223 vs 230 us), with all 44 float8 GPU tests passing, and the CTA's shared memory loses the
// staging tile (D = 128: 60 KB instead of 71 KB).
// K: a lane's non-transposed ldmatrix register holds bytes 4t .. 4t + 3 of its key's 16-byte
// block, i.e. head-dim positions 4t + {0, 1} (the B fragment's k = 2t, 2t + 1) and 4t + {2, 3}
// (k = 2t + 8, 2t + 9): the same positions of Q are brought into the A fragment's order once,
// by a word permutation of Q's rows in shared memory (q_words_for_fp8; S = sum_d q_d k_d does
// not depend on the order of d).  V: a transposed ldmatrix register holds (key 2t, columns
// 2g, 2g + 1) and (key 2t + 1, the same columns); one PRMT pairs the keys per column, so one
// mma takes the even columns of a 16-column block and the next the odd ones -- the epilogue
// writes O's columns back in order (fp8_direct_column).  The ring's rows are swizzled as the
// 16-bit ones (ring_offset).
//
// FA_DECODE_FUSED_COMBINE (a tuning switch, on by default; =0 builds the kernel without it, the
// A/B baseline of benchmarks): with split-KV, the last split CTA of each (query tile, kv head,
// sequence) to finish combines the tile's partials itself (a per-tile counter, see the end of
// flash_decode), so a split decode step is one launch instead of two (issue 16: B = 1 latency).
// The host turns it on per plan (decode.py fused_combine_applies) by passing split_counters;
// null keeps the combine kernel (mixed batches, varlen queries, V-split, adapted operands).  On
// by default since an H100 run (2026-12-06; GQA 32/8, D = 128, page 16, kernel time): B = 1
// took 28.8 us against 38.2 us with the combine kernel at context 4096, 79.9 vs 101.4 us at
// 32768; B = 16 unchanged.
#ifndef FA_DECODE_FUSED_COMBINE
#define FA_DECODE_FUSED_COMBINE 1
#endif
#include "../attn/block_info.cuh"
#include "../attn/fp8.cuh"
#include "../attn/mask.cuh"
#include "../attn/softmax.cuh"
#include "mma.cuh"

namespace fa {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = 32 * kDecodeWarps;
constexpr int kDecodeRows = 16;   // packed (query, head) rows per CTA
constexpr int kDecodeTileN = 16;  // keys per warp tile (DecodeTile: 32 in the _t32 kernels)

struct DecodeParams {
  FwdParams f;            // the prefill kernel's parameters, same meaning
  float* oaccum;          // (num_splits, total_q, H, head_dim) float32, split mode only
  float* lse_accum;       // (num_splits, H, total_q) float32, split mode only
  int num_splits;
  int m_blocks;           // ceil(max_seqlen_q * g / kDecodeRows)
  int paged;              // run-time: K/V through the block table
  const float* k_scale;   // (Hk,) float8 K/V dequantization scales, or null (16-bit K/V)
  const float* v_scale;
  // FA_DECODE_FUSED_COMBINE: (B, gridDim.y, m_blocks) int32 counters, zero between launches
  // (the combining CTA resets its own), or null: the combine kernel merges the splits.
  int* split_counters;
};

// Decode traits per head-dim bucket: kStages ring slots per warp.  Shared memory per CTA is
// Q (16 rows) + 4 warps x kStages x (K + V tiles of kTileN rows): DecodeSmem.
// Little's law: ~4.8 TB/s x ~1.5 us / 132 SMs ~ 55 KB in flight per SM are needed; every
// configuration below keeps >= 100 KB in flight per SM.
// kVSplits (head dims 384 / 512, as the prefill's V-split, sm80/kernel_traits.cuh): a warp's O
// is 16 rows x D fp32 (D / 2 per lane), too many registers above 256, so kVSplits CTAs share each
// (tile, kv head, sequence), each computing S over the whole head dim and O for its
// kD / kVSplits columns of V (blockIdx.y = hk * kVSplits + chunk).  K is read kVSplits times.
// kMinBlocksFp8: CTAs per SM of the float8 kernel (DecodeSmem<kD, 1>; 0: none is built).  Its
// ring holds half the bytes, so D = 128 fits 3 CTAs (60 KB each) where the 16-bit kernel fits
// 2: 12 warps per SM hide the per-tile latency that bounds float8 decode (stop 32, H100: at 2
// CTAs the float8 kernel read 1.8 TB/s, 0.6 of copy, with conversion no longer the limit).
// D = 128 runs 4 CTAs (52 KB each, 127 registers) since stop 38's sweep (H100, GQA 32/8 page 16,
// kernel time): B = 64 ctx 4096 220.7 -> 205.2 us (16 warps per SM; 512 CTAs on 528 slots run
// unsplit in one wave, where 396 slots took 2 splits and 2.6 waves -- forcing 3 splits at 3
// CTAs gave only 218.8, so the warps, not the wave tail, were what it lacked), B = 16 ctx
// 16384 207.4 -> 208.0.  D = 64 at 5 spills (44 bytes); D = 256 at 2: see its define.
// Sweep switches, for device A/B runs only (the host's shared memory, register budget and split
// rule follow them through device_facts): FA_DECODE_FP8_CTAS_D<64|128|256>, the float8
// kernel's CTAs per SM; FA_DECODE_STAGES_D128 / FA_DECODE_CTAS_D128, the D = 128 ring's slots
// per warp and the 16-bit kernel's CTAs per SM.  NVRTC sm_90 (stop 37): float8 D = 128 at 4
// CTAs 127 registers, D = 256 at 2 CTAs 246, both without spills; D = 64 at 5 spills 44 bytes.
#ifndef FA_DECODE_STAGES_D128
#define FA_DECODE_STAGES_D128 3
#endif
#ifndef FA_DECODE_CTAS_D128
#define FA_DECODE_CTAS_D128 2
#endif
#ifndef FA_DECODE_FP8_CTAS_D64
#define FA_DECODE_FP8_CTAS_D64 4
#endif
#ifndef FA_DECODE_FP8_CTAS_D128
#define FA_DECODE_FP8_CTAS_D128 4
#endif
// Float8 D = 256 at 2 CTAs per SM (104 KB each, 246 registers sm_90, 255 sm_80, no spills) since
// stop 40 (H100, GQA 32/8 page 16, kernel time, clean flush): B = 16 ctx 16384 511.3 -> 375.6 us,
// B = 64 ctx 4096 373.6 -> 373.1, B = 1 ctx 4096 23.7 -> 24.3.  The machine code is the same
// (255 registers is the cap at 1 or 2 CTAs); what changes is the host's split plan, which
// counts 2 slots per SM: B = 16's 128 CTAs now split in 2 (256 CTAs, 8 warps per SM) where one
// CTA per SM left 4 warps to hide each tile's latency.  On an A100 (164 KB per SM) one CTA fits.
#ifndef FA_DECODE_FP8_CTAS_D256
#define FA_DECODE_FP8_CTAS_D256 2
#endif
// FA_DECODE_TILE32_STAGES (2): ring slots of the 32-key kernels (DecodeTile; 3 measured slower
// in stop 42).
#ifndef FA_DECODE_TILE32_STAGES
#define FA_DECODE_TILE32_STAGES 2
#endif
template <int kD> struct DecodeTraits;
struct DecodeTraitsBase { static constexpr int kVSplits = 1; };
template <> struct DecodeTraits<64> : DecodeTraitsBase { static constexpr int kStages = 4, kMinBlocks = 3, kMinBlocksFp8 = FA_DECODE_FP8_CTAS_D64; };  // 66 KB/CTA; float8 35 KB
template <> struct DecodeTraits<128> : DecodeTraitsBase { static constexpr int kStages = FA_DECODE_STAGES_D128, kMinBlocks = FA_DECODE_CTAS_D128, kMinBlocksFp8 = FA_DECODE_FP8_CTAS_D128; };  // 100 KB/CTA; float8 52 KB
template <> struct DecodeTraits<256> : DecodeTraitsBase { static constexpr int kStages = 3, kMinBlocks = 1, kMinBlocksFp8 = FA_DECODE_FP8_CTAS_D256; };  // 200 KB/CTA; float8 104 KB
// 2 stages: 3 would pass the 227 KB limit (384: 228 KB).  512: 208 KB/CTA; 384: 156 KB/CTA.
template <> struct DecodeTraits<384> { static constexpr int kStages = 2, kMinBlocks = 1, kMinBlocksFp8 = 0, kVSplits = 2; };
template <> struct DecodeTraits<512> { static constexpr int kStages = 2, kMinBlocks = 1, kMinBlocksFp8 = 0, kVSplits = 2; };
// A kernel's warp tile of kTileN keys: its ring slots and CTAs per SM.  16 keys: the bucket's
// traits.  32 keys (16-bit K/V, head dim 128; decode.py DecodeKey.tile, taken where a kv head
// has at most 16 packed rows): S is 16 x 32, four n-tiles of independent mma chains, and the
// softmax's row reductions, the mask / logit tests and the loop's integer work come once per
// 32 keys; FA_DECODE_TILE32_STAGES slots (2: 132 KB, one CTA of 4 warps per SM, which an A100
// fits too).  H100, stop 42, kernel time, GQA 32/8 page 16: B = 1 ctx 32768 58.9 -> 56.4 us,
// B = 16 ctx 16384 361.3 -> 353.8, B = 64 ctx 4096 355.2 / 355.9; but MQA 32/1 (two 16-row
// tiles a kv head) B = 64 65.4 -> 69.6 and B = 16 66.3 -> 77.3 (4 warps per SM where the
// 16-key kernel has 8), so wide groups keep 16-key tiles.  cuDNN's decode kernel runs one CTA
// of 4 warps per SM at ~300 instructions per 16 keys and 16 rows (stop 40's Nsight Compute).
template <int kD, int kKvBytes, int kTileN>
struct DecodeTile {
  static_assert(kTileN == kDecodeTileN || (kTileN == 32 && kKvBytes == 2 && kD == 128),
                "32-key tiles: 16-bit K/V, D = 128");
  static constexpr int kStages = kTileN == 32 ? FA_DECODE_TILE32_STAGES : DecodeTraits<kD>::kStages;
  static constexpr int kMinBlocks = kTileN == 32 ? 1 : DecodeTraits<kD>::kMinBlocks;
};

// The K / V ring holds unpadded rows (kD or kDV elements of kKvBytes bytes: 2, or 1 for
// float8, which ldmatrix reads directly) whose 16-byte chunks are XOR-swizzled by row
// (ring_offset), so that every cp.async of a 128-byte piece of a key row lands in one aligned
// 128-byte line of shared memory, and the 8 row addresses of one ldmatrix phase (8 rows, one
// chunk) still fall in 8 different bank groups.  Rows padded by 16 bytes, as before, did the
// latter but split each row's lines across two: Nsight Compute counted 50.4 M L2 sectors read
// for the 33.6 M a B = 64, context 4096 call needs (the L1 sent the copies as ~2.3-sector
// requests, a third of them for sectors already requested; cuDNN's decode kernel, 33.6 M in
// whole 128-byte requests) and 86% L2 throughput (stop 36, H100).  Swizzled: 33.6 M sectors,
// at the same kernel time (L2 was busy, not the limit).  Q keeps padded rows (read once).
template <int kD, int kKvBytes = 2, int kTileN = kDecodeTileN>
struct DecodeSmem {
  static constexpr int kDV = kD / DecodeTraits<kD>::kVSplits;  // V / O columns of a CTA
  static constexpr int kQRowBytes = (kD + 8) * 2;  // Q rows, padded by 16 bytes
  static constexpr int kQBytes = kDecodeRows * kQRowBytes;
  static constexpr int kRowBytesK = kD * kKvBytes;    // ring rows, unpadded (ring_offset)
  static constexpr int kRowBytesV = kDV * kKvBytes;
  static constexpr int kRingTileBytes = kTileN * kRowBytesK;
  static constexpr int kRingTileBytesV = kTileN * kRowBytesV;
  static_assert(kQBytes % 128 == 0 && kRingTileBytes % 128 == 0 && kRingTileBytesV % 128 == 0,
                "ring tiles start on 128-byte lines");
  static constexpr int kStageBytes = kRingTileBytes + kRingTileBytesV;  // K then V
  static constexpr int kWarpBytes = DecodeTile<kD, kKvBytes, kTileN>::kStages * kStageBytes;
  static constexpr int kMergeRow = kDV + 8;  // floats per row of the cross-warp merge buffer
  static constexpr int kMergeBytes = kDecodeWarps * kDecodeRows * kMergeRow * 4;
  static constexpr int kRingBytes = kDecodeWarps * kWarpBytes;
  static constexpr int kBytes = kQBytes + (kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes);
};

__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31; }

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// FA_DECODE_TIMELINE (a probe switch, 0 by default: no code): thread 0 of each CTA stamps
// %globaltimer (ns) at the phases of a decode step into fa_decode_timeline[cta][phase], which
// tools/decode_timeline.py reads back -- where a B = 1 step's time goes (issue 16).  Phases:
// 0 entry, 1 sequence lengths known, 2 warp 0's first tile landed, 3 warp 0's loop done,
// 4 the CTA's output / partial stored, 5 the split counter answered, 6 the last CTA's merge
// done, 7 exit.  CTAs past kTimelineCtas are not stamped.
#ifndef FA_DECODE_TIMELINE
#define FA_DECODE_TIMELINE 0
#endif
#if FA_DECODE_TIMELINE
constexpr int kTimelineCtas = 8192;
extern "C" {  // C linkage: the probe tool reads it by name (RawModule.get_global)
__device__ unsigned long long fa_decode_timeline[kTimelineCtas][8];
}
__device__ __forceinline__ void timeline_stamp(int phase) {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x == 0 && cta < kTimelineCtas) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    fa_decode_timeline[cta][phase] = t;
  }
}
#define FA_DECODE_STAMP(phase) timeline_stamp(phase)
#else
#define FA_DECODE_STAMP(phase)
#endif

// Byte offset in a ring tile of 16-byte chunk c of row r (rows of kRowBytes, DecodeSmem): the
// chunk index XOR a row function that gives rows r0 .. r0 + 7 (r0 % 8 == 0) 8 different bank
// groups for one logical chunk -- r % 8 for rows of >= 128 bytes; for 64-byte rows (float8
// D = 64: two rows per 128 bytes), (r / 2) % 4, the rows' halves of a line doing the rest.
template <int kRowBytes>
__device__ __forceinline__ u32 ring_offset(int r, int c) {
  constexpr int kChunks = kRowBytes / 16;
  static_assert(kChunks % 8 == 0 || kChunks == 4, "ring rows of 64 bytes or a multiple of 128");
  const int x = kChunks >= 8 ? (r & 7) : ((r >> 1) & 3);
  return r * kRowBytes + ((c ^ x) << 4);
}

// Float8 K/V with bfloat16 queries (the tensor cores run in float16): each of the CTA's 16 Q
// rows in shared memory is rewritten in place as float16 of q * 2^-e, e per row such that the
// row's largest |q| lands in [2^14, 2^15) -- exact for every element above 2^-24 of the row's
// largest, past bfloat16's 8 bits -- and 2^e (which S's row must be multiplied by) goes to
// `row_factor`.  16 rows x 8 threads, kD / 8 elements per thread; NaN / inf elements stay NaN /
// inf (they do not move e).
template <int kD, int kRowBytes>
__device__ __forceinline__ void q_bf16_to_f16_rows(u32 q_smem, float* row_factor) {
  constexpr int kPer = kD / 8;
  const int r = threadIdx.x / 8, part = threadIdx.x % 8;
  const u32 base = q_smem + r * kRowBytes + part * kPer * 2;
  u32 w[kPer / 2];
#pragma unroll
  for (int i = 0; i < kPer / 8; ++i) {
    u32 v[4];
    ld_shared_v4(v, base + 16 * i);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[4 * i + k] = v[k];
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPer / 2; ++i)
    amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(w[i] << 16)),
                             fabsf(__uint_as_float(w[i] & 0xffff0000u))));
#pragma unroll
  for (int m = 1; m < 8; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  int e = 0;
  if (amax > 0.f && amax < pos_inf()) {
    frexpf(amax, &e);  // amax = m 2^e, m in [0.5, 1)
    e = max(-100, min(100, e - 15));
  }
  const float f = ldexpf(1.f, -e);
#pragma unroll
  for (int i = 0; i < kPer / 8; ++i) {
    u32 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float lo = __uint_as_float(w[4 * i + k] << 16) * f;
      const float hi = __uint_as_float(w[4 * i + k] & 0xffff0000u) * f;
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v[k]) : "f"(hi), "f"(lo));
    }
    st_shared_v4(base + 16 * i, v);
  }
  if (part == 0) row_factor[r] = ldexpf(1.f, e);
}

// ---- Combine: out = sum_s exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s) --------------------
// One warp per (row, head).  Partial s of (row, head) lives at
//   o_in + s * o_split_stride + row * o_row_stride + head * o_head_stride   (elements)
//   lse_in + s * lse_split_stride + (row / lse_rows) * lse_batch_stride + head * lse_head_stride + row % lse_rows
// (lse_rows = rows per batch of a dense (B, H, S) LSE; = rows with a varlen (H, total) one).
// A partial with an infinite LSE (either sign: no visible key) weighs 0 and its O may hold
// anything: combine_pair never reads it, merge_split_partials (float32 partials) loads it with
// the others and discards it.  No partial with a key -> out 0, lse +inf.  A partial whose LSE is NaN
// (a NaN score) makes the row NaN: it passes the "not infinite" test, fmaxf skips it in the max,
// and its weight exp2(NaN) = NaN makes the total, the lse and every output element NaN.
// Sinks (split-KV decode of a call with sinks; never merge_attention_states): the sink of the
// head is one more partial with lse = sinks[head] and O = 0, so it enters the max and the total
// but no output element -- counted once, since the split partials leave it out.
// Element types by code: 0 float32, 1 float16, 2 bfloat16.
struct CombineParams {
  const void* o_in;
  const float* lse_in;
  const float* sinks;  // (heads,) attention-sink logits, natural units, or null (see below)
  void* o_out;
  float* lse_out;
  i64 o_split_stride, o_row_stride, o_head_stride;
  i64 lse_split_stride, lse_batch_stride, lse_head_stride;
  i64 out_row_stride, out_head_stride;
  i64 lse_out_batch_stride, lse_out_head_stride;
  int lse_rows;
  int rows, heads, head_dim, num_splits;
  int in_type, out_type;
};

// Offset of (row, head)'s LSE in a combine LSE array (the comment above; lse_rows = 1 with
// batch stride H and head stride 1 is a (rows, H) array, the swapped decode's partials).
__device__ __forceinline__ i64 combine_lse_offset(int row, int head, int lse_rows, i64 batch_stride,
                                                  i64 head_stride) {
  return (i64)(row / lse_rows) * batch_stride + (i64)head * head_stride + row % lse_rows;
}

// One (row, head) pair of the combine kernel, by one warp.  Its loads switch on the element
// type at run time (load_elem); lane i owns head-dim columns d0 + i + 32 j (j < kCombineCols),
// one split at a time with its kCombineCols loads in flight together (2 or 4 splits at a time
// made ptxas spill on sm_80, 8 / 24 bytes).  The decode kernel's own merge (the last split CTA,
// merge_split_partials below) reads float32 partials and keeps more loads in flight.
constexpr int kCombineCols = 4;
__device__ __forceinline__ void combine_pair(const CombineParams& c, int row, int head, int lane) {
  const i64 lse_off = combine_lse_offset(row, head, c.lse_rows, c.lse_batch_stride, c.lse_head_stride);
  const int n = c.num_splits;
  auto lse_of = [&](int s) { return c.lse_in[s * c.lse_split_stride + lse_off]; };
  const PartialsTotal t = partials_total(n, c.sinks != nullptr ? c.sinks[head] : neg_inf(), lane, lse_of);
  const i64 o_off = (i64)row * c.o_row_stride + (i64)head * c.o_head_stride;
  const i64 out_off = (i64)row * c.out_row_stride + (i64)head * c.out_head_stride;
  for (int d0 = 0; d0 < c.head_dim; d0 += 32 * kCombineCols) {
    float acc[kCombineCols] = {};
    for (int s0 = 0; s0 < n; s0 += 32) {
      const float l = s0 == 0 ? t.lane_lse : (s0 + lane < n ? lse_of(s0 + lane) : neg_inf());
      const bool mine = partial_has_keys(l) && s0 + lane < n;
      const float w = mine ? part_weight(l, kLog2e, t.lse_log2) : 0.f;
      const int count = imin(32, n - s0);
      for (int i = 0; i < count; ++i) {
        const bool read = __shfl_sync(0xffffffffu, (int)mine, i);
        const float wi = __shfl_sync(0xffffffffu, w, i);
        float o[kCombineCols];
#pragma unroll
        for (int j = 0; j < kCombineCols; ++j) {  // every load first ...
          const int d = d0 + lane + 32 * j;
          o[j] = read && d < c.head_dim ? load_elem(c.o_in, (i64)(s0 + i) * c.o_split_stride + o_off + d, c.in_type) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < kCombineCols; ++j) acc[j] += wi * o[j];  // ... then the adds
      }
    }
#pragma unroll
    for (int j = 0; j < kCombineCols; ++j) {
      const int d = d0 + lane + 32 * j;
      if (d < c.head_dim) store_elem(c.o_out, out_off + d, c.out_type, t.empty ? 0.f : acc[j]);
    }
  }
  if (lane == 0)
    c.lse_out[combine_lse_offset(row, head, c.lse_rows, c.lse_out_batch_stride, c.lse_out_head_stride)] = t.lse;
}

// The decode kernel's own merge of a tile's split partials (FA_DECODE_FUSED_COMBINE: the last
// split CTA to finish runs it, one warp per (row, head) pair): float32 partials in oaccum's
// layout, read from L2 (__ldcg: other CTAs of this launch wrote them, and this SM's L1 may hold
// stale lines).  Its time is latency -- a split decode step ends with it -- so it keeps many
// loads in flight: the lanes take the partials as (split, 16-byte column chunk), a split's
// head_dim / 4 chunks over `lanes` lanes (the power of two >= chunks, at most 32; past 32
// chunks, two a lane), 32 / lanes splits a step; each lane issues kLoads float4 loads with
// their splits' LSEs before the first add, so one L2 round trip covers kLoads steps (16 splits
// at head_dim 128 with kLoads = 16), and the first batch is in flight with the LSE pass.
// kLoads = 16 holds ~80 registers of loads: where the CTAs per SM leave fewer than 160 a thread
// (float8 D = 64 at 4 CTAs, 128) ptxas spilled it on sm_90, so those kernels take 8.  Sums of one
// chunk held by different lanes meet by shuffles at the end.  (Before, the combine kernel's
// order with 4 splits x 4 scalar columns per round trip: a B = 1 step's merge took 2.1 / 4.9 /
// 8.4 us at 2 / 14 / 29 splits, ~1 us per round trip -- H100, 2026-12-06, decode_timeline.py.)
// kBatchedLse: the LSEs are addressed as combine_pair addresses them (lse_rows, the batch
// strides: the combine kernel's callers), else as the decode kernel's (splits, H, total_q)
// partials and (H, total_q) output.
template <class Elem, int kLoads, bool kBatchedLse = false>
__device__ __forceinline__ void merge_split_partials(const CombineParams& c, int row, int head, int lane) {
  const int n = c.num_splits;
  const i64 lse_off = kBatchedLse ? combine_lse_offset(row, head, c.lse_rows, c.lse_batch_stride, c.lse_head_stride)
                                  : (i64)head * c.lse_head_stride + row;
  const float* o_in = static_cast<const float*>(c.o_in);
  const i64 o_off = (i64)row * c.o_row_stride + (i64)head * c.o_head_stride;
  const int chunks = c.head_dim >> 2;  // head_dim % 8 == 0 (the host pads): >= 2 whole chunks
  const bool wide = chunks > 32;       // head dims above 128: chunks lane and lane + 32
  const int lanes = wide ? 32 : 1 << (32 - __clz(chunks - 1));
  const int step = 32 / lanes;         // splits per step
  const int chunk = lane & (lanes - 1), sub = lane / lanes;
  const int per_batch = (wide ? kLoads / 2 : kLoads) * step;  // splits per round trip
  auto lse_of = [&](int s) { return __ldcg(c.lse_in + s * c.lse_split_stride + lse_off); };
  float4 o[kLoads];
  float l[kLoads];
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int s = s0 + (wide ? j >> 1 : j) * step + sub;
      const int ch = chunk + (wide && (j & 1) ? 32 : 0);
      const bool ok = s < n && ch < chunks;
      l[j] = ok ? lse_of(s) : neg_inf();
      o[j] = ok ? __ldcg(reinterpret_cast<const float4*>(o_in + s * c.o_split_stride + o_off) + ch)
                : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_batch(0);
  const PartialsTotal t = partials_total(n, c.sinks != nullptr ? c.sinks[head] : neg_inf(), lane, lse_of);
  float4 acc0 = make_float4(0.f, 0.f, 0.f, 0.f), acc1 = acc0;  // chunks `chunk`, `chunk + 32`
  auto add4 = [](float4& a, const float4& b) { a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w; };
  for (int s0 = 0;;) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      // A partial without keys (lse +-inf; also the slots past the splits) adds exactly 0,
      // whatever its O holds (zeros from the decode kernel; merge_attention_states' inputs may
      // hold anything); a NaN lse weighs NaN.
      const bool keys = partial_has_keys(l[j]);
      const float w = keys ? part_weight(l[j], kLog2e, t.lse_log2) : 0.f;
      const float4 v = keys ? make_float4(w * o[j].x, w * o[j].y, w * o[j].z, w * o[j].w)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
      if ((j & 1) && wide) add4(acc1, v);  // (j & 1) is known per unrolled j: no indexed array
      else add4(acc0, v);
    }
    s0 += per_batch;
    if (s0 >= n) break;
    load_batch(s0);
  }
  for (int m = lanes; m < 32; m *= 2) {  // the lanes of one chunk (lanes < 32: one chunk a lane)
    add4(acc0, make_float4(__shfl_xor_sync(0xffffffffu, acc0.x, m), __shfl_xor_sync(0xffffffffu, acc0.y, m),
                           __shfl_xor_sync(0xffffffffu, acc0.z, m), __shfl_xor_sync(0xffffffffu, acc0.w, m)));
  }
  u16* out = static_cast<u16*>(c.o_out) + (i64)row * c.out_row_stride + (i64)head * c.out_head_stride;
  auto store4 = [&](int ch, float4 v) {
    if (t.empty) v = make_float4(0.f, 0.f, 0.f, 0.f);
    const u32 lo = Elem::pack(v.x, v.y), hi = Elem::pack(v.z, v.w);
    asm volatile("st.global.v2.b32 [%0], {%1,%2};" ::"l"(out + 4 * ch), "r"(lo), "r"(hi) : "memory");
  };
  if (sub == 0 && chunk < chunks) store4(chunk, acc0);  // lanes rounds chunks up to a power of two
  if (wide && chunk + 32 < chunks) store4(chunk + 32, acc1);
  if (lane == 0)
    c.lse_out[kBatchedLse ? combine_lse_offset(row, head, c.lse_rows, c.lse_out_batch_stride, c.lse_out_head_stride)
                          : (i64)head * c.lse_out_head_stride + row] = t.lse;
}

// Whether merge_split_partials serves a combine call: float32 partials whose 16-byte chunks
// are aligned (base, strides, head dim), at most 64 chunks a row (head_dim <= 256), and 16-bit
// outputs stored 4 elements (8 bytes) at a time.  Split-KV decode steps (their partials are
// the kernels' float32 workspace) qualify; merge_attention_states' inputs and float32 outputs
// take combine_pair.  (combine_pair's order -- one split per round trip -- made the swapped
// MQA decode's combine ~1 us per split at B = 1: stop 44.)
__device__ __forceinline__ bool merge_fast_path(const CombineParams& c) {
  const i64 in_strides = c.o_split_stride | c.o_row_stride | c.o_head_stride;
  const i64 out_strides = c.out_row_stride | c.out_head_stride;
  return c.in_type == 0 && (c.out_type == 1 || c.out_type == 2) && c.head_dim % 4 == 0 &&
         c.head_dim <= 256 && (in_strides & 3) == 0 && (out_strides & 3) == 0 &&
         (reinterpret_cast<unsigned long long>(c.o_in) & 15) == 0 && (reinterpret_cast<unsigned long long>(c.o_out) & 7) == 0;
}

__device__ __forceinline__ void combine_states(const CombineParams& c) {
  const i64 pair = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (pair >= (i64)c.rows * c.heads) return;
  const int row = (int)(pair / c.heads), head = (int)(pair % c.heads);
  if (!merge_fast_path(c)) combine_pair(c, row, head, lane);
  else if (c.out_type == 2) merge_split_partials<Bf16, 16, true>(c, row, head, lane);
  else merge_split_partials<F16, 16, true>(c, row, head, lane);
}

// Float8 K/V: Q's rows (16-bit, in shared memory) in the order the float8 K fragments
// take the head dim: in each 16-element k-step block, word w (elements 2w, 2w + 1) becomes word
// kQWordOrder[w] -- the A fragment's k = 2t, 2t + 1 then hold positions 4t, 4t + 1 and its
// k = 2t + 8, 2t + 9 positions 4t + 2, 4t + 3, as a lane's K register does (file comment).
template <int kD, int kRowBytes>
__device__ __forceinline__ void q_words_for_fp8(u32 q_smem) {
  constexpr int kBlocks = kD / 16;
  for (int idx = threadIdx.x; idx < kDecodeRows * kBlocks; idx += kDecodeThreads) {
    const u32 addr = q_smem + (idx / kBlocks) * kRowBytes + (idx % kBlocks) * 32;
    u32 a[4], b[4], v[4];  // old words 0-3, 4-7
    ld_shared_v4(a, addr);
    ld_shared_v4(b, addr + 16);
    // new word w = old word {0, 2, 4, 6, 1, 3, 5, 7}[w]
    v[0] = a[0]; v[1] = a[2]; v[2] = b[0]; v[3] = b[2];
    st_shared_v4(addr, v);
    v[0] = a[1]; v[1] = a[3]; v[2] = b[1]; v[3] = b[3];
    st_shared_v4(addr + 16, v);
  }
}

// Float8 K/V: the output column of accumulator element e (0, 1) of n8 tile n: tiles
// 2b / 2b + 1 hold the even / odd columns of the 16-column block b.
__device__ __forceinline__ constexpr int fp8_direct_column(int n, int tq, int e) {
  return 16 * (n >> 1) + 4 * tq + 2 * e + (n & 1);
}

// Bytes (b0, b1, b2, b3) -> (b0, b2, b1, b3): a transposed V register's two keys paired per column.
__device__ __forceinline__ u32 pair_keys_per_column(u32 w) {
  u32 r;
  asm("prmt.b32 %0, %1, 0, 0x3120;" : "=r"(r) : "r"(w));
  return r;
}

template <int kD, typename Elem, class Kv = KvSame, int kTileN = kDecodeTileN>
__device__ void flash_decode(const DecodeParams& dp) {
  using Sm = DecodeSmem<kD, Kv::kBytes, kTileN>;
  constexpr bool kFp8 = Kv::kBytes == 1;
  // The tensor-core type: the query's, or float16 for float8 K/V (see the file comment).
  using Mma = conditional_t<kFp8, F16, Elem>;
  constexpr int kStages = DecodeTile<kD, Kv::kBytes, kTileN>::kStages;
  // The warp tile's n8 tiles, and the ballot bits of its keys (DecodeTile).
  constexpr int kNT = kTileN / 8;
  constexpr unsigned kKeyBits = kTileN == 32 ? 0xffffffffu : 0xffffu;
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row (bucket width)
  constexpr int kChunks8 = kD / 16;  // 16-byte chunks per float8 row
  constexpr int kVSplits = DecodeTraits<kD>::kVSplits, kDV = Sm::kDV, kChunksV = kDV / 8;
  // The fused merge's loads in flight per lane (merge_split_partials): 16 where the CTAs per SM
  // leave >= 160 registers a thread.
  constexpr int kCtasPerSm = kFp8 ? DecodeTraits<kD>::kMinBlocksFp8 : DecodeTile<kD, 2, kTileN>::kMinBlocks;
  constexpr int kMergeLoads = 65536 / (kDecodeThreads * kCtasPerSm) >= 160 ? 16 : 8;
  static_assert(!kFp8 || (kVSplits == 1 && kD % 32 == 0), "float8 K/V: head dims 64 / 128 / 256");
  // kCtasPerSm CTAs (each with ~1 KB reserved and ~0.7 KB static) fit an sm_90 SM's 228 KB.
  static_assert(kCtasPerSm * (Sm::kBytes + 2048) <= 228 * 1024,
                "decode: kMinBlocks / kMinBlocksFp8 CTAs do not fit one SM");
  const FwdParams& p = dp.f;
  extern __shared__ __align__(128) unsigned char smem[];  // 128: ring lines (DecodeSmem)
  __shared__ float s_m[kDecodeWarps][kDecodeRows], s_l[kDecodeWarps][kDecodeRows];
  __shared__ float s_rowm[kDecodeRows], s_rowl[kDecodeRows];

  FA_DECODE_STAMP(0);
  const int tidx = threadIdx.x, warp = tidx / 32, lane = tidx & 31;
  const int split = blockIdx.x % dp.num_splits, m_block = blockIdx.x / dp.num_splits;
  const int hk = blockIdx.y / kVSplits, bidb = blockIdx.z;
  const int g = p.h_per_kv, hd = p.head_dim;
  // V-split: this CTA's V / O columns [v_col0, v_col0 + kDV), hd_v of them inside the head dim.
  const int v_col0 = (blockIdx.y % kVSplits) * kDV, hd_v = hd - v_col0;

  int q_start, len_q, k_start, len_k;
  const int* table;
  if (dp.paged) {
    BlockInfo<true> bi(p, bidb);
    q_start = bi.q_start; len_q = bi.len_q; k_start = bi.k_start; len_k = bi.len_k; table = bi.table;
  } else {
    BlockInfo<false> bi(p, bidb);
    q_start = bi.q_start; len_q = bi.len_q; k_start = bi.k_start; len_k = bi.len_k; table = nullptr;
  }
  const int rows_total = len_q * g;
  const int row0 = m_block * kDecodeRows;
  if (row0 >= rows_total) return;  // no rows here (combine reads only rows of real queries)
  if (len_q < p.len_q_min || len_q > p.len_q_max) return;  // the prefill kernel's (mixed batch)
  const int shift = len_k - len_q;
#if FA_DECODE_TIMELINE
  asm volatile("" ::"r"(len_k), "r"(len_q));  // the lengths have arrived before the stamp
#endif
  FA_DECODE_STAMP(1);
  const Window window(p, len_k, shift, bidb);

  // Key tiles any row of this CTA can see, intersected with this split's share of the
  // sequence's kTileN-key tiles.
  const int i_lo = row0 / g, i_hi = (imin(row0 + kDecodeRows, rows_total) - 1) / g;
  int n_lo, n_hi;
  window.template tile_range<kTileN>(i_lo, i_hi, n_lo, n_hi);
  const int n_tiles = ceil_div(len_k, kTileN);
  const int per_split = ceil_div(n_tiles, dp.num_splits);
  const int t_begin = imax(split * per_split, n_lo);
  const int t_end = imin(imin(n_tiles, (split + 1) * per_split), n_hi);
  // Tiles of this warp: t_begin + warp + j * kDecodeWarps, j < n_mine.
  const int n_mine = t_end - t_begin > warp ? ceil_div(t_end - t_begin - warp, kDecodeWarps) : 0;

  const i64 kv_head_off = (i64)hk * p.k_head_stride;
  // Float8 K/V: this kv head's dequantization scales (null: 1), times the conversion's factor.
  float k_scale = 1.f, v_scale = 1.f;
  if constexpr (kFp8) {
    k_scale = (dp.k_scale != nullptr ? dp.k_scale[hk] : 1.f) * Kv::kF16Scale;
    v_scale = (dp.v_scale != nullptr ? dp.v_scale[hk] : 1.f) * Kv::kF16Scale;
  }
  const u32 q_smem = smem_u32(smem);
  const u32 ring = q_smem + Sm::kQBytes + warp * Sm::kWarpBytes;

  // ---- Prologue 1: Q rows (packed) -> smem, zero-filled past the rows / head dim. ----------
  for (int idx = tidx; idx < kDecodeRows * kChunks; idx += kDecodeThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const int pr = row0 + r;
    const bool ok = pr < rows_total && c * 8 < hd;
    const u16* src = p.q;
    if (ok) src = p.q + (i64)(q_start + pr / g) * p.q_row_stride + (i64)(hk * g + pr % g) * p.q_head_stride + c * 8;
    cp_async_16(q_smem + r * Sm::kQRowBytes + c * 16, src, ok);
  }
  cp_async_commit();

  // Key rows in two steps: the key's position and its page id as the table holds it (pos -1:
  // no key; dense: id unused), then its row offset (element offset of head 0 of the key row,
  // or -1 when absent).  Lane l (and l + 16) resolves key t * 16 + (l % 16) of a tile; the
  // others get it by shuffle.  The main loop loads a tile's page ids one iteration before it
  // issues the tile's copies and takes the offset only then: with the offset right after the
  // load, the SASS (sm_90, bf16 D = 128) had LDG table -> ISETP -> BRA before the DEPBAR of
  // the tile being computed, so every paged iteration waited out a table load (an L2 round
  // trip, or DRAM for the first CTA to touch a table line) on top of its tile.  Measured (stop
  // 38, H100, kernel time, GQA 32/8 D = 128 page 16, clean flush; benchmarks/NOTES.md): bf16
  // B = 1 ctx 4096 18.6 -> 18.0 us, B = 16 ctx 16384 374.3 -> 372.4, B = 64 366.6 / 366.2;
  // float8 B = 1 17.7 -> 16.8, B = 64 220.7 -> 217.9.  (Page 16's 2-4% gap to page 256 is
  // not the table: it stayed.)
  const PagedKeys pages(table, dp.paged ? p.page_size : 1, p.k_rows, p.k_page_stride,
                        p.k_row_stride);
  struct KeyRef { int pos, id; };
  auto key_ref = [&](int t) -> KeyRef {
    const int pos = t * kTileN + (lane & (kTileN - 1));
    if (t >= t_end || pos >= len_k) return {-1, 0};
    return {pos, dp.paged ? pages.page_id(pos) : 0};
  };
  auto key_offset = [&](KeyRef k) -> i64 {
    if (k.pos < 0) return -1;
    if (!dp.paged) return (i64)(k_start + k.pos) * p.k_row_stride;
    return pages.row_offset(k.pos, k.id);
  };
  // 16-bit K/V without V-split: this lane's chunk column in every copy step, its first row,
  // and the byte distances it adds to a key row's K address (its column; V's row).
  constexpr int kLaneCols = kChunks < 32 ? kChunks : 32;
  const int lane_col = lane % kLaneCols, lane_row0 = lane / kLaneCols;
  const bool col_ok = lane_col * 8 < hd;
  const char* k_head_bytes = reinterpret_cast<const char*>(p.k + kv_head_off);
  const int lane_col_bytes = lane_col * 16;
  const i64 v_from_k = (reinterpret_cast<const char*>(p.v) - reinterpret_cast<const char*>(p.k)) + lane_col_bytes;
  // Issue the cp.async copies of the warp's j-th tile (key offsets `off`) into ring slot `slot`.
  auto issue = [&](int slot, i64 off) {
    const u32 kdst = ring + slot * Sm::kStageBytes, vdst = kdst + Sm::kRingTileBytes;
    if constexpr (kFp8) {  // float8 rows: 16 elements per chunk, offsets in bytes
      const unsigned char* kb = reinterpret_cast<const unsigned char*>(p.k);
      const unsigned char* vb = reinterpret_cast<const unsigned char*>(p.v);
#pragma unroll
      for (int i = 0; i < kChunks8 / 2; ++i) {
        const int idx = lane + 32 * i, r = idx / kChunks8, c = idx % kChunks8;
        const i64 o = __shfl_sync(0xffffffffu, off, r);
        const bool ok = o >= 0 && c * 16 < hd;  // hd % 16 == 0 (the host's rule): whole chunks
        const i64 e = ok ? o + kv_head_off + c * 16 : 0;
        cp_async_16(kdst + ring_offset<Sm::kRowBytesK>(r, c), kb + e, ok);
        cp_async_16(vdst + ring_offset<Sm::kRowBytesV>(r, c), vb + e, ok);
      }
    } else if constexpr (kVSplits == 1) {
      // The key row's K address, made once by the lane that resolved the key (null: no key),
      // is what the steps shuffle; each lane adds its own column (lane_col: the same in every
      // step, as kChunks divides 32) and, for V, the distance from K to V.  A step is 2 SHFL, a
      // test, a select and two 64-bit adds besides its two cp.async; shuffling element offsets
      // and adding head and column per step took ~36 instructions a tile more (725 -> 689,
      // bf16 D = 128, ptxas 13 sm_90), which MQA decode, bound by instructions per key, pays
      // (H100, stop 42, with the plain logits below: MQA 32/1 B = 64 ctx 4096 71.1 -> 67.0 us).
      static_assert(32 % kChunks == 0, "lean issue: a lane keeps one chunk column");
      const char* row = off >= 0 ? k_head_bytes + 2 * off : nullptr;
#pragma unroll
      for (int i = 0; i < kChunks * kTileN / 32; ++i) {
        const int r = lane_row0 + (32 / kChunks) * i;
        const char* key = reinterpret_cast<const char*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(row), r));
        const bool ok = col_ok && key != nullptr;
        const char* src = ok ? key : k_head_bytes;  // never read when !ok (src-size 0)
        cp_async_16(kdst + ring_offset<Sm::kRowBytesK>(r, lane_col), src + lane_col_bytes, ok);
        cp_async_16(vdst + ring_offset<Sm::kRowBytesV>(r, lane_col), src + v_from_k, ok);
      }
    } else {  // K: whole rows; V: this CTA's kDV columns from v_col0
      // Unrolled by 4, not fully: 32 + 16 unrolled copies (D = 512) held their addresses at
      // once and spilled 16-72 bytes beside O's 128 accumulators (ptxas, sm_80).
#pragma unroll 4
      for (int i = 0; i < kChunks / 2; ++i) {
        const int idx = lane + 32 * i, r = idx / kChunks, c = idx % kChunks;
        const i64 o = __shfl_sync(0xffffffffu, off, r);
        const bool ok = o >= 0 && c * 8 < hd;
        cp_async_16(kdst + ring_offset<Sm::kRowBytesK>(r, c), p.k + (ok ? o + kv_head_off + c * 8 : 0), ok);
      }
#pragma unroll 4
      for (int i = 0; i < kChunksV / 2; ++i) {
        const int idx = lane + 32 * i, r = idx / kChunksV, c = idx % kChunksV;
        const i64 o = __shfl_sync(0xffffffffu, off, r);
        const bool ok = o >= 0 && c * 8 < hd_v;
        const i64 e = ok ? o + kv_head_off + v_col0 + c * 8 : 0;
        cp_async_16(vdst + ring_offset<Sm::kRowBytesV>(r, c), p.v + e, ok);
      }
    }
  };
  auto tile_of = [&](int j) { return t_begin + warp + j * kDecodeWarps; };

  // ---- Prologue 2: the first kStages - 1 tiles of this warp in flight. ---------------------
  // The page ids of the first kStages tiles loaded together (one table round trip, not one per
  // tile: key_offset's present test would wait for each id before the next load; a B = 1
  // step's warps have ~4 tiles each).
  KeyRef first_keys[kStages];
#pragma unroll
  for (int j = 0; j < kStages; ++j) first_keys[j] = key_ref(tile_of(j));  // past n_mine: no key
  // The keys of each tile in flight that have no row to read -- past the sequence, or on an
  // absent page (paged.cuh: masked, never read) -- one bit per key, from the offsets the
  // issue resolved (lane l holds key l % kTileN); the copies zero-fill them, and the mask makes
  // them -inf.  A queue in registers: no_key[0] is the oldest tile in flight.
  unsigned no_key[kStages - 1];
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    const i64 off = key_offset(first_keys[j]);
    if (j < n_mine) issue(j, off);
    cp_async_commit();  // always commit: group counting stays uniform
    no_key[j] = __ballot_sync(0xffffffffu, off < 0) & kKeyBits;
  }
  KeyRef next_key = first_keys[kStages - 1];  // page ids one issue ahead

  // Per-lane rows: A = lane / 4, B = A + 8 (the two rows of an mma accumulator), packed row
  // pr -> query index pr / g, head hk * g + pr % g.  A padding row (pr >= rows_total) sees no
  // key (last key -1).
  const int ra = lane >> 2, tq = lane & 3;
  int qi[2], first[2], last[2];
  float slope[2];
  const LogitTransform<true> xform(p, shift);  // softcap / ALiBi: run-time switches here
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pr = row0 + ra + 8 * h;
    const bool row_ok = pr < rows_total;
    qi[h] = pr / g;
    window.row_keys(qi[h], first[h], last[h]);
    if (!row_ok) last[h] = -1;
    slope[h] = row_ok ? xform.slope(p, bidb, hk * g + pr % g) : 0.f;
  }
  // Plain logits -- no softcap, no ALiBi, a positive finite scale: a CTA-uniform test, the
  // common decode step -- take the prefill kernel's plain path.  16-bit K/V fold the scale into
  // the softmax's exp2 (c: LogitTransform<false>'s log2_scale); float8 K/V into S's row factor
  // (s_factor, below: S is multiplied row by row anyway), with c = log2(e) as for transformed
  // logits.  16-bit K/V also skip the mask on tiles inside [free_lo, free_hi], the keys every
  // row of the CTA sees (all warps hold the same 16 rows: a warp reduction suffices; padding
  // rows, zero queries never written, need no mask).  Float8 K/V mask every tile: the free range cost the float8 D = 128 kernel (128
  // registers for 4 CTAs per SM) 8-16 bytes of spills (ptxas 13, sm_90).  Otherwise every tile
  // pays the scale, the ALiBi term (slope 0) and the mask, ~80 of ~687 instructions executed a
  // 16-key tile (bf16 D = 128): MQA 32/1 B = 64 ctx 4096 page 16 took 71.1 us with them, 68.0
  // without (H100, stop 42; NOTES.md).
  const bool plain = p.softcap <= 0.f && p.alibi_slopes == nullptr &&
                     p.softmax_scale > 0.f && isfinite(p.softmax_scale);
  const float c = plain && !kFp8 ? p.softmax_scale * float(log2e_f64()) : xform.log2_scale;
  int free_lo = 1, free_hi = 0;  // float8: empty (every tile is masked)
  if constexpr (!kFp8) {
    free_lo = 0;
    free_hi = 0x7fffffff;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (row0 + ra + 8 * h < rows_total) {
        free_lo = imax(free_lo, first[h]);
        free_hi = imin(free_hi, last[h]);
      }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) {
      free_lo = imax(free_lo, __shfl_xor_sync(0xffffffffu, free_lo, m));
      free_hi = imin(free_hi, __shfl_xor_sync(0xffffffffu, free_hi, m));
    }
  }

  float o[1][kDV / 8][4];
  zero_fragments(o);
  OnlineSoftmax<1> softmax;
  softmax.init();

  // Q is shared by all warps: wait for its group (the oldest) and publish it.
  cp_async_wait<kStages - 1>();
  __syncthreads();
  // S's factor per accumulator row (ra, ra + 8): the float8 key scale, and for bfloat16 queries
  // the power of two their float16 rows were scaled by.
  float s_factor[2] = {k_scale, k_scale};
  if (kFp8 && plain) s_factor[0] = s_factor[1] = k_scale * p.softmax_scale;
  if constexpr (kFp8 && !Elem::kIsF16) {
    __shared__ float row_factor[kDecodeRows];
    q_bf16_to_f16_rows<kD, Sm::kQRowBytes>(q_smem, row_factor);
    __syncthreads();
    s_factor[0] *= row_factor[ra];
    s_factor[1] *= row_factor[ra + 8];
  }
  if constexpr (kFp8) {
    q_words_for_fp8<kD, Sm::kQRowBytes>(q_smem);
    __syncthreads();
  }
  // This lane's ldmatrix row and chunk half (lr, lhi): 16-bit tiles take matrices (rows 0-7,
  // chunk 2k), (rows 8-15, 2k), (0-7, 2k + 1), (8-15, 2k + 1) from lanes 0-7, 8-15, 16-23,
  // 24-31; float8 K/V (lr8) (keys 0-7, bytes 0-15), (keys 8-15, bytes 0-15), (keys 0-7,
  // 16-31), (keys 8-15, 16-31) of a 32-byte column block.
  const int lr = lane & 15, lhi = lane >> 4, lr8 = (lane & 7) + 8 * ((lane >> 3) & 1);
  const u32 lrow_q = lr * Sm::kQRowBytes + lhi * 16;

  // ---- Main loop over this warp's tiles. ---------------------------------------------------
  for (int j = 0; j < n_mine; ++j) {
    // Refill the slot freed by tile j - 1 with tile j + kStages - 1 (its page ids were loaded
    // one iteration ago), then load the next tile's page ids while tile j computes.
    const i64 next_off = key_offset(next_key);
    if (j + kStages - 1 < n_mine) issue((j + kStages - 1) % kStages, next_off);
    cp_async_commit();
    next_key = key_ref(tile_of(j + kStages));
    const unsigned tile_no_key = no_key[0];  // tile j's
#pragma unroll
    for (int i = 0; i + 1 < kStages - 1; ++i) no_key[i] = no_key[i + 1];
    no_key[kStages - 2] = __ballot_sync(0xffffffffu, next_off < 0) & kKeyBits;
    cp_async_wait<kStages - 1>();  // tile j has landed (this lane's copies) ...
    __syncwarp();                  // ... and every lane's copies are visible to the warp
#if FA_DECODE_TIMELINE
    if (j == 0) FA_DECODE_STAMP(2);
#endif
    const u32 ks = ring + (j % kStages) * Sm::kStageBytes, vs = ks + Sm::kRingTileBytes;
    const int t = tile_of(j);

    // S = Q K^T (16 rows x kTileN keys: n-tile n keys 8n .. 8n + 7); k-steps past the head dim
    // are skipped (uniform branch).
    float s[1][kNT][4];
    zero_fragments(s);
    if constexpr (kFp8) {
      // Two k-steps per ldmatrix: kb[0] / kb[1] keys 0-7 / 8-15 of k-step 2 kk2, kb[2] / kb[3]
      // of k-step 2 kk2 + 1; each register's bytes 0-1 / 2-3 are the B fragment's halves.
#pragma unroll
      for (int kk2 = 0; kk2 < kD / 32; ++kk2) {
        if (kk2 * 32 < hd) {
          u32 kb[4];
          ldmatrix_x4(kb, ks + ring_offset<Sm::kRowBytesK>(lr8, 2 * kk2 + lhi));
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int kk = 2 * kk2 + half;
            if (kk * 16 < hd) {
              u32 qa[4];
              ldmatrix_x4(qa, q_smem + lrow_q + kk * 32);
              const u32 k0 = kb[2 * half], k1 = kb[2 * half + 1];
              Mma::mma(s[0][0], qa, Kv::template to_f16x2<0>(k0), Kv::template to_f16x2<1>(k0));
              Mma::mma(s[0][1], qa, Kv::template to_f16x2<0>(k1), Kv::template to_f16x2<1>(k1));
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        if (kk * 16 < hd) {
          u32 qa[4];
          ldmatrix_x4(qa, q_smem + lrow_q + kk * 32);
#pragma unroll
          for (int k16 = 0; k16 < kTileN / 16; ++k16) {  // keys 16 k16 .. 16 k16 + 15
            u32 kb[4];
            ldmatrix_x4(kb, ks + ring_offset<Sm::kRowBytesK>(16 * k16 + lr, 2 * kk + lhi));
            Mma::mma(s[0][2 * k16], qa, kb[0], kb[2]);      // keys 0-7 of the 16
            Mma::mma(s[0][2 * k16 + 1], qa, kb[1], kb[3]);  // keys 8-15
          }
        }
      }
    }
    if constexpr (kFp8) {  // Q (K8 k_scale)^T, row by row (s_factor)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[0][n][e] *= s_factor[e >> 1];
    }

    // The logit variant and the mask, each row at its own query index, then online softmax.
    const int col0 = t * kTileN + 2 * tq;
    if (!plain)
      xform.apply(s, [&](int, int h) { return qi[h]; }, [&](int, int h) { return slope[h]; }, col0);
    // The mask (window and sequence end), skipped on a plain tile inside every row's keys;
    // then, in a tile with a key that has no row (the sequence's last tile, or an absent
    // page: rare), those keys' columns.  Warp-uniform branches.  (The key bits folded into
    // mask_fragment's own test instead cost the default build ~30 instructions a tile.)
    const int key0 = t * kTileN;
    if (!plain || key0 < free_lo || key0 + kTileN - 1 > free_hi)
      mask_fragment(s, [&](int, int h, int& lo, int& hi) { lo = first[h]; hi = last[h]; }, col0, 0u);
    if (tile_no_key != 0u) {
      // mask.cuh's absent-key bits (2 nt + e: this lane's keys 8 nt + 2 tq + e), every row's
      // range unbounded: only those columns change.
      // (n-tiles 0 and 1 written out: as one loop from 0 the 16-key kernels compiled to other
      // machine code than the device-tested build.)
      unsigned bits = ((tile_no_key >> (2 * tq)) & 3u) | (((tile_no_key >> (8 + 2 * tq)) & 3u) << 2);
#pragma unroll
      for (int nt = 2; nt < kNT; ++nt) bits |= ((tile_no_key >> (8 * nt + 2 * tq)) & 3u) << (2 * nt);
      mask_fragment(s, [](int, int, int& lo, int& hi) { lo = 0; hi = 0x7fffffff; }, col0, bits);
    }
    softmax.update(s, o, c);  // s now holds P

    // O += P V: the S accumulators of keys 0-7 / 8-15 of each 16 keys k16 are the A fragment
    // of P (16 x 16) for that k-step.
    u32 pa[kTileN / 16][4];
#pragma unroll
    for (int k16 = 0; k16 < kTileN / 16; ++k16)
      pack_p_fragment<Mma>(pa[k16], s[0][2 * k16], s[0][2 * k16 + 1]);
    if constexpr (kFp8) {
      // vb[0] / vb[1]: keys 0-7 / 8-15 of columns 32 dd2 .. + 15; vb[2] / vb[3] of the next 16.
#pragma unroll
      for (int dd2 = 0; dd2 < kDV / 32; ++dd2) {
        if (dd2 * 32 < hd_v) {
          u32 vb[4];
          ldmatrix_x4_trans(vb, vs + ring_offset<Sm::kRowBytesV>(lr8, 2 * dd2 + lhi));
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int b = 2 * dd2 + half;  // 16-column block
            if (b * 16 < hd_v) {
              const u32 lo = pair_keys_per_column(vb[2 * half]);
              const u32 hi = pair_keys_per_column(vb[2 * half + 1]);
              Mma::mma(o[0][2 * b], pa[0], Kv::template to_f16x2<0>(lo), Kv::template to_f16x2<0>(hi));
              Mma::mma(o[0][2 * b + 1], pa[0], Kv::template to_f16x2<1>(lo), Kv::template to_f16x2<1>(hi));
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int dd = 0; dd < kDV / 16; ++dd) {
        if (dd * 16 < hd_v) {
#pragma unroll
          for (int k16 = 0; k16 < kTileN / 16; ++k16) {
            u32 vb[4];
            ldmatrix_x4_trans(vb, vs + ring_offset<Sm::kRowBytesV>(16 * k16 + lr, 2 * dd + lhi));
            Mma::mma(o[0][2 * dd], pa[k16], vb[0], vb[1]);
            Mma::mma(o[0][2 * dd + 1], pa[k16], vb[2], vb[3]);
          }
        }
      }
    }
    __syncwarp();  // every lane is done reading this slot before it is refilled
  }

  FA_DECODE_STAMP(3);
  // ---- Epilogue: merge the 4 warps' states through shared memory. -------------------------
  cp_async_wait<0>();
  __syncthreads();  // the rings are reused as the merge buffer
  float* merge = reinterpret_cast<float*>(smem + Sm::kQBytes);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l_warp = softmax.row_total(0, h);
    if (tq == 0) {
      s_m[warp][ra + 8 * h] = softmax.row_max[0][h];
      s_l[warp][ra + 8 * h] = l_warp;
    }
  }
  __syncthreads();
  float row_m[2], row_l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = ra + 8 * h;
    float mm = neg_inf();
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mm = fmaxf(mm, s_m[w][r]);
    const float shift_r = row_shift(mm, c);
    float ll = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) ll += s_l[w][r] * part_weight(s_m[w][r], c, shift_r);
    row_m[h] = mm;
    row_l[h] = ll;
    const float f = part_weight(softmax.row_max[0][h], c, shift_r);  // this warp's weight
    if constexpr (kFp8) {  // O's columns back in order (fp8_direct_column)
      float* dst = merge + ((warp * kDecodeRows) + r) * Sm::kMergeRow;
#pragma unroll
      for (int n = 0; n < kDV / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) dst[fp8_direct_column(n, tq, e)] = o[0][n][2 * h + e] * f;
    } else {
      float* dst = merge + ((warp * kDecodeRows) + r) * Sm::kMergeRow + 2 * tq;
#pragma unroll
      for (int n = 0; n < kDV / 8; ++n) {
        dst[n * 8] = o[0][n][2 * h] * f;
        dst[n * 8 + 1] = o[0][n][2 * h + 1] * f;
      }
    }
  }
  if (warp == 0 && tq == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s_rowm[ra + 8 * h] = row_m[h];
      s_rowl[ra + 8 * h] = row_l[h];
    }
  }
  __syncthreads();

  // Sum the scaled warp partials, normalize, store (4 columns per thread per step).
  constexpr int kC4 = kDV / 4;
  const bool split_mode = dp.num_splits > 1;
  for (int idx = tidx; idx < kDecodeRows * kC4; idx += kDecodeThreads) {
    const int r = idx / kC4, d = (idx % kC4) * 4;
    const int pr = row0 + r;
    if (pr >= rows_total || d >= hd_v) continue;
    const int qrow = q_start + pr / g, head = hk * g + pr % g;
    const float mm = s_rowm[r], ll = s_rowl[r];
    // ll == 0 iff the row saw no key (the max element contributes exp2(0) = 1); ll is NaN
    // when a score was NaN: inv, O and the lse are NaN then (NaN == 0 is false).
    // An empty row's out is set to 0, not multiplied by 0: a NaN in the V row of a key masked
    // for it (same tile) reached acc as P V's 0 * NaN.
    // The attention sink joins here when this CTA sees the whole sequence; split partials leave
    // it out and the combine kernel adds it once (softmax.cuh fold_sink).
    const bool empty = ll == 0.f;
    const SinkFold fold = fold_sink(mm, ll, c, split_mode ? neg_inf() : sink_log2(p.sinks, head),
                                    split_mode ? neg_inf() : pos_inf());
    const float inv = empty ? 0.f : fold.o_scale * v_scale;  // v_scale: float8 V (else 1)
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float* src = merge + (w * kDecodeRows + r) * Sm::kMergeRow + d;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += src[e];
    }
    const float lse = fold.lse;
    if (empty) acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    if (split_mode) {
      // An empty split's O is stored too, as zeros: its lse -inf already gives it weight 0, but
      // the merge loads every split's O before it knows the weights (merge_split_partials), and
      // a never-written O was a read of uninitialized memory (compute-sanitizer initcheck, stop
      // 42: 3790 reports on the sanitize cases).
      float* dst = dp.oaccum + (((i64)split * p.total_q + qrow) * p.num_heads + head) * hd + v_col0 + d;
      asm volatile("st.global.v4.f32 [%0], {%1,%2,%3,%4};" ::"l"(dst), "f"(acc[0] * inv),
                   "f"(acc[1] * inv), "f"(acc[2] * inv), "f"(acc[3] * inv) : "memory");
      if (d == 0 && v_col0 == 0) dp.lse_accum[((i64)split * p.num_heads + head) * p.total_q + qrow] = lse;
    } else {
      u16* dst = p.o + (i64)qrow * p.o_row_stride + (i64)head * p.o_head_stride + v_col0 + d;
      const u32 lo2 = Elem::pack(acc[0] * inv, acc[1] * inv), hi2 = Elem::pack(acc[2] * inv, acc[3] * inv);
      asm volatile("st.global.v2.b32 [%0], {%1,%2};" ::"l"(dst), "r"(lo2), "r"(hi2) : "memory");
      if (d == 0 && v_col0 == 0) p.lse[(i64)head * p.lse_head_stride + qrow] = lse;
    }
  }
  FA_DECODE_STAMP(4);
#if FA_DECODE_FUSED_COMBINE
  if constexpr (kVSplits == 1) {
    if (split_mode && dp.split_counters != nullptr) {
      // The last of the tile's num_splits CTAs to get here merges their partials (the
      // threadFenceReduction pattern): each CTA makes its partial stores visible device-wide,
      // then counts itself in; the one that counts last sees every other CTA's partials (read
      // from L2: merge_split_partials) and resets the counter for the next launch (graph replays).
      __shared__ int s_last;
      // Release: each thread's partial stores, then the CTA barrier, then thread 0's count
      // (fence.acq_rel, not __threadfence's fence.sc: no total order is needed here; with
      // fence.sc on both sides B = 1 ctx 32768 took 60.2 us, with these 58.6 -- H100, stop 42,
      // with the lean issue and plain logits).
      fence_acq_rel_gpu();
      __syncthreads();
      if (tidx == 0) {
        int* counter = dp.split_counters + ((i64)bidb * gridDim.y + blockIdx.y) * dp.m_blocks + m_block;
        const int arrived = atomicAdd(counter, 1);
        s_last = arrived == dp.num_splits - 1;
        if (s_last) *counter = 0;
        if (s_last) fence_acq_rel_gpu();  // acquire: the count that said "last", then the barrier
      }
      __syncthreads();
      FA_DECODE_STAMP(5);
      if (s_last) {
        CombineParams cp;  // the fields merge_split_partials reads
        cp.o_in = dp.oaccum;
        cp.lse_in = dp.lse_accum;
        cp.sinks = p.sinks;
        cp.o_out = p.o;
        cp.lse_out = p.lse;
        cp.o_split_stride = (i64)p.total_q * p.num_heads * hd;  // the partials' layout above
        cp.o_row_stride = (i64)p.num_heads * hd;
        cp.o_head_stride = hd;
        cp.lse_split_stride = (i64)p.num_heads * p.total_q;
        cp.lse_head_stride = p.total_q;
        cp.out_row_stride = p.o_row_stride;
        cp.out_head_stride = p.o_head_stride;
        cp.lse_out_head_stride = p.lse_head_stride;
        cp.head_dim = hd;
        cp.num_splits = dp.num_splits;
        // This tile's packed rows, one (query, head) pair per warp.
        for (int r = warp; r < kDecodeRows && row0 + r < rows_total; r += kDecodeWarps) {
          const int pr = row0 + r;
          merge_split_partials<Elem, kMergeLoads>(cp, q_start + pr / g, hk * g + pr % g, lane);
        }
        FA_DECODE_STAMP(6);
      }
    }
  }
#endif
  FA_DECODE_STAMP(7);
}

}  // namespace fa
