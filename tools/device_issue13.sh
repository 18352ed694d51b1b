#!/usr/bin/env bash
# Issue 13's device call (repo root): precompile -> the prefix-range GPU tests -> the
# prefix-range benchmark rows (benchmarks/bench_features.py) -> memcheck over a small set of
# the prefix-range tests -> the whole GPU suite.  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/fa_issue13}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp "precompile"
python3 tools/precompile_parallel.py 2>&1 | tail -n 1
stamp "prefix-range tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_gpu_prefix_ranges.py ${EXTRA_TESTS:-} > "$OUT/pytest_issue13.txt" 2>&1
tail -n 30 "$OUT/pytest_issue13.txt" | grep -E "passed|failed|FAILED|ERROR|Error" | tail -n 20
stamp "bench_features"
timeout 150 python3 benchmarks/bench_features.py --out "$OUT" > "$OUT/bench_features.txt" 2>&1
cat "$OUT/bench_features.txt" | tail -n 20
stamp "memcheck (prefix ranges, small)"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_gpu_prefix_ranges.py -k "precise or unused or errors or (decode and 64)" > "$OUT/memcheck.txt" 2>&1
grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.txt" | tail -n 5
if [ "${FULL:-1}" = 1 ]; then
  stamp "pytest -m gpu (all)"
  timeout ${PYTEST_TIMEOUT:-260} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE > "$OUT/pytest.txt" 2>&1
  tail -n 40 "$OUT/pytest.txt" | grep -E "passed|failed|FAILED|ERROR|Error" | tail -n 30
fi
stamp "done"
