#!/usr/bin/env bash
# Verify the sm90 paged kernels (forced to sm90) for each define variant in $VARIANTS (';'
# separated, "" = defaults): precompile that variant, run every paged / absent-page prefill test
# plus the sm90 edges, then quickbench the paged rows next to dense.  Logs land in $OUT.
set -u
OUT=${OUT:-/tmp/fa_paged}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/fa_cupy_cache}
export CUPY_FLASHATTN_PREFILL_ARCH=sm90
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
IFS=';' read -ra VS <<< "${VARIANTS:-}"
[ ${#VS[@]} -eq 0 ] && VS=("")
i=0
for v in "${VS[@]}"; do
  i=$((i+1)); export CUPY_FLASHATTN_SM90_DEFINES="$v"
  stamp "variant $i '$v': precompile"
  timeout 200 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
  stamp "variant $i: paged tests (sm90 forced)"
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -rfE -x \
    tests/gpu/test_sm90_edges.py tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_mixed.py \
    -k "${TEST_K:-paged or absent or pages or cache or sm90_edges or mixed}" > "$OUT/paged_tests_$i.txt" 2>&1
  grep -E "passed|failed|FAILED|ERROR" "$OUT/paged_tests_$i.txt" | tail -n 8
  stamp "variant $i: quickbench"
  timeout 150 python3 tools/quickbench_sm90.py --archs sm90 --no-torch ${ROWS:+--rows "$ROWS"} --paged ${PAGED:-16,256} 2>&1 | tail -n 8
done
stamp done
