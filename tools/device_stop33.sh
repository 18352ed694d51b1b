#!/usr/bin/env bash
# Stop 33's device calls (repo root), logs under $OUT.
#   MODE=verify (default): precompile every kernel, the prefill GPU tests (sm90 on a 9.0 device:
#     edges, persistent schedule, kernels, mixed batches, NaN, API, empty, offsets, prefix
#     ranges, properties, front end), then compute-sanitizer ($TOOLS, default memcheck racecheck).
#   MODE=bench: benchmarks/bench.py bf16 D 64/128/256 S 2k/4k/8k (the benchmark of record's
#     table, CSV and plots into $OUT/results), then quickbench's paged / varlen columns.
#   MODE=rest: every other `gpu` test (decode, float8, float32/64, head dims 384/512, ...).
set -u
OUT=${OUT:-/tmp/fa_stop33}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mode=${MODE:-verify}
PREFILL_TESTS="tests/gpu/test_sm90_edges.py tests/gpu/test_sm90_persistent.py tests/gpu/test_gpu_kernels.py
  tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_api.py tests/gpu/test_gpu_empty.py
  tests/gpu/test_gpu_large_offsets.py tests/gpu/test_gpu_prefix_ranges.py tests/gpu/test_gpu_property.py
  tests/gpu/test_gpu_frontend.py"
if [ "$mode" = verify ] || [ "$mode" = rest ]; then
  stamp "precompile"
  timeout 200 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
fi
if [ "$mode" = verify ]; then
  stamp "pytest: prefill GPU tests"
  timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE $PREFILL_TESTS \
    > "$OUT/pytest_prefill.txt" 2>&1
  grep -E "passed|failed|FAILED|ERROR|Error|Timeout" "$OUT/pytest_prefill.txt" | tail -n 20
  stamp "sanitize"
  OUT="$OUT" TOOL_TIMEOUT=${TOOL_TIMEOUT:-150} bash tools/sanitize.sh ${TOOLS:-memcheck racecheck} 2>&1 | tail -n 8
fi
if [ "$mode" = rest ]; then
  ignore=""; for f in $PREFILL_TESTS; do ignore+=" --ignore=$f"; done
  stamp "pytest: the other GPU tests"
  timeout ${PYTEST_TIMEOUT:-400} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu $ignore \
    > "$OUT/pytest_rest.txt" 2>&1
  grep -E "passed|failed|FAILED|ERROR|Error|Timeout" "$OUT/pytest_rest.txt" | tail -n 20
fi
if [ "$mode" = bench ]; then
  stamp "bench.py"
  mkdir -p "$OUT/results"
  timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/bench.py --dims ${DIMS:-64,128,256} --seqs ${SEQS:-2048,4096,8192} \
    --dtypes ${DTYPES:-bf16} --out "$OUT/results" > "$OUT/bench.txt" 2>&1
  grep -h "^| bf16\|^| fp16" "$OUT/results/h200.md" | cut -c1-200 | head -n 60
  stamp "quickbench: varlen / paged columns"
  timeout 120 python3 tools/quickbench_sm90.py --archs sm90 --no-torch --varlen --paged 16,256 \
    --rows "128,512,0;128,512,1;128,2048,0;128,2048,1;256,2048,0" 2>&1 | tail -n 6
fi
stamp done
