#!/usr/bin/env bash
# Stop 31's device calls (repo root), logs under $OUT.  Every mode precompiles first.
#   MODE=quick (default): the sm90 schedule / paged GPU tests ($TESTS, $TEST_K a pytest -k),
#     quickbench rows with varlen and paged columns (dense vs the dynamic schedule, paged 16 /
#     256 TMA) per $VARIANTS of the sm90 tuning switches ("default" = none), then
#     bench.py's S = 512 rows (issue 15's paged row: one call and kernel only).
#   MODE=full: every `gpu` test.
#   MODE=bench: bench.py's S = 512 rows, then issue 15's decode rows (bench_decode.py) and its
#     varlen row (bench_varlen.py).
#   MODE=verify: MODE=bench's rows, then every `gpu` test (issue 15 asks for all from one run).
set -u
OUT=${OUT:-/tmp/fa_stop31}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
stamp "precompile"
python3 tools/precompile_parallel.py 2>&1 | tail -n 1
mode=${MODE:-quick}
bench() {
  stamp "bench prefill S=512 (dense, varlen, paged16, paged256)"
  timeout 150 python3 benchmarks/bench.py --dims 128 --seqs 512 --dtypes bf16 --out /tmp/b512 \
    > "$OUT/bench512.txt" 2>&1
  cp /tmp/b512/*.md "$OUT/" 2>/dev/null; grep -h "^| bf16" "$OUT"/*.md
  [ "$mode" = quick ] && return
  stamp "bench_decode"
  timeout 150 python3 benchmarks/bench_decode.py --rows 64:4096,16:16384,1:512 --heads 32/8 \
    --pages 16 --out /tmp/bd > "$OUT/bench_decode.txt" 2>&1
  tail -n 12 "$OUT/bench_decode.txt"
  stamp "bench_varlen"
  timeout 120 python3 benchmarks/bench_varlen.py --out /tmp/bv > "$OUT/bench_varlen.txt" 2>&1
  tail -n 8 "$OUT/bench_varlen.txt"
}
if [ "$mode" = bench ] || [ "$mode" = verify ]; then bench; fi
if [ "$mode" = full ] || [ "$mode" = quick ] || [ "$mode" = verify ]; then
  stamp "pytest ($mode)"
  if [ "$mode" != quick ]; then TESTS=""; else
    TESTS=${TESTS:-tests/gpu/test_sm90_persistent.py tests/gpu/test_sm90_edges.py}; fi
  timeout ${PYTEST_TIMEOUT:-420} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE $TESTS ${TEST_K:+-k "$TEST_K"} \
    > "$OUT/pytest.txt" 2>&1
  tail -n 40 "$OUT/pytest.txt" | grep -E "passed|failed|FAILED|ERROR|Error|Timeout" | tail -n 20
fi
if [ "$mode" = quick ]; then
  stamp "quickbench (TFLOP/s, back to back)"
  ROWS=${ROWS:-"128,512,0;128,512,1;128,2048,0;128,4096,1"} bash "$(dirname "$0")/diag_stop31.sh" \
    2>&1 | tee -a "$OUT/quickbench.txt" | tail -n 16
fi
if [ "$mode" = quick ]; then bench; fi
stamp "done"
