#!/usr/bin/env bash
# Stop 40's device call (repo root), logs under $OUT, each part tarred as it finishes (a call
# cut by its time limit still brings back what ran; at most 8 files come back).  Two switches,
# both off by default until this call has tested and timed them ($NEW below):
#   FA_DECODE_MERGE_LOADS_MAX=32  the fused split merge's float4 loads in flight per lane in the
#       16-row decode kernels with 255 registers a thread (D = 128 16-bit, D >= 256): one L2
#       round trip for up to 32 splits at head dim 128 (stop 40's first call: merge alone 4.0 us
#       at 29 splits, 2.6 at 16; B = 1 ctx 32768 event 61-62 us against cuDNN's 53.6);
#   FA_SM90_FLAG_WORD=1  the sm90 paged consumers read a stage's absent-page flags as one word,
#       loaded before the wait for S (issue 12: paged D = 256 at 0.93-0.954 of dense).
# MODE=ab (~6 min):
#   1. timing A/B: B = 1 decode timelines (ctx 32768 at 16 / 29 / 32 splits, ctx 4096 auto),
#      default and $NEW, twice; prefill quickbench D = 256 S = 4000 / 2048 and D = 128 S = 4096,
#      dense and paged 16 / 256, default and $NEW;
#   2. the whole GPU suite under $NEW (6 shards);
#   3. memcheck / racecheck / synccheck / initcheck over tools/sanitize_cases.py under $NEW.
# REPS (2): rounds of the decode timelines; SAN: the sanitizer tools (default all four).
# MODE=next (~3 min): the decode switches prepared at the end of stop 40, not yet device-run
#   (FA_DECODE_LEAN_ISSUE, FA_DECODE_ACQ_REL; see the mode).
set -u
OUT=${OUT:-/tmp/fa_stop40}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
NEW=FA_DECODE_MERGE_LOADS_MAX=32,FA_SM90_FLAG_WORD=1
if [ "${MODE:-ab}" = ab ]; then
  L="$OUT/ab"; mkdir -p "$L"
  for rep in $(seq 1 "${REPS:-2}"); do
    for defs in "" "$NEW"; do
      for sp in 16 29 32; do
        stamp "B = 1 ctx 32768, $sp splits [${defs:-default}] ($rep)"
        CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_timeline.py \
          --rows 1:32768 --splits $sp 2>&1 | tee -a "$L/timeline.txt" | grep "^B="
      done
      stamp "B = 1 ctx 4096 / 32768, auto splits [${defs:-default}] ($rep)"
      CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_timeline.py \
        --rows 1:4096,1:32768 --splits 0 2>&1 | tee -a "$L/timeline.txt" | grep "^B="
    done
  done
  for defs in "" "$NEW"; do
    stamp "prefill quickbench [${defs:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 150 python3 tools/quickbench_sm90.py --archs sm90 \
      --rows "256,4000,0;256,2048,0;128,4096,0" --paged 16,256 2>&1 | tee -a "$L/quickbench.txt" | tail -n 5
  done
  tar -C "$OUT" -czf "$OUT/ab_timing.tgz" ab
  stamp "GPU suite under $NEW"
  CUPY_FLASHATTN_SM90_DEFINES=$NEW OUT="$L/suite" PYTEST_TIMEOUT=300 \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 12
  tar -C "$OUT" -czf "$OUT/ab_suite.tgz" ab/suite
  stamp "sanitizers under $NEW"
  CUPY_FLASHATTN_SM90_DEFINES=$NEW OUT="$L/san" TOOL_TIMEOUT=150 \
    bash tools/sanitize.sh ${SAN:-} 2>&1 | tail -n 8
  tar -C "$OUT" -czf "$OUT/ab_san.tgz" ab/san
  rm -rf "$L"
  stamp done
  exit 0
fi
if [ "${MODE:-ab}" = next ]; then
  # ~3 min: the two decode switches prepared at the end of stop 40 (no device time was left).
  #   FA_DECODE_LEAN_ISSUE=1: the copy issue shuffles key-row addresses (689 instead of 725
  #     instructions a tile; 150 registers at D = 128 instead of 228, so 3 CTAs per SM fit:
  #     FA_DECODE_STAGES_D128=2,FA_DECODE_CTAS_D128=3, 12 warps per SM for the instruction-bound
  #     MQA row);
  #   FA_DECODE_ACQ_REL=1: the fused merge's handshake by acquire / release fences.
  L="$OUT/next"; mkdir -p "$L"
  LEAN=FA_DECODE_LEAN_ISSUE=1; C3=FA_DECODE_STAGES_D128=2,FA_DECODE_CTAS_D128=3
  for heads in 32/1 32/8; do
    for defs in "" "$LEAN" "$LEAN,$C3" "$C3"; do
      stamp "$heads D = 128 page 16 [${defs:-default}]"
      CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 90 python3 tools/decode_ring_probe.py \
        --rows 64:4096,16:16384,1:4096 --splits 0 --heads $heads --dim 128 --page 16 \
        $([ -z "$defs" ] && [ "$heads" = 32/1 ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
    done
  done
  for rep in 1 2; do
    for defs in "" "FA_DECODE_ACQ_REL=1" "FA_DECODE_ACQ_REL=1,$LEAN"; do
      stamp "B = 1 ctx 32768 29 / 16 splits, ctx 4096 auto [${defs:-default}] ($rep)"
      for sp in 29 16; do
        CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_timeline.py \
          --rows 1:32768 --splits $sp 2>&1 | tee -a "$L/timeline.txt" | grep "^B="
      done
      CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_timeline.py \
        --rows 1:4096 --splits 0 2>&1 | tee -a "$L/timeline.txt" | grep "^B="
    done
  done
  tar -C "$OUT" -czf "$OUT/next_timing.tgz" next
  ALL=FA_DECODE_ACQ_REL=1,$LEAN
  stamp "decode tests under $ALL"
  # (the large-offset tests, 64-bit addressing past 2^31 elements, run alone after the shards)
  CUPY_FLASHATTN_SM90_DEFINES=$ALL OUT="$L/tests" PRECOMPILE=0 N=4 PYTEST_TIMEOUT=150 \
    TESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_fp8_decode.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 6
  stamp "sanitizers (decode cases) under $ALL"
  CUPY_FLASHATTN_SM90_DEFINES=$ALL CASES_K=decode OUT="$L/san" TOOL_TIMEOUT=100 \
    bash tools/sanitize.sh memcheck racecheck 2>&1 | tail -n 4
  tar -C "$OUT" -czf "$OUT/next_all.tgz" next
  rm -rf "$L"
  stamp done
  exit 0
fi
echo "unknown MODE=${MODE}" >&2
exit 2
