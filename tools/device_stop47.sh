#!/usr/bin/env bash
# Stop 47's device call (repo root): the kernel switches judged and tested in one call.
#   1. (background, nice 19) every shipped kernel built with $TEST_SET, for step 3;
#   2. tools/device_switch_ab.sh timing: default and each set of $SETS (quickbench, sm90
#      column, alternating rounds) -- the background compile uses only CPU, the timing is of
#      back-to-back calls whose host work runs ahead of the GPU;
#   3. the sm90 GPU tests (device_switch_ab.sh's list) built with $TEST_SET, 8 shards.
#   OUT=$OUT bash tools/device_stop47.sh
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/fa_stop47}; mkdir -p "$OUT"
. tools/device_env.sh
A3=FA_SM90_WAIT_HINT_NS=10000000,FA_SM90_PV_WIDE=1,FA_SM90_DESC_ADD=1
SETS=${SETS:-$A3;$A3,FA_SM90_EXP_POLY=4;$A3,FA_SM90_EXP_POLY=8}
TEST_SET=${TEST_SET:-$A3,FA_SM90_EXP_POLY=4}
TEST_CACHE=/tmp/fa_cache_stop47_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
CUPY_FLASHATTN_SM90_DEFINES="$TEST_SET" CUPY_CACHE_DIR=$TEST_CACHE nice -n 19 timeout 400 \
  python3 tools/precompile_parallel.py --jobs 8 > "$OUT/precompile_tests.txt" 2>&1 &
pre=$!
OUT="$OUT/ab" SETS="$SETS" SKIP_TESTS=1 ROUNDS=${ROUNDS:-2} PAGED=16 \
  ROWS=${ROWS:-128,2048,0;64,2048,1;64,2048,0;256,2048,0;128,8192,0} \
  PRECOMPILE_ONLY='fa_fwd_sm90_bf16_d64$,fa_fwd_sm90_bf16_d64_paged$,fa_fwd_sm90_bf16_d128$,fa_fwd_sm90_bf16_d128_paged$,fa_fwd_sm90_bf16_d128_wide$,fa_fwd_sm90_bf16_d256$,fa_fwd_sm90_bf16_d256_paged$' \
  bash tools/device_switch_ab.sh 2>&1 | tail -n 60
stamp "waiting for the test build"
wait $pre; tail -n 1 "$OUT/precompile_tests.txt"
stamp "GPU tests with $TEST_SET"
CUPY_FLASHATTN_SM90_DEFINES="$TEST_SET" CUPY_CACHE_DIR=$TEST_CACHE OUT="$OUT/tests" N=8 PRECOMPILE=0 \
  SERIAL= PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-200} \
  TESTS="$(grep -o 'TESTS="[^"]*"' tools/device_switch_ab.sh | head -n 1 | cut -d'"' -f2)" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 14
stamp "end"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv
