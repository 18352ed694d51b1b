#!/usr/bin/env bash
# Stop 42's last device call (repo root, logs under $OUT): the decode defaults as they land --
# 32-key tiles at D = 128 for at most 16 packed rows a kv head (DecodeKey.tile), an empty split
# storing O = 0 -- verified and measured.
#   1. (~1 min) the decode, float8, front-end and mixed-batch GPU tests (5 shards) + large offsets.
#   2. (~0.5 min) all four sanitizers on every sanitize case.
#   3. (~0.5 min) kernel time, GQA 32/8 and MQA 32/1, D = 128, page 16: default against
#      FA_DECODE_TILE32=0 (the 16-key kernel everywhere), cuDNN beside.
#   4. (~3 min) benchmarks/bench_decode.py (issue 16's benchmark: one call, back to back, graph,
#      kernel; bf16 and float8 caches; torch flash / cuDNN in the same process).
set -u
OUT=${OUT:-/tmp/fa_stop42f}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
L="$OUT/dec"; mkdir -p "$L"
stamp "decode tests [default]"
OUT="$L/tests" PRECOMPILE=0 N=5 PYTEST_TIMEOUT=150 \
  TESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_fp8_api.py tests/gpu/test_gpu_frontend.py tests/gpu/test_gpu_mixed.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
stamp "sanitizers, every case"
OUT="$L/san" TOOL_TIMEOUT=120 bash tools/sanitize.sh 2>&1 | tail -n 6
tar -C "$OUT" -czf "$OUT/dec_tests.tgz" dec
for heads in 32/8 32/1; do
  for defs in "" "FA_DECODE_TILE32=0"; do
    stamp "$heads D = 128 page 16 [${defs:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 90 python3 tools/decode_ring_probe.py \
      --rows 64:4096,16:16384,1:4096,1:32768 --splits 0 --heads $heads --dim 128 --page 16 \
      $([ -z "$defs" ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  done
done
stamp "bench_decode.py"
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_decode.py --rows 1:4096,1:32768,16:16384,64:4096 \
  --heads 32/8,32/1 --pages 16,256 --kv bf16,fp8 --out "$OUT/bd" > "$L/bench_decode.txt" 2>&1
tail -n 5 "$L/bench_decode.txt"
tar -C "$OUT" -czf "$OUT/dec_all.tgz" dec bd 2>/dev/null
stamp done
