#!/usr/bin/env bash
# Device run for the Hopper path: precompile both families, the sm90 edge tests, the GPU suite
# on the default (auto: sm90 on a 9.0 device) path and, with BOTH=1, again forced to sm80; then
# the quick sm80 / sm90 / torch comparison.  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/fa_sm90}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
stamp "precompile"
timeout 300 python3 tools/precompile_parallel.py > "$OUT/precompile.txt" 2>&1; tail -n 3 "$OUT/precompile.txt"
stamp "pytest sm90 ${TESTS:-tests/gpu/test_sm90_edges.py}"
timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider -rfE ${TESTS:-tests/gpu/test_sm90_edges.py} > "$OUT/pytest_sm90.txt" 2>&1
grep -E "passed|failed|FAILED|ERROR|Error|error" "$OUT/pytest_sm90.txt" | tail -n 25
if [ "${BOTH:-0}" = 1 ]; then
  stamp "pytest sm80 ${TESTS80:-tests/gpu}"
  CUPY_FLASHATTN_PREFILL_ARCH=sm80 timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rfE ${TESTS80:-tests/gpu} > "$OUT/pytest_sm80.txt" 2>&1
  grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest_sm80.txt" | tail -n 15
fi
if [ "${BENCH:-1}" = 1 ]; then
  stamp "quick bench"
  timeout 200 python3 tools/quickbench_sm90.py > "$OUT/bench.txt" 2>&1; cat "$OUT/bench.txt" | tail -n 20
fi
stamp "done"
