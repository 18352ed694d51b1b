#!/usr/bin/env bash
# (Record of stop 42's run 1, at c0893c6.  Since then FA_DECODE_PLAIN / LEAN_ISSUE / ACQ_REL are the
# default code and FA_DECODE_TMA is gone: those defines no longer change anything.)
# Stop 41's device call, repo root, logs under $OUT (each part tarred as it finishes; a call cut
# by its time limit still brings back what ran).
#   1. (~2.5 min) decode, MQA 32/1 and GQA 32/8, D = 128, page 16: the default (now masking
#      keys on absent pages) against FA_DECODE_PLAIN (no scale / ALiBi / mask work on whole
#      plain tiles), + FA_DECODE_LEAN_ISSUE, + 3 CTAs per SM; B = 1 timelines with
#      FA_DECODE_ACQ_REL; B = 1's split count at ctx 32768.
#   2. (~2 min) the decode GPU tests (with the new absent-page test) under the default, under
#      PLAIN + LEAN + ACQ_REL, and under FA_DECODE_TMA + PLAIN.
#   3. (~1 min) issue 12's paged D = 256 gap: page 256 against page 16 and dense with the
#      columns interleaved over 7 rounds, in both column orders.
#   4. (~2 min) memcheck and racecheck on the decode cases under PLAIN + LEAN + ACQ_REL.
set -u
OUT=${OUT:-/tmp/fa_stop41}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
PL=FA_DECODE_PLAIN=1; LEAN=FA_DECODE_LEAN_ISSUE=1; AR=FA_DECODE_ACQ_REL=1
C3=FA_DECODE_STAGES_D128=2,FA_DECODE_CTAS_D128=3; ALL=$PL,$LEAN,$AR
TMA=FA_DECODE_TMA=1,$PL  # whole paged tiles by TMA, with the plain logits
L="$OUT/dec"; mkdir -p "$L"
DTESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_fp8_decode.py"
if [ "${MODE:-}" = min ]; then
  # ~2.5 min, for a call with little device time left: the decode tests under the default
  # (the absent-page mask changed it), MQA with and without TMA + PLAIN, the tests under those.
  for defs in "" "$TMA"; do
    stamp "decode tests [${defs:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES=$defs OUT="$L/tests_${defs:+tma}" PRECOMPILE=0 N=4 PYTEST_TIMEOUT=120 \
      TESTS="$DTESTS" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 6
    tar -C "$OUT" -czf "$OUT/dec_tests_${defs:+tma}.tgz" dec
    [ -n "$defs" ] && break
    for d2 in "" "$TMA"; do
      stamp "32/1 D = 128 page 16 [${d2:-default}]"
      CUPY_FLASHATTN_SM90_DEFINES=$d2 timeout 60 python3 tools/decode_ring_probe.py \
        --rows 64:4096 --splits 0 --heads 32/1 --dim 128 --page 16 --no-peer 2>&1 \
        | tee -a "$L/probe.txt" | grep "^\["
    done
  done
  stamp done
  exit 0
fi
for run in "32/1|" "32/1|$PL" "32/1|$PL,$LEAN" "32/1|$PL,$LEAN,$C3" "32/1|$TMA" "32/8|" "32/8|$PL,$LEAN" \
    "32/8|$TMA"; do
  heads=${run%%|*}; defs=${run#*|}
  stamp "$heads D = 128 page 16 [${defs:-default}]"
  CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 90 python3 tools/decode_ring_probe.py \
    --rows 64:4096,16:16384 --splits 0 --heads $heads --dim 128 --page 16 \
    $([ "$run" = "32/1|" ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
done
for defs in "" "$ALL"; do
  stamp "B = 1 ctx 32768 16 splits, ctx 4096 auto [${defs:-default}]"
  CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_timeline.py \
    --rows 1:32768 --splits 16 2>&1 | tee -a "$L/timeline.txt" | grep "^B="
  CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_timeline.py \
    --rows 1:4096 --splits 0 2>&1 | tee -a "$L/timeline.txt" | grep "^B="
done
# B = 1's split count (the wave rule picks 29 at ctx 32768; stop 40 measured 16 faster, stop 37
# the reverse): the event time per forced count, default build, against cuDNN.
stamp "B = 1 split sweep ctx 32768"
timeout 90 python3 tools/decode_split_sweep.py --ctx 32768 --splits 0,16,20,24,29,32 2>&1 \
  | tee -a "$L/split_sweep.txt" | tail -n 9
tar -C "$OUT" -czf "$OUT/dec_timing.tgz" dec
for defs in "" "$ALL" "$TMA"; do
  stamp "decode tests [${defs:-default}]"
  CUPY_FLASHATTN_SM90_DEFINES=$defs OUT="$L/tests_$(echo "${defs:-default}" | tr -c 'A-Za-z0-9\n' _)" PRECOMPILE=0 N=4 PYTEST_TIMEOUT=150 \
    TESTS="$DTESTS" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 6
done
tar -C "$OUT" -czf "$OUT/dec_tests.tgz" dec
Q="$OUT/qb"; mkdir -p "$Q"
for args in "--paged 16,256" "--paged 256,16"; do
  stamp "quickbench $args"
  timeout 120 python3 tools/quickbench_sm90.py --rows "256,4096,0;256,2048,0;128,4096,0" \
    --archs sm90 --varlen --no-torch --rounds 7 $args 2>&1 | tee -a "$Q/quickbench.txt"
done
tar -C "$OUT" -czf "$OUT/qb.tgz" qb
stamp "sanitizers (decode cases) under $ALL,FA_DECODE_TMA=1"
CUPY_FLASHATTN_SM90_DEFINES=$ALL,FA_DECODE_TMA=1 CASES_K=decode OUT="$L/san" TOOL_TIMEOUT=100 \
  bash tools/sanitize.sh memcheck racecheck 2>&1 | tail -n 4
tar -C "$OUT" -czf "$OUT/dec_all.tgz" dec
stamp done
