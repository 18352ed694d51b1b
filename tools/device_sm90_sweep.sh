#!/usr/bin/env bash
# A development call for the sm90 family: per variant, precompile it (parallel NVRTC) and time
# it with tools/quickbench_sm90.py; for the variants in $CHECK, also run the prefill GPU tests
# with sm90 forced.  Logs under $OUT.
#   VARIANTS  ';' separated; each "DEFINES" or "DEFINES|GRID": the tuning switches of
#             sm90/kernel_traits.cuh ($CUPY_FLASHATTN_SM90_DEFINES, "" = defaults) and the grid
#             mode ($CUPY_FLASHATTN_SM90_GRID: persistent, tiles, ctas=N).  Default: "".
#   CHECK     variants (same syntax) whose tests run: $TESTS (default the sm90 edges, the
#             prefill kernel tests, mixed batches and NaN), filtered by $TEST_K (pytest -k).
#   TORCH=1   torch's flash / cuDNN columns beside the first variant.  ROWS, PAGED: quickbench's.
# Examples: the paged A/B of 2026-12-04 (NOTES.md sm90 v6):
#   VARIANTS=";FA_SM90_PAGED_TMA=0" CHECK=";FA_SM90_PAGED_TMA=0" PAGED=16,256 \
#     TEST_K="paged or absent or pages or cache or sm90_edges or mixed" bash tools/device_sm90_sweep.sh
# and its persistent-vs-tiles A/B (sm90 v7): VARIANTS="|tiles;|persistent" TORCH=1 PAGED=16,256
set -u
OUT=${OUT:-/tmp/fa_sweep}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"

use_variant() {  # "DEFINES|GRID" -> the two environment variables
  local v=$1
  export CUPY_FLASHATTN_SM90_DEFINES="${v%%|*}"
  if [[ $v == *"|"* ]]; then export CUPY_FLASHATTN_SM90_GRID="${v#*|}"; else unset CUPY_FLASHATTN_SM90_GRID; fi
}

IFS=';' read -ra VS <<< "${VARIANTS:-}"
[ ${#VS[@]} -eq 0 ] && VS=("")
IFS=';' read -ra CS <<< "${CHECK:-__none__}"
first=1
i=0
for v in "${VS[@]}"; do
  i=$((i + 1)); use_variant "$v"
  stamp "variant $i '$v': precompile"
  timeout 200 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
  for c in "${CS[@]}"; do
    [ "$c" = "$v" ] || continue
    stamp "variant $i: prefill tests, sm90 forced"
    CUPY_FLASHATTN_PREFILL_ARCH=sm90 timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -rfE \
      ${TESTS:-tests/gpu/test_sm90_edges.py tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_nan.py} \
      ${TEST_K:+-k "$TEST_K"} > "$OUT/tests_$i.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|Error" "$OUT/tests_$i.txt" | tail -n 15
  done
  stamp "variant $i: quickbench"
  torch=--no-torch; [ "${TORCH:-0}" = 1 ] && [ $first = 1 ] && torch=
  timeout 150 python3 tools/quickbench_sm90.py --archs sm90 $torch ${ROWS:+--rows "$ROWS"} \
    ${PAGED:+--paged "$PAGED"} 2>&1 | tail -n 8
  first=0
done
stamp done
