#!/usr/bin/env bash
# Stop 43, a short verification (repo root, logs under $OUT) when the device time left cannot
# hold device_stop43_final.sh: what changed after run 3.
#   1. (~20 s) compile the split kernels, the D = 256 softcap / ALiBi paged prefill kernels (the
#      only prefill cubins skip_tiles' fix changed) and the decode kernels.
#   2. (~1.5 min) every GPU test with 256 in its id (D = 256, the 200 -> 256 bucket, page 256)
#      and tests/gpu/test_decode_sm90.py (its graph-replay test's table fixed after run 3).
#   3. (~15 s) bench_decode.py MQA 32/1 rows, page 16 (its kernel-only column now replays the
#      front end's plan: the swapped kernel).
set -u
OUT=${OUT:-/tmp/fa_stop43v}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
L="$OUT/s43v"; mkdir -p "$L"
stamp "compile"
timeout 100 python3 tools/precompile_parallel.py --only sm90_bf16_d256,sm90_f16_d256,_split 2>&1 | tail -n 2
stamp "tests"
OUT="$L/tests_swapped" PRECOMPILE=0 N=4 PYTEST_TIMEOUT=60 SERIAL="" TESTS="tests/gpu/test_decode_sm90.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 6
OUT="$L/tests_256" PRECOMPILE=0 N=8 PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-100} SERIAL="" TESTS="tests" \
  PYTEST_ARGS="-k 256" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 10
stamp "bench_decode.py MQA"
timeout 45 python3 benchmarks/bench_decode.py --rows 1:4096,1:32768,16:16384,64:4096 \
  --heads 32/1 --pages 16 --kv bf16 --out "$L/bd" > "$L/bench_decode.txt" 2>&1
tail -n 6 "$L/bench_decode.txt"
tar -C "$OUT" -czf "$OUT/s43v.tgz" s43v
stamp done
