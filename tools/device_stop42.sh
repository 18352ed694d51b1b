#!/usr/bin/env bash
# Stop 42's second device call, repo root, logs under $OUT (tarred per part).
#   1. (~1.5 min) the paired 32-row decode kernel (FA_DECODE_PAIRED=1, a host switch; +2 ring
#      slots with FA_DECODE_PAIRED_EXTRA_STAGES=2) against the 16-row default, MQA 32/1 page 16
#      at D = 128 / 64 / 256, and GQA 16/2 with 3 query tokens (24 rows).
#   2. (~1 min) the decode GPU tests and the decode sanitizer cases under FA_DECODE_PAIRED=1.
#   3. (~3 min) the whole GPU suite (6 shards) under FA_DECODE_PAIRED=1: everything else runs
#      the default kernels (the switch only lets plans of > 16 rows a kv head take the paired one).
#   4. (~2.5 min, MODE=all) issue 12's "both paths": the prefill GPU tests forced to sm80.
set -u
OUT=${OUT:-/tmp/fa_stop42}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
PR=FA_DECODE_PAIRED=1; PR2=$PR,FA_DECODE_PAIRED_EXTRA_STAGES=2
L="$OUT/dec"; mkdir -p "$L"
for dim in 128 64 256; do
  for defs in "" "$PR" "$PR2"; do
    stamp "32/1 D = $dim page 16 [${defs:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 90 python3 tools/decode_ring_probe.py \
      --rows 64:4096,16:16384,1:32768 --splits 0 --heads 32/1 --dim $dim --page 16 \
      $([ -z "$defs" ] && [ $dim = 128 ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  done
done
for defs in "" "$PR"; do
  stamp "32/1 D = 128 page 256 [${defs:-default}]"
  CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_ring_probe.py \
    --rows 64:4096 --splits 0 --heads 32/1 --dim 128 --page 256 --no-peer 2>&1 | tee -a "$L/probe.txt" | grep "^\["
done
tar -C "$OUT" -czf "$OUT/dec_timing.tgz" dec
DTESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_fp8_decode.py"
stamp "decode tests [$PR]"
CUPY_FLASHATTN_SM90_DEFINES=$PR OUT="$L/tests_paired" PRECOMPILE=0 N=4 PYTEST_TIMEOUT=150 \
  TESTS="$DTESTS" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 6
stamp "sanitizers (decode cases) [$PR]"
CUPY_FLASHATTN_SM90_DEFINES=$PR CASES_K=decode OUT="$L/san" TOOL_TIMEOUT=100 \
  bash tools/sanitize.sh memcheck racecheck synccheck 2>&1 | tail -n 4
tar -C "$OUT" -czf "$OUT/dec_tests.tgz" dec
S="$OUT/suite"; mkdir -p "$S"
stamp "whole GPU suite [$PR]"
CUPY_FLASHATTN_SM90_DEFINES=$PR OUT="$S/default" PYTEST_TIMEOUT=300 bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 9
tar -C "$OUT" -czf "$OUT/suite.tgz" suite
if [ "${MODE:-}" = all ]; then
  stamp "prefill GPU tests forced to sm80"
  CUPY_FLASHATTN_PREFILL_ARCH=sm80 OUT="$S/sm80" PRECOMPILE=0 PYTEST_TIMEOUT=240 SERIAL= \
    TESTS="tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_property.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_api.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
  tar -C "$OUT" -czf "$OUT/suite.tgz" suite
fi
stamp done
