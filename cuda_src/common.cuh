// common.cuh -- types, constants, shared-memory addressing, vector accesses and fast math
// that every kernel uses, whatever its architecture path (the sm_80 tensor-core and copy
// wrappers are in sm80/mma.cuh).
//
// Header-free on purpose: NVRTC in a pip environment cannot be relied on to find
// <cuda_fp16.h> / <cuda_bf16.h> / <mma.h>, so half and bfloat16 values travel as raw 16-bit
// integers and every conversion or tensor-core operation is one PTX instruction below.
// Everything here needs sm_80 or newer (mma.m16n8k16 with bf16, cp.async, cvt.*x2.f32).
#pragma once

namespace fa {

using u16 = unsigned short;
using u32 = unsigned int;
using i64 = long long;
using u64 = unsigned long long;

// std::conditional_t without <type_traits> (NVRTC has no standard headers here): A if kIf,
// else B.
template <bool kIf, class A, class B> struct Conditional { using type = A; };
template <class A, class B> struct Conditional<false, A, B> { using type = B; };
template <bool kIf, class A, class B> using conditional_t = typename Conditional<kIf, A, B>::type;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// The same constants for float64 state, as functions: a namespace-scope double constant would
// add a symbol to every module's cubin.
__host__ __device__ constexpr double log2e_f64() { return 1.4426950408889634074; }
__host__ __device__ constexpr double ln2_f64() { return 0.69314718055994530942; }

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// ---- Shared memory addressing ---------------------------------------------------------------
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// ---- Plain shared / global vector accesses (no CUDA vector types needed) ---------------------
__device__ __forceinline__ void st_shared_b32(u32 addr, u32 v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ u32 ld_shared_b32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void ld_shared_v4(u32 (&r)[4], u32 addr) {
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void st_shared_v4(u32 addr, const u32 (&r)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]),
               "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void st_global_v4(void* p, const u32 (&r)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(r[0]), "r"(r[1]), "r"(r[2]),
               "r"(r[3])
               : "memory");
}

// ---- Fast math ---------------------------------------------------------------------------------
__device__ __forceinline__ float exp2_approx(float x) {  // ex2.approx: 2 ulp, exp2(-inf) = 0
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float log2_approx(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error ~1e-7 (tanh.approx.f32 is only ~2^-11
// relative, which times a softcap of 30-50 would move logits by ~0.02: too coarse for fp16).
__device__ __forceinline__ float tanh_accurate(float x) {
  const float e = exp2_approx(x * (2.0f * kLog2e));  // +inf for large x gives exactly 1
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.0f));
  return 1.0f - 2.0f * r;
}

// ---- The arithmetic of one kernel family's softmax and logit transform ----------------------
// FastMath: the 16-bit kernels' (fp32 state, approximate ex2/lg2: 2 ulp, far below bf16's
// 2^-8); Fp32Math: float32 inputs at float32 accuracy (the same ex2/lg2 -- 2 ulp of fp32 --
// but tanhf for softcap: tanh_accurate's ~1e-7 absolute error times a cap of 30 would be ~30
// ulp of the logit); Fp64Math: float64 state and libdevice's exp2 / log2 / tanh (~1 ulp of
// double).  OnlineSoftmax, the merge rules and LogitTransform take one of these.
struct FastMath {
  using T = float;
  __device__ __forceinline__ static float exp2(float x) { return exp2_approx(x); }
  __device__ __forceinline__ static float log2(float x) { return log2_approx(x); }
  __device__ __forceinline__ static float tanh(float x) { return tanh_accurate(x); }
};
struct Fp32Math {
  using T = float;
  __device__ __forceinline__ static float exp2(float x) { return exp2_approx(x); }
  __device__ __forceinline__ static float log2(float x) { return log2_approx(x); }
  __device__ __forceinline__ static float tanh(float x) { return tanhf(x); }
};
struct Fp64Math {
  using T = double;
  __device__ __forceinline__ static double exp2(double x) { return ::exp2(x); }
  __device__ __forceinline__ static double log2(double x) { return ::log2(x); }
  __device__ __forceinline__ static double tanh(double x) { return ::tanh(x); }
};

// max that skips a NaN operand (fmaxf / fmax), for either accumulator type.
__device__ __forceinline__ float max_skip_nan(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_skip_nan(double a, double b) { return fmax(a, b); }

// Butterfly reductions over the 4 lanes of a quad (the lanes that share an mma row), float or
// double.
template <class T>
__device__ __forceinline__ T quad_max(T x) {
  x = max_skip_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = max_skip_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
template <class T>
__device__ __forceinline__ T quad_sum(T x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// The same over all 32 lanes of a warp (the split-KV combine: one split per lane).
template <class T>
__device__ __forceinline__ T warp_max(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = max_skip_nan(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
template <class T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Elements of a run-time dtype (the decode combine and the rotary/append kernels serve every
// dtype from one instantiation).  Codes, as decode.py's _elem_code passes them: 0 float32,
// 1 float16, 2 bfloat16, 3 float64 (loads only; cvt.rn, as NumPy's astype(float32)).  16-bit
// stores round to nearest even.
__device__ __forceinline__ float load_elem(const void* base, i64 i, int type) {
  switch (type) {
    case 0: return static_cast<const float*>(base)[i];
    case 3: return (float)static_cast<const double*>(base)[i];
    case 2: return __uint_as_float((u32)static_cast<const u16*>(base)[i] << 16);
    default: {
      float f;
      asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<const u16*>(base)[i]));
      return f;
    }
  }
}
__device__ __forceinline__ void store_elem(void* base, i64 i, int type, float v) {
  if (type == 0) {
    static_cast<float*>(base)[i] = v;
    return;
  }
  u16 b;
  if (type == 2) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));
  else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v));
  static_cast<u16*>(base)[i] = b;
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ i64 lmin(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 lmax(i64 a, i64 b) { return a > b ? a : b; }

// Zero a register array of mma accumulators, e.g. float acc[kMRep][kTiles][4].
template <int kA, int kB, class T>
__device__ __forceinline__ void zero_fragments(T (&x)[kA][kB][4]) {
#pragma unroll
  for (int a = 0; a < kA; ++a)
#pragma unroll
    for (int b = 0; b < kB; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[a][b][e] = T(0);
}

}  // namespace fa
