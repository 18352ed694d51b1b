// sm80/mma.cuh -- the Ampere-style tensor-core and copy wrappers: the element types (how two
// fp32 values become one .b32 register and which mma.sync runs), ldmatrix and cp.async.
// sm_80 instructions, also valid on sm_90 (where the Hopper path will use wgmma and TMA).
#pragma once
#include "../common.cuh"

namespace fa {

// ---- Element types: how two fp32 values become one .b32 register and which mma runs. -----
// pack(lo, hi): lo goes to the low 16 bits (the lower column index of a fragment pair).
// Note PTX's operand order: cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a in d.hi and b in d.lo.
struct Bf16 {
  static constexpr bool kIsF16 = false;
  __device__ __forceinline__ static u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  // D(16x8,f32) += A(16x16) * B(16x8); A row-major, B "col" (the PTX ISA's
  // mma.m16n8k16 fragment layouts).
  __device__ __forceinline__ static void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

struct F16 {
  static constexpr bool kIsF16 = true;
  __device__ __forceinline__ static u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// The A fragment (16 x 16) of P for keys 16 kk .. 16 kk + 15 from S's m16n8 accumulators of
// n-tiles 2 kk (s0) and 2 kk + 1 (s1): an accumulator's (row, column pair) layout is the A
// fragment's, so P goes from S to the P V mma in registers, two floats per 16-bit pair.
template <class Elem>
__device__ __forceinline__ void pack_p_fragment(u32 (&pa)[4], const float (&s0)[4],
                                                const float (&s1)[4]) {
  pa[0] = Elem::pack(s0[0], s0[1]);
  pa[1] = Elem::pack(s0[2], s0[3]);
  pa[2] = Elem::pack(s1[0], s1[1]);
  pa[3] = Elem::pack(s1[2], s1[3]);
}

// ldmatrix x4: lanes 8i..8i+7 give the 16-byte row addresses of 8x8 matrix i; register ri then
// holds matrix i's [g][2t, 2t+1] (with .trans: [2t][g], [2t+1][g]), g = lane/4, t = lane%4.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- cp.async: 16-byte global -> shared copies that overlap compute --------------------------
// With pred false the source size is 0: nothing is read and the 16 bytes are zero-filled, so
// rows past the end of a sequence, absent pages and the head-dim tail never touch memory.
// `src` must still be a valid-looking pointer; callers pass the tensor base in that case.
__device__ __forceinline__ void cp_async_16(u32 smem_addr, const void* src, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr), "l"(src),
               "r"(src_size)
               : "memory");
}
// 4-byte cp.async (.ca: the only cache mode with 4-byte copies); pred false zero-fills.  Used
// for block-table entries (one int per key row), which are not 16-byte groups.
__device__ __forceinline__ void cp_async_4(u32 smem_addr, const void* src, bool pred) {
  const int src_size = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr), "l"(src),
               "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}


}  // namespace fa
