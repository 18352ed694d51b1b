// kv_cache.cu -- what flash_attn_with_kvcache does to the new tokens before attending:
// rotary embedding (q and the new k) and appending the new k / v into a contiguous or paged
// cache, in one pass over the new rows (vLLM's reshape_and_cache with the rotation fused in).
//
// One thread per element of a (token, head) row; blockDim (32, 4): x walks the head dim, y picks
// rows.  blockIdx.y selects the job: 0 = src/dst (rotated when rot_half > 0), 1 = src2/dst2
// (copied bit-exactly, the values of an append).  Everything is resolved on the device, no host
// sync: a destination outside the cache (position past the capacity, negative length, batch
// row or page id outside the pool) is DROPPED, never written; a position without a row in the
// rotary tables rotates by angle 0.
//
// Rounding matches cupy_flashattn.rotary.apply_rotary's NumPy path bit for bit: float32 products
// and one float32 add/subtract, explicitly not fused (__fmul_rn/__fadd_rn), then one
// round-to-nearest-even to the storage type.
//
// A float8 cache (dst_type 4 / 5, vLLM's FP8 KV cache) stores fp8(clip(x / scale[h])) of each
// new element x -- the rotated k after its rounding to the source type, as the NumPy path
// rotates then quantizes (cupy_flashattn.fp8.quantize: an IEEE float32 division, saturation,
// round to nearest even; attn/fp8.cuh f32_to_e4m3 / f32_to_e5m2), bit for bit.
#include "common.cuh"
#include "attn/fp8.cuh"
#include "attn/paged.cuh"

namespace fa {

struct RopeAppendParams {
  const void* src;   // (B, S, H, D) with strides src_b, src_s, src_h (elements); last dim contiguous
  void* dst;
  const void* src2;  // job 1 (may be null): same geometry, plain copy
  void* dst2;
  i64 src_b, src_s, src_h;
  i64 src2_b, src2_s, src2_h;
  // Destination: mode 0 dense (B, S, H, D) strides dst_b/s/h, token (b, s) -> [b][s];
  // mode 1 contiguous cache: row = batch_idx ? batch_idx[b] : b, pos = seqlens[b] + s, [row][pos];
  // mode 2 paged cache: pos = seqlens[b] + s, [table[b][pos / page]][pos % page].
  // dst_b is the batch-row (mode 1) or page (mode 2) stride; job 1 uses the same strides.
  i64 dst_b, dst_s, dst_h;
  const int* seqlens;    // (B,) mode 1/2 and seqlens-based rotary positions
  const int* batch_idx;  // (B,) or null (mode 1)
  const int* table;      // (B, width) (mode 2)
  int table_stride, table_width, page_size;
  int dst_rows;          // mode 1: batch rows of the cache; mode 2: pages in the pool
  int dst_capacity;      // mode 1: positions per cache row
  int mode;
  // Rotary (rot_half = rotary_dim / 2; 0 = no rotation).
  const void* cos;
  const void* sin;
  i64 cos_row_stride, sin_row_stride;
  int cs_type;           // 0 f32, 1 f16, 2 bf16, 3 f64
  int seqlen_ro, rot_half, interleaved;
  const int* positions;  // (B, S) with strides pos_b, pos_s, or null: seqlens[b] + (per_token ? s : 0)
  i64 pos_b, pos_s;
  int pos_per_token;
  int batch, seqlen, heads, head_dim;
  int elem_type;         // 0 f32, 1 f16, 2 bf16 (data)
  int dst_type;          // 0: elem_type; 4: float8 e4m3fn, 5: float8 e5m2 (quantized, one byte)
  const float* dst_scale;   // (heads,) float8 scales of job 0's dst (keys) ...
  const float* dst2_scale;  // ... and of job 1's (values)
};

__device__ __forceinline__ void copy_elem(const void* s, i64 si, void* d, i64 di, int type) {
  if (type == 0) static_cast<u32*>(d)[di] = static_cast<const u32*>(s)[si];
  else static_cast<u16*>(d)[di] = static_cast<const u16*>(s)[si];
}

// Element d of the rotated row at soff (d < rotary_dim), in float32 before its rounding.
__device__ __forceinline__ float rotated(const RopeAppendParams& p, const void* src, i64 soff,
                                         int d, int rpos) {
  int pair, partner;
  bool first;
  if (p.interleaved) {
    pair = d >> 1; first = (d & 1) == 0; partner = d ^ 1;
  } else {
    first = d < p.rot_half; pair = first ? d : d - p.rot_half; partner = first ? d + p.rot_half : pair;
  }
  const float c = load_elem(p.cos, rpos * p.cos_row_stride + pair, p.cs_type);
  const float sn = load_elem(p.sin, rpos * p.sin_row_stride + pair, p.cs_type);
  const float x = load_elem(src, soff + d, p.elem_type);
  const float y = load_elem(src, soff + partner, p.elem_type);
  // first: x1 * c - x2 * s (x1 = x, x2 = y); second: x2 * c + x1 * s (x2 = x, x1 = y).
  return first ? __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, sn))
               : __fadd_rn(__fmul_rn(x, c), __fmul_rn(y, sn));
}

// v rounded to the storage type `type` and back (what store_elem then load_elem would give).
__device__ __forceinline__ float round_to(float v, int type) {
  if (type == 0) return v;
  u16 b;
  if (type == 2) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));
    return __uint_as_float((u32)b << 16);
  }
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v));
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
  return f;
}

__device__ void rope_append(const RopeAppendParams& p) {
  const i64 row = (i64)blockIdx.x * blockDim.y + threadIdx.y;
  const int job = blockIdx.y;
  if (row >= (i64)p.batch * p.seqlen * p.heads) return;
  const int h = (int)(row % p.heads);
  const int s = (int)((row / p.heads) % p.seqlen);
  const int b = (int)(row / ((i64)p.heads * p.seqlen));
  const void* src = job == 0 ? p.src : p.src2;
  void* dst = job == 0 ? p.dst : p.dst2;
  if (src == nullptr) return;
  const i64 soff = job == 0 ? b * p.src_b + s * p.src_s + h * p.src_h
                            : b * p.src2_b + s * p.src2_s + h * p.src2_h;

  // Destination row offset, or drop.
  i64 doff;
  if (p.mode == 0) {
    doff = b * p.dst_b + s * p.dst_s + h * p.dst_h;
  } else {
    const i64 pos = (i64)p.seqlens[b] + s;
    if (pos < 0) return;
    if (p.mode == 1) {
      const int r = p.batch_idx != nullptr ? p.batch_idx[b] : b;
      if ((unsigned)r >= (unsigned)p.dst_rows || pos >= p.dst_capacity) return;
      doff = r * p.dst_b + pos * p.dst_s + h * p.dst_h;
    } else {
      if (pos >= (i64)p.table_width * p.page_size) return;  // past the block table
      const PagedKeys pages(p.table + (i64)b * p.table_stride, p.page_size, p.dst_rows, p.dst_b,
                            p.dst_s);
      const i64 row_off = pages.row_offset((int)pos);  // pos < 2^31 here
      if (row_off < 0) return;                           // absent page
      doff = row_off + h * p.dst_h;
    }
  }

  // Rotary position of this token (job 0 only).
  int rpos = -1;
  if (job == 0 && p.rot_half > 0) {
    i64 pos = p.positions != nullptr ? (i64)p.positions[b * p.pos_b + s * p.pos_s]
                                     : (i64)p.seqlens[b] + (p.pos_per_token ? s : 0);
    rpos = (pos >= 0 && pos < p.seqlen_ro) ? (int)pos : -1;
  }
  const int rot_dim = 2 * p.rot_half;
  if (p.dst_type != 0) {  // float8 cache: quantize (a separate loop keeps the 16-bit one as is)
    const float scale = (job == 0 ? p.dst_scale : p.dst2_scale)[h];
    for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
      const float x = rpos < 0 || d >= rot_dim
                          ? load_elem(src, soff + d, p.elem_type)
                          : round_to(rotated(p, src, soff, d, rpos), p.elem_type);
      const float y = __fdiv_rn(x, scale);
      const u32 x8 = p.dst_type == 4 ? f32_to_e4m3(y) : f32_to_e5m2(y);
      static_cast<unsigned char*>(dst)[doff + d] = (unsigned char)x8;
    }
    return;
  }
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    if (rpos < 0 || d >= rot_dim) copy_elem(src, soff + d, dst, doff + d, p.elem_type);
    else store_elem(dst, doff + d, p.elem_type, rotated(p, src, soff, d, rpos));
  }
}

}  // namespace fa
