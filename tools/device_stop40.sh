#!/usr/bin/env bash
# The device call stop 40 prepared and could not run (its device time ran out), repo root, logs
# under $OUT, each part tarred as it finishes (a call cut by its time limit still brings back
# what ran; at most 8 files come back).  Stop 40's own runs (A/B of FA_SM90_FLAG_WORD, now the
# default, and of a 32-loads merge, refuted and removed) are in git history at e72cc31 and in
# benchmarks/NOTES.md, stop 40.
# MODE=next (~3 min): the decode switches prepared at the end of stop 40 (see the mode).
set -u
OUT=${OUT:-/tmp/fa_stop40}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
if [ "${MODE:-next}" = next ]; then
  # ~3 min: the two decode switches prepared at the end of stop 40 (no device time was left).
  #   FA_DECODE_LEAN_ISSUE=1: the copy issue shuffles key-row addresses (689 instead of 725
  #     instructions a tile), alone and with 3 CTAs per SM (FA_DECODE_STAGES_D128=2,
  #     FA_DECODE_CTAS_D128=3: 12 warps per SM, never timed on the instruction-bound MQA row);
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
