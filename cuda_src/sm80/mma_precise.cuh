// sm80/mma_precise.cuh -- tensor-core products of float32 and float64 operands for the precise
// prefill (flash_fwd_precise.cu): which mma.sync runs and how a value becomes its operands.
//
// Fragment convention (an 8-wide k block; g = lane / 4, t = lane % 4):
//   A (16 x 8):  a[h][j] = A[g + 8h][k = 2t + j]     (rows g, g + 8)
//   B (8 x 8):   b[j]    = B[k = 2t + j][n = g]
//   C (16 x 8):  acc[2h + e] = C[g + 8h][2t + e]     (the m16n8 accumulator layout of mma.cuh)
// A thread's two k positions are adjacent (2t, 2t + 1), so Q and K fragments come from one
// 16-byte shared-memory read, and the accumulator of S (columns 2t, 2t + 1 of each key block)
// IS the A fragment of P for P V -- no shuffle.  The hardware's k slots are free to permute:
// a product sums over k, so any assignment of our 8 positions to its 8 slots gives the same sum
// as long as A and B use the same one.
//
// float32, Tf32<3> (default, "highest"): x = hi + lo with hi = tf32(x) (10 explicit mantissa
// bits) and lo = tf32(x - hi) (x - hi is exact in fp32); a b = hi_a hi_b + hi_a lo_b + lo_a hi_b
// + lo_a lo_b, and the last term (~2^-22 |a b|) is dropped: three m16n8k8 tf32 products with
// fp32 accumulation, ~float32 accuracy (the "3xTF32" of CUTLASS).  Tf32<1> ("high"): hi_a hi_b
// only, TF32's ~2^-11 (torch's allow_tf32).
// float64, F64: mma.sync m8n8k4 f64 (DMMA): the m16n8 tile is two m8n8 products (rows g and
// g + 8) and the 8-wide k block two k4 steps (slot t <- k = 2t + j for step j).
#pragma once
#include "../common.cuh"

namespace fa {

__device__ __forceinline__ u32 tf32_round(float x) {  // round to nearest, ties away (CUTLASS's)
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// D(16x8) += A(16x8) B(8x8), tf32 operands, fp32 accumulators.  Hardware A slots: a0 (g, t),
// a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); B slots b0 (t, g), b1 (t + 4, g).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D(8x8) += A(8x4) B(4x8), float64: a = A[g][t], b = B[t][g], d = D[g][2t], D[g][2t + 1].
__device__ __forceinline__ void mma_f64(double& d0, double& d1, double a, double b) {
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
      : "+d"(d0), "+d"(d1)
      : "d"(a), "d"(b));
}

// kProducts: 3 (float32 accuracy) or 1 (plain TF32).
template <int kProducts>
struct Tf32 {
  static_assert(kProducts == 1 || kProducts == 3, "1xTF32 or 3xTF32");
  using T = float;
  using Math = Fp32Math;
  static constexpr bool kSplit = kProducts == 3;
  struct A {
    u32 hi[4], lo[kSplit ? 4 : 1];
  };
  struct B {
    u32 hi[2], lo[kSplit ? 2 : 1];
  };
  __device__ __forceinline__ static void split(float x, u32& hi, u32* lo) {
    hi = tf32_round(x);
    if constexpr (kSplit) *lo = tf32_round(x - __uint_as_float(hi));
  }
  // Our k = 2t + j goes to hardware slot t + 4j.
  __device__ __forceinline__ static A make_a(const float (&a)[2][2]) {
    A r;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j) split(a[h][j], r.hi[h + 2 * j], kSplit ? &r.lo[h + 2 * j] : r.lo);
    return r;
  }
  __device__ __forceinline__ static B make_b(const float (&b)[2]) {
    B r;
#pragma unroll
    for (int j = 0; j < 2; ++j) split(b[j], r.hi[j], kSplit ? &r.lo[j] : r.lo);
    return r;
  }
  // The small terms first: they are added to the accumulator before the large one rounds it.
  __device__ __forceinline__ static void mma(float (&d)[4], const A& a, const B& b) {
    if constexpr (kSplit) {
      mma_tf32(d, a.lo, b.hi);
      mma_tf32(d, a.hi, b.lo);
    }
    mma_tf32(d, a.hi, b.hi);
  }
};

struct F64 {
  using T = double;
  using Math = Fp64Math;
  struct A {
    double x[2][2];
  };
  struct B {
    double x[2];
  };
  __device__ __forceinline__ static A make_a(const double (&a)[2][2]) {
    return {{{a[0][0], a[0][1]}, {a[1][0], a[1][1]}}};
  }
  __device__ __forceinline__ static B make_b(const double (&b)[2]) { return {{b[0], b[1]}}; }
  __device__ __forceinline__ static void mma(double (&d)[4], const A& a, const B& b) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mma_f64(d[0], d[1], a.x[0][j], b.x[j]);
      mma_f64(d[2], d[3], a.x[1][j], b.x[j]);
    }
  }
};

// ---- Shared-memory reads of one 16-byte chunk / one element --------------------------------
__device__ __forceinline__ void ld_shared_chunk(float (&r)[4], u32 addr) {
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ld_shared_chunk(double (&r)[2], u32 addr) {
  asm volatile("ld.shared.v2.f64 {%0,%1}, [%2];" : "=d"(r[0]), "=d"(r[1]) : "r"(addr));
}
__device__ __forceinline__ float ld_shared_elem(float*, u32 addr) {
  float r;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(addr));
  return r;
}
__device__ __forceinline__ double ld_shared_elem(double*, u32 addr) {
  double r;
  asm volatile("ld.shared.f64 %0, [%1];" : "=d"(r) : "r"(addr));
  return r;
}

// Two adjacent elements to global memory (8 or 16 bytes, aligned: d even, rows 16-byte aligned).
__device__ __forceinline__ void st_global_pair(float* p, float a, float b) {
  asm volatile("st.global.v2.f32 [%0], {%1,%2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void st_global_pair(double* p, double a, double b) {
  asm volatile("st.global.v2.f64 [%0], {%1,%2};" ::"l"(p), "d"(a), "d"(b) : "memory");
}

}  // namespace fa
