#!/usr/bin/env bash
# Compile-time kernel switches (CUPY_FLASHATTN_SM90_DEFINES, e.g. FA_SM90_PV_WIDE=0) judged in
# one device call, from the repository root:
#   1. correctness: the GPU tests that run the sm90 prefill and split-KV kernels, built with
#      every switch of $SETS at once (its own kernel cache), 8 shards;
#   2. speed: tools/quickbench_sm90.py (sm90 column, back to back) for the default build and
#      each switch set, one process per set, the sets alternating for $ROUNDS passes so that
#      clock / power drift shows as spread rather than as a difference.
#   OUT=$OUT SETS="FA_SM90_TRIMS_MIN_D=64;FA_SM90_TRIMS_MIN_D=64,FA_SM90_WAIT_HINT_NS=0" \
#     bash tools/device_switch_ab.sh
# SETS: ";"-separated switch sets (a set may hold several, comma-separated); ROWS: quickbench
# rows (default: issue 12's S = 2k rows and D = 128 S = 8k); ROUNDS (default 2); PAGED (quickbench
# --paged, default 16); SKIP_TESTS=1 times only, SKIP_BENCH=1 tests only; PRECOMPILE_ONLY (precompile_parallel.py --only)
# builds each set's kernels in parallel first.  Logs: $OUT/tests/, $OUT/qb_<set>_<round>.txt;
# prints each shard's summary and a table of TFLOP/s per row and set.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/fa_switch_ab}; mkdir -p "$OUT"
. tools/device_env.sh
SETS=${SETS:-FA_SM90_TRIMS_MIN_D=64;FA_SM90_TRIMS_MIN_D=64,FA_SM90_WAIT_HINT_NS=0;FA_SM90_TRIMS_MIN_D=64,FA_SM90_DESC_ADD=0}
ROWS=${ROWS:-128,2048,0;64,2048,1;256,2048,0;128,8192,0}
IFS=';' read -ra SET_LIST <<< "$SETS"
all=$(IFS=,; echo "${SET_LIST[*]}")
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  stamp "GPU tests with $all"
  CUPY_FLASHATTN_SM90_DEFINES="$all" CUPY_CACHE_DIR=/tmp/fa_cache_switch_all OUT="$OUT/tests" N=8 \
    SERIAL= PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-240} \
    TESTS="tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_property.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_api.py tests/gpu/test_sm90_edges.py tests/gpu/test_sm90_persistent.py tests/gpu/test_decode_sm90.py tests/gpu/test_gpu_precise.py tests/gpu/test_gpu_empty.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 12
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
if [ -n "${PRECOMPILE_ONLY:-}" ]; then  # e.g. 'fa_fwd_sm90_bf16_d64$,_d128_paged': every set's at once
  stamp "precompile $PRECOMPILE_ONLY for every set"
  for s in default "${SET_LIST[@]}"; do
    defs=$s; [ "$s" = default ] && defs=
    tag=$(echo "$s" | tr -c 'A-Za-z0-9\n' '_')
    CUPY_FLASHATTN_SM90_DEFINES="$defs" CUPY_CACHE_DIR="/tmp/fa_cache_$tag" timeout 240 \
      python3 tools/precompile_parallel.py --jobs "${PRECOMPILE_JOBS:-4}" --no-decode \
      --only "$PRECOMPILE_ONLY" > "$OUT/precompile_$tag.txt" 2>&1 &
  done
  wait
  stamp "precompiled: $(cat "$OUT"/precompile_*.txt | grep -c precompiled) sets"
fi
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
  for s in default "${SET_LIST[@]}"; do
    defs=$s; [ "$s" = default ] && defs=
    tag=$(echo "$s" | tr -c 'A-Za-z0-9\n' '_')
    stamp "quickbench $s (round $r)"
    CUPY_FLASHATTN_SM90_DEFINES="$defs" CUPY_CACHE_DIR="/tmp/fa_cache_$tag" \
      timeout "${QB_TIMEOUT:-90}" python3 tools/quickbench_sm90.py --rows "$ROWS" --archs sm90 --no-torch \
      --paged "${PAGED:-16}" > "$OUT/qb_${tag}_$r.txt" 2>&1 || echo "  quickbench $s failed (see qb_${tag}_$r.txt)"
  done
done
stamp "table (TFLOP/s of the sm90 column per row; rounds side by side)"
for s in default "${SET_LIST[@]}"; do
  tag=$(echo "$s" | tr -c 'A-Za-z0-9\n' '_')
  echo "== $s"
  cat "$OUT"/qb_"${tag}"_*.txt 2>/dev/null | grep -E "^D[0-9]+ S" | sort | uniq
done
