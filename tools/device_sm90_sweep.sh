#!/usr/bin/env bash
# Tuning sweep of the sm90 kernels' compile-time switches (sm90/kernel_traits.cuh), one
# process per variant ($CUPY_FLASHATTN_SM90_DEFINES), sm90 only, no torch.  $VARIANTS: ';'
# separated define lists ("" = defaults); $CHECK: variants whose tests ($CHECK_TESTS, default
# the sm90 edge tests) run too, e.g. CHECK="FA_SM90_PAGED_TMA=1" CHECK_TESTS="tests/gpu/test_sm90_edges.py
# tests/gpu/test_gpu_kernels.py".
set -u
OUT=${OUT:-/tmp/fa_sweep}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/fa_cupy_cache}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
IFS=';' read -ra VS <<< "${VARIANTS:-}"
for v in "${VS[@]}"; do
  stamp "variant '$v'"
  CUPY_FLASHATTN_SM90_DEFINES="$v" timeout 120 python3 tools/quickbench_sm90.py --archs sm90 --no-torch ${ROWS:+--rows "$ROWS"} ${PAGED:+--paged "$PAGED"} 2>&1 | tail -n 8
done
IFS=';' read -ra CS <<< "${CHECK:-}"
for v in "${CS[@]}"; do
  stamp "edge tests '$v'"
  CUPY_FLASHATTN_SM90_DEFINES="$v" timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE ${CHECK_TESTS:-tests/gpu/test_sm90_edges.py} 2>&1 | tail -n 8
done
stamp done
