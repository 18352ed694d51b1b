#!/usr/bin/env bash
# One development call for the sm90 family: precompile, the prefill GPU tests forced to sm90
# ($TESTS, $TEST_K), then quickbench per define variant ($VARIANTS, ';' separated, "" =
# defaults; the first with torch beside it) with paged rows ($PAGED).  Logs land in $OUT.
set -u
OUT=${OUT:-/tmp/fa_check}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/fa_cupy_cache}
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
stamp "precompile"
timeout 200 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
stamp "prefill tests, sm90 forced"
CUPY_FLASHATTN_PREFILL_ARCH=sm90 timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -rfE \
  ${TESTS:-tests/gpu/test_sm90_edges.py tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_nan.py} \
  ${TEST_K:+-k "$TEST_K"} > "$OUT/tests.txt" 2>&1
grep -E "passed|failed|FAILED|ERROR|Error" "$OUT/tests.txt" | tail -n 15
IFS=';' read -ra VS <<< "${VARIANTS:-}"
[ ${#VS[@]} -eq 0 ] && VS=("")
first=1
for v in "${VS[@]}"; do
  stamp "quickbench '$v'"
  CUPY_FLASHATTN_SM90_DEFINES="$v" timeout 150 python3 tools/quickbench_sm90.py --archs sm90 \
    $([ $first -eq 1 ] || echo --no-torch) ${ROWS:+--rows "$ROWS"} ${PAGED:+--paged "$PAGED"} 2>&1 | tail -n 8
  first=0
done
stamp done
