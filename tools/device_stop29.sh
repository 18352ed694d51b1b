#!/usr/bin/env bash
# Stop 29's device calls (repo root), logs under $OUT.
#   MODE=suite: precompile -> every `gpu` test -> the issue-15 rows (decode B=64 / B=1,
#               paged S=512 prefill) if time is left.
#   MODE=bench: precompile -> the issue-15/16 decode and paged-prefill rows only.
set -u
OUT=${OUT:-/tmp/fa_stop29}
MODE=${MODE:-suite}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
stamp "precompile"
python3 tools/precompile_parallel.py 2>&1 | tail -n 1
if [ "$MODE" = suite ]; then
  stamp "pytest -m gpu ${TESTS:-(all)}"
  timeout ${PYTEST_TIMEOUT:-450} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE ${TESTS:-} > "$OUT/pytest.txt" 2>&1
  tail -n 60 "$OUT/pytest.txt" | grep -E "passed|failed|FAILED|ERROR|Error" | tail -n 40
fi
stamp "bench_decode"
timeout ${DECODE_TIMEOUT:-90} python3 benchmarks/bench_decode.py --rows ${ROWS:-64:4096,1:4096,1:32768} \
  --heads 32/8 --pages ${PAGES:-16} --out "$OUT" > "$OUT/bench_decode.txt" 2>&1
tail -n 25 "$OUT/bench_decode.txt"
if [ -n "${PREFILL:-1}" ]; then
  stamp "bench prefill S=512 (dense, paged16, paged256)"
  timeout ${PREFILL_TIMEOUT:-90} python3 benchmarks/bench.py --dims 128 --seqs 512 --dtypes bf16 \
    --out "$OUT" > "$OUT/bench_paged.txt" 2>&1
  tail -n 25 "$OUT/bench_paged.txt"
fi
stamp "done"
