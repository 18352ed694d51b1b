#!/usr/bin/env bash
# The float32 / float64 kernels' device call (issue 14): every shipped kernel compiled in
# parallel, the precise GPU tests plus the suites that run float32 through the public API, then
# bench_precise.py.  Logs under /tmp/fa_p come back as $OUT/precise.tgz plus a summary.
# Environment: TEST_TIMEOUT, BENCH_TIMEOUT, BENCH_ARGS (bench_precise.py options).
set -u
OUT=${OUT:-/tmp/fa_out}; W=/tmp/fa_p; mkdir -p "$OUT" "$W"
. "$(dirname "$0")/device_env.sh"
{
stamp "precompile"
timeout 240 python3 tools/precompile_parallel.py 2>&1 | tail -n 2
stamp "tests"
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_gpu_precise.py \
  tests/gpu/test_gpu_api.py > "$W/pytest.txt" 2>&1
grep -E "passed|failed|FAILED|ERROR" "$W/pytest.txt" | tail -n 30
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_gpu_kernels.py -k "float32" > "$W/pytest_f32.txt" 2>&1
grep -E "passed|failed|FAILED|ERROR" "$W/pytest_f32.txt" | tail -n 10
stamp "bench"
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_precise.py --out "$W/bench" ${BENCH_ARGS:-} > "$W/bench.txt" 2>&1
tail -n 45 "$W/bench.txt"
stamp "done"
} 2>&1 | tee "$W/summary.txt"
tar czf "$OUT/precise.tgz" -C "$W" . 2>/dev/null
cp "$W/summary.txt" "$OUT/summary.txt"
