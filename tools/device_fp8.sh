#!/usr/bin/env bash
# Float8 decode on the device (issue 16), repo root, logs under $OUT: the float8 GPU tests
# (launcher level and through the public API), then bench_decode's bf16 / fp8 / fp8_e5m2 rows
# ($ROWS, default the issue's bandwidth rows and a B = 1 latency row; pages 16 and 256).
# About 60 s of device time on a warm machine.
set -u
OUT=${OUT:-/tmp/fa_fp8}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp "float8 tests"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_gpu_fp8_decode.py \
  tests/gpu/test_gpu_fp8_api.py tests/test_fp8_cache.py > "$OUT/pytest_fp8.txt" 2>&1
tail -n 3 "$OUT/pytest_fp8.txt"; grep FAILED "$OUT/pytest_fp8.txt" | head -n 20
stamp "bench_decode bf16 / fp8"
timeout 240 python3 benchmarks/bench_decode.py --rows "${ROWS:-64:4096,16:16384,1:4096}" \
  --heads 32/8 --pages 16,256 --kv "${KV:-bf16,fp8,fp8_e5m2}" --out "$OUT/bd" \
  > "$OUT/bench_decode.txt" 2>&1
grep -E "^\| [0-9]" "$OUT/bench_decode.txt" | cut -d'|' -f2-8,16,17,18,19
stamp "done"
