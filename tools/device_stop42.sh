#!/usr/bin/env bash
# (Record of stop 42's run 4, at e69a7d7.  FA_DECODE_TILE32_D128 has since become the
# 32-key D = 128 kernel of DecodeKey.tile, chosen by the plan; the define no longer exists.)
# Stop 42's device call after the paired-kernel run, repo root, logs under $OUT (tarred per part).
#   1. (~1 min) FA_DECODE_TILE32_D128 (32-key warp tiles at D = 128, one CTA of 4 warps per SM;
#      2 ring slots, and 3 with FA_DECODE_TILE32_STAGES=3) against the default: MQA 32/1 and
#      GQA 32/8, page 16 (and 256), B = 64 ctx 4096, B = 16 ctx 16384, B = 1 ctx 32768.
#   2. (~1.5 min) the decode GPU tests under the default (an empty split now stores O = 0) and
#      under the switch.
#   3. (~1 min) all four sanitizers on every sanitize case (default: initcheck reported the
#      merge's loads of never-written O before), memcheck / racecheck of the decode cases under
#      the switch.
set -u
OUT=${OUT:-/tmp/fa_stop42}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
T32=FA_DECODE_TILE32_D128=1; T33=$T32,FA_DECODE_TILE32_STAGES=3
L="$OUT/dec"; mkdir -p "$L"
for heads in 32/1 32/8; do
  for defs in "" "$T32" "$T33"; do
    stamp "$heads D = 128 page 16 [${defs:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 90 python3 tools/decode_ring_probe.py \
      --rows 64:4096,16:16384,1:32768 --splits 0 --heads $heads --dim 128 --page 16 \
      $([ -z "$defs" ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  done
done
for defs in "" "$T32"; do
  stamp "32/1 + 32/8 D = 128 page 256 [${defs:-default}]"
  for heads in 32/1 32/8; do
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 60 python3 tools/decode_ring_probe.py \
      --rows 64:4096 --splits 0 --heads $heads --dim 128 --page 256 --no-peer 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  done
done
tar -C "$OUT" -czf "$OUT/dec_timing.tgz" dec
DTESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_fp8_api.py tests/gpu/test_gpu_frontend.py tests/gpu/test_gpu_mixed.py"
for defs in "" "$T32"; do
  stamp "decode tests [${defs:-default}]"
  CUPY_FLASHATTN_SM90_DEFINES=$defs OUT="$L/tests_${defs:+t32}" PRECOMPILE=0 N=5 PYTEST_TIMEOUT=150 \
    TESTS="$DTESTS" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
done
tar -C "$OUT" -czf "$OUT/dec_tests.tgz" dec
stamp "sanitizers, every case [default]"
OUT="$L/san" TOOL_TIMEOUT=120 bash tools/sanitize.sh 2>&1 | tail -n 6
stamp "sanitizers (decode cases) [$T32]"
CUPY_FLASHATTN_SM90_DEFINES=$T32 CASES_K=decode OUT="$L/san32" TOOL_TIMEOUT=100 \
  bash tools/sanitize.sh memcheck racecheck initcheck 2>&1 | tail -n 5
tar -C "$OUT" -czf "$OUT/dec_all.tgz" dec
stamp done
