#!/usr/bin/env bash
# Stop 30's device call (repo root), logs under $OUT: precompile, the sm90 GPU tests (the
# dynamic tile schedule: edges, many-round persistent tests, the counter reset), the paged
# S = 512 prefill rows (issue 15), then the decode probe (tools/decode_probe.py).
#   TESTS="..." overrides the test files; MODE=full runs every `gpu` test instead.
#   MODE=bench: no tests; the S = 512 rows twice (the default schedule, then one CTA per tile:
#   CUPY_FLASHATTN_SM90_GRID=tiles, the schedule varlen / paged had before), issue 15's decode
#   rows (bench_decode.py) and the probe.
set -u
OUT=${OUT:-/tmp/fa_stop30}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
stamp "precompile"
python3 tools/precompile_parallel.py 2>&1 | tail -n 1
if [ "${MODE:-}" = bench ]; then
  stamp "bench prefill S=512, one CTA per tile (CUPY_FLASHATTN_SM90_GRID=tiles)"
  CUPY_FLASHATTN_SM90_GRID=tiles timeout 150 python3 benchmarks/bench.py --dims 128 --seqs 512 \
    --dtypes bf16 --out /tmp/b512t > "$OUT/bench512_tiles.txt" 2>&1
  cp /tmp/b512t/h200.md "$OUT/b512_tiles.md" 2>/dev/null; grep "^| bf16" "$OUT/b512_tiles.md"
  stamp "bench_decode"
  timeout 150 python3 benchmarks/bench_decode.py --rows 64:4096,1:512 --heads 32/8 --pages 16 \
    --out /tmp/bd > "$OUT/bench_decode.txt" 2>&1
  tail -n 12 "$OUT/bench_decode.txt"
fi
stamp "pytest"
if [ "${MODE:-}" = bench ]; then TESTS="tests/gpu/test_sm90_persistent.py";
elif [ "${MODE:-}" = full ]; then TESTS=""; else
  TESTS=${TESTS:-tests/gpu/test_sm90_persistent.py tests/gpu/test_sm90_edges.py}; fi
timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE $TESTS > "$OUT/pytest.txt" 2>&1
tail -n 40 "$OUT/pytest.txt" | grep -E "passed|failed|FAILED|ERROR|Error|Timeout" | tail -n 20
stamp "bench prefill S=512 (dense, varlen, paged16, paged256)"
timeout ${PREFILL_TIMEOUT:-150} python3 benchmarks/bench.py --dims 128 --seqs 512 --dtypes bf16 \
  --out /tmp/b512 > "$OUT/bench512.txt" 2>&1
cp /tmp/b512/h200.md "$OUT/b512.md" 2>/dev/null; grep "^| bf16" "$OUT/b512.md"
if [ -n "${PROBE-1}" ]; then
  stamp "decode probe"
  timeout ${PROBE_TIMEOUT:-120} python3 tools/decode_probe.py --rows ${ROWS:-64:4096} --splits 0,2 \
    > "$OUT/probe.txt" 2>&1
  cat "$OUT/probe.txt"
fi
stamp "done"
