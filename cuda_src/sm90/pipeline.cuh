// sm90/pipeline.cuh -- the producer / consumer handshake of the warp-specialized kernels:
// mbarriers in shared memory, the proxy fence, register reallocation between warpgroups.
//
// A ring of kStages K (and V) buffers; each buffer has a FULL barrier (the producer's threads
// arrive once the tile has landed) and an EMPTY barrier (every consumer thread arrives once it
// no longer reads the buffer).  Round r of a buffer completes phase r of its barriers, so a
// waiter passes `parity = r & 1`; the producer waits EMPTY with the opposite parity, which a
// fresh barrier (phase 0 in progress) grants at once: round 0 needs no release.
#pragma once
#include "../common.cuh"

namespace fa {
namespace pipe {

__device__ __forceinline__ void bar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// kHintNs > 0: try_wait's suspendTimeHint, the most nanoseconds a waiting thread stays
// suspended before try_wait returns false; 0: the hardware's own limit, which is short.  The
// kernels pass Sm90FwdTraits::kWaitHintNs (kernel_traits.cuh FA_SM90_WAIT_HINT_NS: why, and
// where it is on).
template <int kHintNs = 0>
__device__ __forceinline__ bool bar_try_wait(u32 bar, int parity) {
  u32 ok;
  if constexpr (kHintNs > 0) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity), "n"(kHintNs)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  }
  return ok != 0;
}
// Blocks until phase `parity` of the barrier has completed (try_wait suspends in hardware for
// a while before it returns false: the hardware's limit, or kHintNs).
template <int kHintNs = 0>
__device__ __forceinline__ void bar_wait(u32 bar, int parity) {
  while (!bar_try_wait<kHintNs>(bar, parity)) {
  }
}

// Arrive and add `bytes` to the transaction count of the current phase: the phase completes
// once every arrival is in and that many bytes have landed (TMA copies complete_tx on it).
__device__ __forceinline__ void bar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// ---- TMA (the tensor memory accelerator, sm_90) ---------------------------------------------
// A tensor map (CUtensorMap: the driver's opaque 128-byte descriptor of a global tensor and a
// box shape, encoded on the host by cuTensorMapEncodeTiled, _cuda/tma.py), passed inside the
// kernel's __grid_constant__ argument struct.
struct alignas(64) TmaDesc {
  u64 opaque[16];
};

// Copy the box at coordinates (c0, c1, c2) (innermost first, in elements) of the tensor `desc`
// describes into shared memory at `dst`, completing `bytes` of barrier `bar`'s transaction.
// Coordinates outside the tensor read zeros (the box still counts whole).
__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDesc* desc, int c0, int c1, int c2,
                                            u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same for a 4-D tensor (paged K/V: (D, Hk, P, num_pages), coordinates (d, head, row in
// page, page id); a page id outside the pool is out of bounds and reads zeros).
__device__ __forceinline__ void tma_load_4d(u32 dst, const TmaDesc* desc, int c0, int c1, int c2,
                                            int c3, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4, %5}], [%6];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// A bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared to
// global memory by the TMA unit, without a tensor map (the epilogue's rows of O,
// FA_SM90_O_BULK), in this thread's current bulk group.  The shared source must have been
// written before a fence_async_shared (below) of its writers and a barrier.
__device__ __forceinline__ void bulk_store(void* dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
// Close this thread's current bulk group (its copies so far).
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Wait until every committed bulk group of this thread has READ its shared source (so the
// buffer may be written again; the global writes may still be in flight).
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Shared memory written by ordinary stores or cp.async (the generic proxy) and read next by
// wgmma (the async proxy): each writing thread fences after its writes have completed and
// before it arrives on the barrier the readers wait on.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Register reallocation between the warpgroups of one CTA (sm_90a): the producer gives
// registers back, the consumers take them.  Needs a register cap at kernel entry
// (__launch_bounds__(threads, 1)); ptxas warns (C7508) when it ignores the instruction.
template <int kRegs>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// x, as a value the compiler cannot see through: addresses computed from it are not hoisted
// out of the persistent tile loop (where they would hold registers through the main loop).
__device__ __forceinline__ u32 opaque(u32 x) {
  u32 y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// A named barrier among `threads` threads (a multiple of 32) of the CTA; id 0 is __syncthreads.
// sync waits for the barrier to complete; arrive counts this thread's warp without waiting.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace pipe
}  // namespace fa
