// sm90/tile_scheduler.cuh -- which query tiles a persistent CTA of the sm90 kernel runs, in
// which order (the TileScheduler of FlashAttention-3's Mainloop x Epilogue x TileScheduler).
//
// Tiles are numbered i = m + tiles_m (h + H b), or grouped (coords, the dynamic schedule of a
// causal / local launch) (flash_fwd.cu tile_at maps i to its sequence, head and query rows; a
// tile past its sequence's queries holds nothing and is skipped).
// Two schedules, chosen by the host per launch (_cuda/schedule.py):
//
//  - STATIC (counter == nullptr; problems whose lengths the host knows): rounds of gridDim.x
//    tiles, CTA c takes tile r G + c of round r, or r G + G - 1 - c in odd rounds (the snake
//    evens out causal tiles of unequal work).  Every warpgroup walks the same sequence by
//    itself; nothing is shared.
//  - DYNAMIC (counter != nullptr; varlen, seqused_k, paged caches...: lengths on the device):
//    tiles are claimed from a global counter as CTAs free up, so unequal sequences balance
//    over the SMs like a one-CTA-per-tile grid does, while each CTA still loads the next
//    tile's Q and first K / V under the current one (a one-CTA-per-tile grid pays that fill
//    for every tile: paged S = 512 measured 0.80x of dense one call, stop 26).  The producer's
//    thread 0 (the CLAIMER) takes tile blockIdx.x first, then gridDim.x + atomicAdd(counter),
//    and posts each claim to the CTA's other threads through a two-slot mailbox in shared
//    memory: a FULL mbarrier per slot (count 1: the claimer's post) and an EMPTY one (every
//    thread of the CTA has read it), as the K / V ring.  A claim past the last tile posts -1,
//    the end.  The claimer claims when the previous tile's loads are issued, with slack before
//    the consumers need the next Q.
//    Only the producer waits for the bare index.  Once its threads have resolved the claim
//    (the sequence's rows: global reads of cu_seqlens / seqused_k), the claimer posts those
//    four numbers in the same slot on a second FULL barrier (POSTED), which the consumers wait
//    on instead (read_post).  Resolving the tile themselves put those dependent global reads
//    between each consumer's epilogue and its next tile's first product.
//
// Callers skip a tile that holds no query (tile_at false: a varlen sequence shorter than the
// longest), as in the static schedule, so every thread reads every posted claim.
//
// The counter is [next tile - gridDim.x, CTAs retired], zero at launch.  The last CTA to retire
// zeroes it again, so the next launch on the stream (or a CUDA-graph replay) starts from 0
// with no host work; the host keeps one counter per plan and stream (launch.py).
#pragma once
#include "../common.cuh"
#include "pipeline.cuh"

namespace fa {

// A thread's place in the schedule: the round (static) or the number of claims read (dynamic),
// the only state kept across a tile.  The counter, tile count and mailbox are passed to next()
// again each time (from the kernel's parameters and shared-memory layout): held across the
// producer's tile (56 registers) they spilled.
struct TileScheduler {
  int step = 0;

  // The mailbox's mbarriers, kBars of them from `bars`: full(slot) at bars + 8 slot, empty(slot)
  // at bars + 16 + 8 slot, posted(slot) at bars + 32 + 8 slot.
  static constexpr int kBars = 6;

  // Tile i's query-tile index m (0 .. tiles_m - 1, before tile_at's causal reversal: m = 0 is
  // the heaviest under a window) and (sequence, head) index hb = h + H b.  Head-major, i = m +
  // tiles_m hb, unless `grouped` (the dynamic schedule of a causal / local launch, with
  // FA_SM90_LPT_GROUPS): then the pairs are split evenly into ng = pairs tiles_m / (2 CTAs)
  // groups (at least 1) of about two rounds of tiles each, m-major inside a group -- every
  // pair's heaviest tile, then the next heaviest...  A dynamic schedule claims in index order,
  // so a group's heavy tiles go out while its light ones can still fill the gaps behind them
  // (longest-processing-time first), and the tiles in flight span one or two groups' keys (L2
  // reuse).  A greedy-claim simulation of make bench's causal shapes on 132 / 120 CTAs
  // (benchmarks/NOTES.md, stop 49): makespan efficiency 0.88-0.97 head-major, 0.97-1.00 grouped;
  // groups of one round or of a fixed pair count did worse where the last group came out small.
  // Group g holds pairs [pairs g / ng, pairs (g + 1) / ng); pair p is in group
  // (p ng + ng - 1) / pairs.
  __device__ __forceinline__ static void coords(int i, int tiles_m, int pairs, bool grouped,
                                                int& m, int& hb) {
    if (!grouped) {
      m = i % tiles_m;
      hb = i / tiles_m;
      return;
    }
    const long long ng = imax(1, (int)((long long)pairs * tiles_m / (2 * (int)gridDim.x)));
    const int g = (int)(((long long)(i / tiles_m) * ng + ng - 1) / pairs);
    const int first = (int)(pairs * g / ng), count = (int)(pairs * (g + 1) / ng) - first;
    const int r = i - tiles_m * first;
    m = r / count;
    hb = first + (r - m * count);
  }

  // One thread, before the CTA's first sync: full(0), full(1) and posted(0), posted(1) take the
  // claimer's post; empty(0), empty(1) an arrival of each of the CTA's `threads` threads.
  __device__ static void init_barriers(u32 bars, int threads) {
    pipe::bar_init(bars, 1);
    pipe::bar_init(bars + 8, 1);
    pipe::bar_init(bars + 16, threads);
    pipe::bar_init(bars + 24, threads);
    pipe::bar_init(bars + 32, 1);
    pipe::bar_init(bars + 40, 1);
  }

  // The next tile this CTA runs, or -1 when it is done.  The static schedule's last round may
  // return an index >= num_tiles, and any tile may hold no query: callers skip those (tile_at).
  // `counter`: the dynamic schedule's counter or null (static); `bars` / `slots`: shared-memory
  // addresses of the mailbox's mbarriers and two ints; `claimer`: thread 0 of the producer.
  // Dynamic: the producer's threads only (the consumers read_post); the claimer then posts.
  // kHintNs: the kernel's mbarrier wait hint (Sm90FwdTraits::kWaitHintNs), as read_post's.
  template <int kHintNs>
  __device__ __forceinline__ int next(int num_tiles, int* counter, u32 bars, u32 slots,
                                      bool claimer) {
    const int grid = (int)gridDim.x;
    if (counter == nullptr) {
      if (step * grid >= num_tiles) return -1;
      const int c = step & 1 ? grid - 1 - (int)blockIdx.x : (int)blockIdx.x;
      return step++ * grid + c;
    }
    const int slot = step & 1, phase = (step >> 1) & 1;
    const u32 full = bars + 8 * slot, empty = bars + 16 + 8 * slot, box = slots + 4 * slot;
    ++step;
    int i;
    if (claimer) {
      // Every thread has read the claim posted 2 steps ago.
      pipe::bar_wait<kHintNs>(empty, phase ^ 1);
      i = step == 1 ? (int)blockIdx.x : grid + atomicAdd(counter, 1);
      if (i >= num_tiles) i = -1;
      st_shared_b32(box, (u32)i);
      pipe::bar_arrive(full);  // release: the store is seen by the waiters' acquire
      if (i < 0) {
        pipe::bar_arrive(bars + 32 + 8 * slot);  // POSTED: the end has nothing to resolve
        retire(counter);
      }
    } else {
      pipe::bar_wait<kHintNs>(full, phase);
      i = (int)ld_shared_b32(box);
    }
    pipe::bar_arrive(empty);
    return i;
  }

  // Dynamic, the claimer once the producer resolved claim i (next() posted the end, -1): four
  // words for the
  // consumers (flash_fwd.cu: the sequence's q_start, len_q, k_start, len_k), in the claim's slot.
  // `slots`: as for next(); the words live at slots + 16 + 16 slot.
  __device__ __forceinline__ void post(const u32 (&words)[4], u32 bars, u32 slots) const {
    const int slot = (step - 1) & 1;
    st_shared_v4(slots + 16 + 16 * slot, words);
    pipe::bar_arrive(bars + 32 + 8 * slot);  // POSTED; release, as FULL
  }

  // Dynamic, a consumer thread: the next claim (-1: the end; claims in order) and, for a tile,
  // the words the claimer posted with it.  POSTED alone is waited on: the claimer arrives on
  // it after storing the claim (the end: right after, with nothing to resolve).
  template <int kHintNs>
  __device__ __forceinline__ int read_post(u32 (&words)[4], u32 bars, u32 slots) {
    const int slot = step & 1, phase = (step >> 1) & 1;
    ++step;
    pipe::bar_wait<kHintNs>(bars + 32 + 8 * slot, phase);  // POSTED
    const int i = (int)ld_shared_b32(slots + 4 * slot);
    ld_shared_v4(words, slots + 16 + 16 * slot);
    pipe::bar_arrive(bars + 16 + 8 * slot);  // EMPTY: this thread is done with the slot
    return i;
  }

  // The claimer's last act: count this CTA out; the last CTA zeroes the counter for the next
  // launch (every CTA's claims precede its count, so none can follow the reset).
  __device__ __forceinline__ static void retire(int* counter) {
    __threadfence();
    if (atomicAdd(counter + 1, 1) == (int)gridDim.x - 1) {
      atomicExch(counter, 0);
      atomicExch(counter + 1, 0);
    }
  }
};

}  // namespace fa
