// params.cuh -- the kernel-side twin of cupy_flashattn/problem.py::AttentionProblem.
// Filled field by field by the extern "C" entry points that _cuda/compile.py generates from
// compile.PARAMS (one packed argument struct per launch, see _cuda/packing.py); the field
// order there is the order here.
#pragma once
#include "../common.cuh"

namespace fa {

struct FwdParams {
  // q, out: (total_q, H, D) rows; k, v: dense (k_rows, Hk, D) or paged (num_pages, P, Hk, D).
  // All 16-bit elements (f16 or bf16, raw bits); last dim contiguous, rows 16-byte aligned.
  const u16* q;
  const u16* k;
  const u16* v;
  u16* o;
  float* lse;  // float32 (H, total_q): lse[h * lse_head_stride + q_start + i], natural log

  const int* cu_seqlens_q;     // (B+1,) or null
  const int* cu_seqlens_k;     // (B+1,) or null
  const int* seqused_k;        // (B,) or null
  const int* cache_batch_idx;  // (B,) or null
  const int* leftpad_k;        // (B,) or null
  const int* block_table;      // (B, max_blocks_per_seq) or null (dense)
  const float* alibi_slopes;   // (B, H) float32 or null
  const float* sinks;          // (H,) float32 attention-sink logits or null (softmax.cuh)
  // (B, prefix_ranges_count, 2) int32 [start, end) key ranges (candle's mm_prefix_ranges) or
  // null; window.cuh's PrefixRanges reads them.
  const int* prefix_ranges;

  // Strides in elements.  k and v share one set (launch.py makes them agree).
  i64 q_row_stride, q_head_stride;
  i64 k_row_stride, k_head_stride, k_page_stride;
  i64 o_row_stride, o_head_stride;
  i64 lse_head_stride;
  int alibi_batch_stride, alibi_head_stride;
  int table_batch_stride;
  int prefix_ranges_count, prefix_ranges_batch_stride;  // ranges per sequence; 2 * that

  int batch;
  int seqlen_q, seqlen_k;  // dense Sq / Sk (ignored with cu_seqlens_*)
  int total_q;             // rows of q
  int k_rows;              // dense: rows of k; paged: num_pages (page ids must be < this)
  int num_heads;
  int h_per_kv;            // H / Hk: query head h reads kv head h / h_per_kv
  int head_dim;            // actual D (a multiple of 8, <= the bucket)
  int page_size;           // P (paged only)
  int max_blocks_per_seq;  // columns of block_table
  int window_left, window_right;  // -1 = unlimited; clamped to <= 2^30 by the launcher
  float softmax_scale;
  float softcap;  // > 0 only in Has_softcap kernels
  // Mixed batches: this launch serves only sequences with len_q_min <= len_q <= len_q_max (the
  // others belong to the other kernel of the same call: decode for few query rows, prefill for
  // many).  0 and INT_MAX serve every sequence.
  int len_q_min, len_q_max;
  // Added to every seqused_k[b]: flash_attn_with_kvcache passes the cache lengths before its
  // append and the number of appended tokens here, so no device op computes lengths + S_new.
  int seqused_k_add;
  // Query tiles per (sequence, head): ceil(max_seqlen_q / kBlockM).  The sm90 family's
  // persistent CTAs walk tiles i = m + tiles_m (h + H b) with it (sm90/flash_fwd.cu); the
  // sm80 family's grid is the tiles themselves and ignores it.
  int tiles_m;
};

}  // namespace fa
