// sm90/diag_timeline.cuh -- FA_SM90_DIAG_TIMELINE=1 (a diagnostic build; results unchanged):
// when each warpgroup of a persistent CTA reaches the steps of its first kTlTiles query tiles,
// as SM clock cycles, for tools/sm90_timeline.py.  Built for one question: what a query tile
// costs besides its key tiles (stop 46's fit: ~3.4 us per tile against cuDNN's ~0.6) -- the
// epilogue, the scheduler, the wait for the next Q, the first S before any overlap.
//
// fa_sm90_timeline[cta][role][tile][event]: role 0 the producer (its thread 0), 1 and 2 the
// consumer warpgroups (their thread 0); `tile` counts the CTA's query tiles from 0 (every
// claimed tile with queries, keys or not); events below.  fa_sm90_timeline_span[cta]: the
// CTA's first and last clock and %globaltimer (ns), so the tool converts cycles to time.
// Unwritten entries stay as the tool left them (it zeroes the buffer before the measured call).
// Off (the default): every macro is empty and the kernels' machine code is the shipped one.
// On, the D = 128 softcap / ALiBi paged kernels spill (16 bytes): time the plain ones.
#pragma once
#include "../common.cuh"

#ifndef FA_SM90_DIAG_TIMELINE
#define FA_SM90_DIAG_TIMELINE 0
#endif

// Producer events.
#define FA_TL_P_CLAIMED 0    // the scheduler returned the tile
#define FA_TL_P_Q_EMPTY 1    // the consumers' release of the last Q has been seen
#define FA_TL_P_LAST_V 2     // the tile's last V load issued (the producer is done with it)
// (No mark at the first K: one more live value in the producer's loop spilled it, 4 bytes at
// D = 128.  The first K is issued right after Q, so Q_EMPTY stands for both.)
// Consumer events.
#define FA_TL_C_START 0      // the tile is known (scheduler / posted rows)
#define FA_TL_C_Q_FULL 1     // its Q has landed
#define FA_TL_C_FIRST_S 2    // the first S = Q K^T has completed
#define FA_TL_C_LOOP_END 3   // every S issued and consumed; the last P V not yet issued
#define FA_TL_C_PV_DONE 4    // the last P V has completed
#define FA_TL_C_STORED 5     // the epilogue's stores are issued
#define FA_TL_C_FINAL 6      // the epilogue: O / l and the LSE computed (before the staging)
#define FA_TL_C_STAGED 7     // the epilogue: O staged in shared memory, the warpgroup's barrier passed

#if FA_SM90_DIAG_TIMELINE
namespace fa {
constexpr int kTlCtas = 160, kTlRoles = 3, kTlTiles = 48, kTlEvents = 8;
}
extern "C" {
__device__ unsigned long long fa_sm90_timeline[fa::kTlCtas * fa::kTlRoles * fa::kTlTiles * fa::kTlEvents];
__device__ unsigned long long fa_sm90_timeline_span[fa::kTlCtas * 4];
}
namespace fa {
__device__ __forceinline__ unsigned long long tl_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// One event of one role (thread `leader` only; clock64 is per SM, so only differences within
// a CTA are meaningful).
__device__ __forceinline__ void tl_mark(bool leader, int role, int tile, int event) {
  if (leader && blockIdx.x < kTlCtas && tile < kTlTiles)
    fa_sm90_timeline[((blockIdx.x * kTlRoles + role) * kTlTiles + tile) * kTlEvents + event] =
        clock64();
}
// The CTA's span: slot 0 / 1 its first clock / globaltimer, 2 / 3 its last (thread `leader`).
__device__ __forceinline__ void tl_span(bool leader, bool last) {
  if (leader && blockIdx.x < kTlCtas) {
    fa_sm90_timeline_span[blockIdx.x * 4 + 2 * last] = clock64();
    fa_sm90_timeline_span[blockIdx.x * 4 + 2 * last + 1] = tl_globaltimer();
  }
}
}  // namespace fa
#define FA_TL(leader, role, tile, event) ::fa::tl_mark((leader), (role), (tile), (event))
#define FA_TL_SPAN(leader, last) ::fa::tl_span((leader), (last))
#else
#define FA_TL(leader, role, tile, event) ((void)0)
#define FA_TL_SPAN(leader, last) ((void)0)
#endif
