// block_info.cuh -- where one sequence's rows live, resolved ONCE per CTA.
//
// Mirrors cupy_flashattn/problem.py::resolve_sequence exactly, including its clamps, so that
// metadata validation could not check without a host sync (cu_seqlens beyond total_q,
// seqused_k beyond capacity, bad cache_batch_idx / leftpad_k) never leads to an out-of-bounds
// access.  After construction the main loop never reads cu_seqlens_* / seqused_k / leftpad_k /
// cache_batch_idx again; the only per-tile metadata read is the block table (paged caches).
#pragma once
#include "params.cuh"
#include "paged.cuh"

namespace fa {

// Sequence b's block-table row (paged caches).
__device__ __forceinline__ const int* table_row(const FwdParams& p, int b) {
  return p.block_table + (i64)b * p.table_batch_stride;
}

template <bool Is_paged>
struct BlockInfo {
  int q_start;  // first row of this sequence in q / out / lse
  int len_q;
  int k_start;  // first row in the flat (k_rows, Hk, D) view (0 for paged caches)
  int len_k;
  const int* table;  // this sequence's block-table row (paged only)

  __device__ BlockInfo(const FwdParams& p, int b) {
    // Queries.
    i64 qs, lq;
    if (p.cu_seqlens_q != nullptr) {
      qs = p.cu_seqlens_q[b];
      lq = (i64)p.cu_seqlens_q[b + 1] - qs;
    } else {
      qs = (i64)b * p.seqlen_q;
      lq = p.seqlen_q;
    }
    qs = lmin(lmax(qs, 0), p.total_q);
    lq = lmin(lmax(lq, 0), p.total_q - qs);
    q_start = (int)qs;
    len_q = (int)lq;

    // Keys.
    i64 ks, lk;
    if (p.cu_seqlens_k != nullptr) {
      ks = p.cu_seqlens_k[b];
      lk = (i64)p.cu_seqlens_k[b + 1] - ks;
    } else {
      ks = (i64)(p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b) * p.seqlen_k;
      lk = p.seqlen_k;
    }
    if (p.seqused_k != nullptr) lk = (i64)p.seqused_k[b] + p.seqused_k_add;
    if (p.leftpad_k != nullptr) {
      ks += p.leftpad_k[b];
      lk -= p.leftpad_k[b];
    }
    i64 capacity;
    if (Is_paged) {
      ks = 0;
      capacity = (i64)p.max_blocks_per_seq * p.page_size;
      table = table_row(p, b);
    } else {
      ks = lmin(lmax(ks, 0), p.k_rows);
      capacity = p.k_rows - ks;
      table = nullptr;
    }
    lk = lmin(lmax(lk, 0), capacity);
    k_start = (int)ks;
    len_k = (int)lk;
  }
};

// The resolved geometry, kept in shared memory for the whole CTA.  The main loop re-reads it
// after each barrier instead of pinning ~10 loop-invariant registers (pointers, lengths) that
// the D = 128 kernel cannot spare next to its 192 accumulator registers.
struct SeqInfo {
  int q_start, len_q, k_start, len_k;
  i64 kv_head_off;   // element offset of kv head h / h_per_kv in k / v
  const int* table;  // block-table row of this sequence (paged)
  PageDiv page;      // position -> page index (paged)

  // Sequence b's geometry for query head h (one thread fills the shared copy).
  template <bool Is_paged>
  __device__ void resolve(const FwdParams& p, int b, int h) {
    const BlockInfo<Is_paged> info(p, b);
    const u32 lens[4] = {(u32)info.q_start, (u32)info.len_q, (u32)info.k_start, (u32)info.len_k};
    resolve_from<Is_paged>(p, b, h, lens);
  }
  // The same from q_start, len_q, k_start, len_k that BlockInfo computed elsewhere (the sm90
  // dynamic tile schedule posts them in shared memory: sm90/tile_scheduler.cuh); no global read.
  template <bool Is_paged>
  __device__ __forceinline__ void resolve_from(const FwdParams& p, int b, int h, const u32 (&lens)[4]) {
    q_start = (int)lens[0];
    len_q = (int)lens[1];
    k_start = (int)lens[2];
    len_k = (int)lens[3];
    kv_head_off = (i64)(h / p.h_per_kv) * p.k_head_stride;  // GQA/MQA: no K/V copies
    table = Is_paged ? table_row(p, b) : nullptr;
    if (Is_paged) page = PageDiv::make(p.page_size);
  }
};

}  // namespace fa
