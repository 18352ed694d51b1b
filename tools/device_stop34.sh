#!/usr/bin/env bash
# Stop 34's device calls (repo root), logs under $OUT.
#   MODE=f32 (default): the Hopper float32 path (float16 planes, issue 14): its GPU tests and the
#     float32 cases of test_gpu_precise.py (which run on it on a 9.0 device), then
#     benchmarks/bench_precise.py float32 rows (D $DIMS, S $SEQS) beside torch's
#     memory-efficient SDPA and our sm80 3xTF32 kernel, same process.
#   MODE=f32bench / f32test: only the benchmark / the tests.
#   MODE=suite: the whole GPU suite in parallel shards (tools/gpu_suite_parallel.sh);
#     MODE=verify: the suite, compute-sanitizer ($TOOLS, default memcheck racecheck), then
#     MODE=precise's benchmark.
#   MODE=precise: benchmarks/bench_precise.py as `make bench` runs it (float32 + float64).
#   MODE=f32chains: FA_SM90_F32_S_CHAINS=2 against the default, speed and error.
set -u
OUT=${OUT:-/tmp/fa_stop34}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mode=${MODE:-f32}
if [ "$mode" = f32 ] || [ "$mode" = f32test ]; then
  stamp "pytest: float32 planes + precise"
  timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -x \
    tests/gpu/test_gpu_f32_planes.py tests/gpu/test_gpu_precise.py > "$OUT/pytest_f32.txt" 2>&1
  tail -n 3 "$OUT/pytest_f32.txt"; grep -m 20 -E "FAILED|Error|error" "$OUT/pytest_f32.txt"
fi
if [ "$mode" = f32 ] || [ "$mode" = f32bench ]; then
  stamp "bench_precise float32"
  mkdir -p "$OUT/results"
  timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_precise.py --dtypes f32 \
    --dims ${DIMS:-64,128} --seqs ${SEQS:-1024,4096} --out "$OUT/results" 2>&1 | tee "$OUT/bench_precise.txt" | grep -v "^#"
fi
if [ "$mode" = suite ] || [ "$mode" = verify ]; then
  OUT="$OUT" bash tools/gpu_suite_parallel.sh
fi
if [ "$mode" = verify ]; then
  stamp "sanitize"
  OUT="$OUT" TOOL_TIMEOUT=${TOOL_TIMEOUT:-150} bash tools/sanitize.sh ${TOOLS:-memcheck racecheck} 2>&1 | tail -n 8
fi
if [ "$mode" = precise ] || [ "$mode" = verify ]; then
  stamp "bench_precise (float32 and float64, the benchmark of record)"
  mkdir -p "$OUT/results"
  timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_precise.py --out "$OUT/results" \
    --dtypes ${PRECISE_DTYPES:-f32,f64} --seqs ${PRECISE_SEQS:-1024,4096,16384} 2>&1 \
    | tee "$OUT/bench_precise.txt" | grep -v "^#"
fi
if [ "$mode" = f32chains ]; then
  # FA_SM90_F32_S_CHAINS=2's speed (its error: tools/f32_error_probe.py --gpu) against the default.
  for v in "" "FA_SM90_F32_S_CHAINS=2"; do
    stamp "bench_precise f32 D128 S4k '${v:-default}'"
    CUPY_FLASHATTN_SM90_DEFINES="$v" timeout 90 python3 benchmarks/bench_precise.py --dtypes f32 \
      --dims 128 --seqs 4096 --out "$OUT/chains${v:+_2}" 2>&1 | grep "ours "
    CUPY_FLASHATTN_SM90_DEFINES="$v" timeout 60 python3 tools/f32_error_probe.py --gpu 2>&1 | tail -n 6
  done
fi
stamp done
