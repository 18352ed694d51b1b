#!/usr/bin/env bash
# Stop 45's second device call (repo root, logs under $OUT, one archive $OUT/s45.tgz), after
# tools/device_stop44_final.sh ran the whole GPU suite on the same code:
#   1. (~5 min) issue 12's verification minus the suite: tools/device_verify_sm90.sh STEPS=ebzp
#      (the CPU-marked tests that run kernels, the prefill tests forced to sm80, the four
#      sanitizers on every case, bench.py D 64 / 128 / 256 x S 2k / 4k / 8k, bf16 + fp16).
#   2. the D = 64 kernels on three consumer warpgroups (FA_SM90_WGS_64=3, 192 x 80 tiles): the
#      prefill GPU tests in 8 shards under the switch, then quickbench D = 64 with and without
#      it, twice, alternating (a define: one process per build).
set -u
OUT=${OUT:-/tmp/fa_s45}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
L="$OUT/s45"; mkdir -p "$L"
stamp "verify (extra, sm80, sanitizers, bench)"
OUT="$L/verify" STEPS=${STEPS:-ebzp} SAN_TIMEOUT=150 BENCH_TIMEOUT=200 bash tools/device_verify_sm90.sh 2>&1 | tail -n 30
QB_ROWS="64,2048,0;64,2048,1;64,4096,0;64,4096,1;64,8192,0;64,8192,1"
stamp "FA_SM90_WGS_64=3: prefill GPU tests (8 shards)"
CUPY_FLASHATTN_SM90_DEFINES=FA_SM90_WGS_64=3 CUPY_CACHE_DIR=/tmp/fa_cache_wgs3 OUT="$L/wgs3_tests" N=8 \
  SERIAL= PYTEST_TIMEOUT=150 \
  TESTS="tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_property.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_api.py tests/gpu/test_sm90_edges.py tests/gpu/test_sm90_persistent.py tests/gpu/test_decode_sm90.py tests/gpu/test_gpu_prefix_ranges.py tests/gpu/test_gpu_empty.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 12
for r in 1 2; do
  for v in 2 3; do
    stamp "quickbench D = 64, FA_SM90_WGS_64=$v (round $r)"
    CUPY_FLASHATTN_SM90_DEFINES=FA_SM90_WGS_64=$v CUPY_CACHE_DIR=/tmp/fa_cache_wgs$v timeout 90 \
      python3 tools/quickbench_sm90.py --rows "$QB_ROWS" --paged 16 --varlen > "$L/qb_wgs${v}_r$r.txt" 2>&1
    tail -n 9 "$L/qb_wgs${v}_r$r.txt"
  done
done
tar -C "$OUT" -czf "$OUT/s45.tgz" s45
stamp done
