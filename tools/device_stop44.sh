#!/usr/bin/env bash
# Stop 44, first call (repo root, logs under $OUT): stop 43's verification, the combine
# kernel's fast path (merge_split_partials for float32 partials), and the swapped MQA decode's
# split count with it.
#   1. (~3 min) device_stop43_verify.sh: compile, test_decode_sm90 + every GPU test with 256 in
#      its id, bench_decode MQA rows.
#   2. (~1.5 min) the GPU test files that split or merge (the combine kernel changed).
#   3. (~1 min) kernel time of the swapped MQA decode (32/1, D = 128, page 16) at forced split
#      counts 8 .. 128 (the old cap was 32, set by the old combine's one split per round trip).
#   4. (~1.5 min) device_stop43_probe.sh: page 16 against 256, a 3-stage ring.
set -u
OUT=${OUT:-/tmp/fa_stop44}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
OUT="$OUT" bash tools/device_stop43_verify.sh 2>&1 | tail -n 24
L="$OUT/s44"; mkdir -p "$L"
stamp "split sweep"
timeout 150 python3 tools/decode_ring_probe.py --rows 1:4096,1:32768,4:8192,16:16384 \
  --splits 0,8,16,32,64,128 --heads 32/1 --dim 128 --page 16 > "$L/split_sweep.txt" 2>&1
grep "^\[" "$L/split_sweep.txt" | tail -n 40
stamp "host profile"
timeout 90 python3 tools/profile_host.py --profile --out "$L" > "$L/profile_host.txt" 2>&1
grep -E "^(decode|torch|PagedKV)" "$L/profile_host.txt"
stamp "combine tests"
OUT="$L/tests_combine" PRECOMPILE=0 N=8 PYTEST_TIMEOUT=150 SERIAL="" \
  TESTS="tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_empty.py tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_frontend.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_property.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 10
stamp "ring probe"
OUT="$L" timeout 150 bash tools/device_stop43_probe.sh 2>&1 | tail -n 16
tar -C "$OUT" -czf "$OUT/s44.tgz" s44
stamp done
