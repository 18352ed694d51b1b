// attn/fp8.cuh -- float8 K/V elements (vLLM's FP8 KV cache; cupy_flashattn/fp8.py on the host):
// the formats and their exact conversion to the query's 16-bit type.
//
// A cache element is x8 = fp8(x / scale); the kernels read float(x8) and apply the scale
// outside the element loop (keys: S *= k_scale; values: O *= v_scale), so a conversion is
// exact: every e4m3 / e5m2 value is a float16 value, and the bfloat16 path goes through float32
// (bf16 has e4m3's and e5m2's exponent ranges, and their 2 / 3 mantissa bits fit its 7).
//
// Two elements at a time (the 16-bit halves of a word hold elements 2i, 2i + 1, as an
// mma fragment pair does: pack(lo, hi) of sm80/mma.cuh):
//   - sm_89 and later: cvt.rn.f16x2.{e4m3x2,e5m2x2}, one instruction;
//   - sm_80 (no float8 instructions): integer bit moves.  e5m2 is the top byte of a float16
//     (1 sign, 5 exponent, 2 mantissa bits: the same bias), so x8 << 8 is exact, infinities and
//     NaNs included.  e4m3fn (bias 7, no infinities, NaN = S.1111.111): the sign to bit 15 and
//     the other 7 bits to bits 7..13 make the float16 of x * 2^-8 (normal and subnormal alike,
//     bias 15 = 7 + 8), times 256 exact in float32; 0x7f / 0xff become NaN explicitly.
#pragma once
#include "../common.cuh"

namespace fa {

// sm_89+: cvt.rn.f16x2.{e4m3x2, e5m2x2} of the low 16 bits of `two` (the lower byte to the
// lower half).
template <bool kE4M3>
__device__ __forceinline__ u32 fp8x2_to_f16x2_cvt(u32 two) {
  u32 r;
  if constexpr (kE4M3)
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t; }" : "=r"(r) : "r"(two));
  else
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e5m2x2 %0, t; }" : "=r"(r) : "r"(two));
  return r;
}

// K/V element formats of the decode kernel (its Kv template parameter).
struct KvSame {  // K/V in the query's 16-bit type: no conversion
  static constexpr int kBytes = 2;
};
struct KvE4M3 {  // ml_dtypes.float8_e4m3fn
  static constexpr int kBytes = 1;
  __device__ __forceinline__ static u32 to_f16x2(u32 two) {  // the low 16 bits of `two`
#if __CUDA_ARCH__ >= 890
    return fp8x2_to_f16x2_cvt<true>(two);
#else
    return soft_half(two & 0xffu) | (soft_half((two >> 8) & 0xffu) << 16);
#endif
  }

 private:
  // float16 bits of one e4m3fn byte b (sm_80 path).
  __device__ __forceinline__ static u32 soft_half(u32 b) {
    if ((b & 0x7fu) == 0x7fu) return 0x7e00u | ((b & 0x80u) << 8);  // NaN, sign kept
    const u32 scaled = ((b & 0x7fu) << 7) | ((b & 0x80u) << 8);    // float16 of x * 2^-8
    float f;
    asm("{ .reg .b16 h; cvt.u16.u32 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(scaled));
    f *= 256.f;  // exact
    u32 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; cvt.u32.u16 %0, t; }" : "=r"(h) : "f"(f));
    return h;
  }
};
struct KvE5M2 {  // ml_dtypes.float8_e5m2
  static constexpr int kBytes = 1;
  __device__ __forceinline__ static u32 to_f16x2(u32 two) {  // the low 16 bits of `two`
#if __CUDA_ARCH__ >= 890
    return fp8x2_to_f16x2_cvt<false>(two);
#else
    return ((two & 0xffu) << 8) | ((two & 0xff00u) << 16);
#endif
  }
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

// Two float8 elements (the low 16 bits of `two`) as one word of the 16-bit type Elem (F16 or
// Bf16 of sm80/mma.cuh): float16 directly; bfloat16 through float32 (exact both ways).
template <class Elem, class Fmt>
__device__ __forceinline__ u32 fp8x2_to(u32 two) {
  const u32 h2 = Fmt::to_f16x2(two);
  if constexpr (Elem::kIsF16) {
    return h2;
  } else {
    float lo, hi;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(lo), "=f"(hi) : "r"(h2));
    return Elem::pack(lo, hi);
  }
}

}  // namespace fa
