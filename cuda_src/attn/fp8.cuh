// attn/fp8.cuh -- float8 K/V elements (vLLM's FP8 KV cache; cupy_flashattn/fp8.py on the host):
// the formats, their exact conversion to float16 for the tensor cores, and the float32 -> float8
// quantization of the append.
//
// A cache element is x8 = fp8(x / scale); the kernels read float(x8) and apply the scale
// outside the element loop (keys: S *= k_scale; values: O *= v_scale), so a conversion is
// exact and may carry a power-of-two factor of its own, folded into the scale (kF16Scale).
//
// The read conversion makes float16, two elements per 32-bit word (the 16-bit halves hold
// elements 2i, 2i + 1, as an mma fragment pair does), in as few instructions as possible: the
// decode kernel converts every element it reads, and its issue slots are what float8 decode
// runs out of (stop 32, H100, B = 64 ctx 4096: 4 instructions per pair -- cvt to f16x2, two
// f16 -> f32, a bf16x2 pack -- ran at 289 us; 6 integer ops per pair at 343 us; float16 math
// lets one instruction per pair do it).
//   - e5m2 (1 sign, 5 exponent, 2 mantissa bits, bias 15) IS a float16's top byte: one PRMT
//     moving each byte to the top of its half gives x itself, infinities and NaNs included.
//   - e4m3fn on sm_89+: cvt.rn.f16x2.e4m3x2, x itself (kF16Scale 1).  On sm_80 (no float8
//     instructions): after the PRMT, the 7 magnitude bits shifted right by one under the sign
//     make the float16 of x * 2^-8, normal and subnormal alike (bias 15 = 7 + 8), exact
//     (kF16Scale 256); the NaN code S.1111.111 came out as 480 * 2^-8 and is restored.
#pragma once
#include "../common.cuh"

namespace fa {

// Bytes 2h, 2h + 1 of `w`, each moved to the top byte of a 16-bit half: (b0 << 8) | (b1 << 24)
// for kHalf 0, (b2 << 8) | (b3 << 24) for kHalf 1 (one PRMT either way).
template <int kHalf>
__device__ __forceinline__ u32 spread_bytes(u32 w) {
  u32 r;
  if constexpr (kHalf == 0) asm("prmt.b32 %0, %1, 0, 0x1404;" : "=r"(r) : "r"(w));
  else asm("prmt.b32 %0, %1, 0, 0x3424;" : "=r"(r) : "r"(w));
  return r;
}

// K/V element formats of the decode kernel (its Kv template parameter).  to_f16x2<h>: the
// float16 pair of bytes 2h, 2h + 1 of a word, times 2^-log2(kF16Scale), exact; kF16Scale
// multiplies the dequantization scale.  Taking the half by template (not by a shift of the
// word) lets the conversion select it for free: a shift per pair was ~1 in 8 instructions of
// the float8 tile loop.
struct KvSame {  // K/V in the query's 16-bit type: no conversion
  static constexpr int kBytes = 2;
};
struct KvE4M3 {  // ml_dtypes.float8_e4m3fn
  static constexpr int kBytes = 1;
#if __CUDA_ARCH__ >= 890
  static constexpr float kF16Scale = 1.f;
  template <int kHalf>
  __device__ __forceinline__ static u32 to_f16x2(u32 w) {
    u32 r;
    if constexpr (kHalf == 0)
      asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(r) : "r"(w));
    else
      asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(r) : "r"(w));
    return r;
  }
#else
  static constexpr float kF16Scale = 256.f;
  template <int kHalf>
  __device__ __forceinline__ static u32 to_f16x2(u32 w) {
    const u32 t = spread_bytes<kHalf>(w);
    const u32 mag = t & 0x7f007f00u;                // each half's 7 magnitude bits, at 8..14
    const u32 h = (t & 0x80008000u) | (mag >> 1);   // float16 of x * 2^-8 per half
    // NaN (magnitude 0x7f) came out as 480 * 2^-8 = 0x3f80: +0x0100 carries into bit 15 of
    // exactly those halves, and that bit shifted to 14 completes a float16 NaN (0x7f80).
    const u32 nan = (mag + 0x01000100u) & 0x80008000u;
    return h | (nan >> 1);
  }
#endif
};
struct KvE5M2 {  // ml_dtypes.float8_e5m2
  static constexpr int kBytes = 1;
  static constexpr float kF16Scale = 1.f;
  template <int kHalf>
  __device__ __forceinline__ static u32 to_f16x2(u32 w) { return spread_bytes<kHalf>(w); }
};

// float32 -> float8 byte, for the append's quantization (kv_cache.cu; the host's
// fp8.quantize, bit for bit): round to nearest even, saturating at the largest finite value
// (kMaxCode; +-inf included), NaN -> NaN (0x7f with the sign: e4m3fn's NaN, an e5m2 NaN).
// Integer code on every architecture: the append is memory-bound, and one path is one thing to
// verify.  kMant mantissa bits, exponent bias kBias:
//   - below the smallest normal 2^(1 - kBias), the float8 values are the multiples of
//     2^(1 - kBias - kMant): scale by its inverse (exact, a power of two), round to an integer
//     (RNE) -- that integer is the code, and 2^kMant lands on the smallest normal's code;
//   - otherwise drop the float32's low 23 - kMant mantissa bits with RNE (add half - 1 plus the
//     kept lsb; a carry moves into the exponent, as it should) and rebias the exponent.
template <int kMant, int kBias, u32 kMaxCode>
__device__ __forceinline__ u32 f32_to_fp8_bits(float f) {
  const u32 bits = __float_as_uint(f);
  const u32 sign = (bits >> 24) & 0x80u;
  const u32 a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;  // NaN
  u32 code;
  if (a < ((128u - kBias) << 23)) {  // |f| < 2^(1 - kBias): subnormal float8
    const float steps = __uint_as_float(a) * __uint_as_float((126u + kBias + kMant) << 23);
    code = (u32)__float2int_rn(steps);
  } else {
    const u32 r = a + ((1u << (22 - kMant)) - 1u) + ((a >> (23 - kMant)) & 1u);
    code = (r >> (23 - kMant)) - ((127u - kBias) << kMant);
  }
  return sign | (code < kMaxCode ? code : kMaxCode);
}
// e4m3fn: 3 mantissa bits, bias 7, largest 448 = S.1111.110; e5m2: 2 bits, bias 15, largest
// 57344 = S.11110.11.
__device__ __forceinline__ u32 f32_to_e4m3(float f) { return f32_to_fp8_bits<3, 7, 0x7eu>(f); }
__device__ __forceinline__ u32 f32_to_e5m2(float f) { return f32_to_fp8_bits<2, 15, 0x7bu>(f); }

}  // namespace fa
