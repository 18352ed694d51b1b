#!/usr/bin/env bash
# Issue 13's device calls (repo root), logs under $OUT.
#   MODE=suite: precompile -> every `gpu` test (the prefix-range and large-head-dim files too).
#   MODE=bench: precompile -> benchmarks/bench_features.py (prefix ranges, D=512 rows) ->
#               memcheck over small prefix-range and D=512 tests.
set -u
OUT=${OUT:-/tmp/fa_issue13}
MODE=${MODE:-suite}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp "precompile"
python3 tools/precompile_parallel.py 2>&1 | tail -n 1
if [ "$MODE" = suite ]; then
  stamp "pytest -m gpu ${TESTS:-(all)}"
  timeout ${PYTEST_TIMEOUT:-520} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE ${TESTS:-} > "$OUT/pytest.txt" 2>&1
  tail -n 60 "$OUT/pytest.txt" | grep -E "passed|failed|FAILED|ERROR|Error" | tail -n 40
else
  stamp "bench_features"
  timeout 240 python3 benchmarks/bench_features.py --out "$OUT" > "$OUT/bench_features.txt" 2>&1
  tail -n 30 "$OUT/bench_features.txt"
  stamp "memcheck (prefix ranges, D=512; small)"
  timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_gpu_prefix_ranges.py tests/gpu/test_gpu_large_head_dims.py \
    -k "precise or unused or errors or (decode and 64) or softcap or d512" > "$OUT/memcheck.txt" 2>&1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.txt" | tail -n 5
fi
stamp "done"
