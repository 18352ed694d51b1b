#!/usr/bin/env bash
# Stop 39's device calls (repo root), logs under $OUT (each mode tars its logs: at most 8 files
# come back).  Stop 38's plan (tools/device_stop38.sh: verify16, ncu12, mqa) still stands; this
# adds the 32-row wide-group decode kernel (flash_decode.cu kMTiles = 2, decode.py decode_rows),
# which plans take only under CUPY_FLASHATTN_SM90_DEFINES=FA_DECODE_WIDE_ROWS=1 until a device run
# has tested and timed it ($WIDE below; the 16-row build is the A/B baseline).
# MODE=wide (~4 min):
#   1. the 32-row kernel's GPU tests (test_gpu_decode.py -k wide) -- the rest of the decode
#      tests run in device_stop38.sh MODE=verify16 on the same build;
#   2. memcheck and racecheck over tools/sanitize_cases.py's decode cases (two of them MQA /
#      24-head groups on the 32-row kernel);
#   3. kernel time, wide against the default 16-row build (the 16-row kernel: two CTAs per 32 rows, each reading
#      every key), MQA 32/1 D = 128 and 64, B = 64 ctx 4096 and B = 16 ctx 16384, pages 16 and
#      256, beside cuDNN (decode_ring_probe.py);
#   4. bench_decode.py's MQA row at pages 1 / 8 / 16 / 64 / 256 (fraction of copy: issue 16).
# MODE=first (~6 min): one call with the most important parts first (the decode GPU tests on
#   the default build, MQA D = 128 wide vs 16-row, bench_decode's MQA row at pages 16 / 256,
#   the sanitizers), then B = 1 ctx 32768 at 29 / 32 / 33 / 16 splits and MQA D = 64.
set -u
OUT=${OUT:-/tmp/fa_stop39}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
WIDE=FA_DECODE_WIDE_ROWS=1
if [ "${MODE:-wide}" = wide ]; then
  L="$OUT/wide"; mkdir -p "$L"
  stamp "32-row decode tests"
  OUT="$L/tests" SERIAL= PYTEST_TIMEOUT=150 TESTS="tests/gpu/test_gpu_decode.py" PYTEST_ARGS="-k wide" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 6
  stamp "sanitizers over the decode cases"
  CUPY_FLASHATTN_SM90_DEFINES=$WIDE CASES_K=decode OUT="$L/san" TOOL_TIMEOUT=150 \
    bash tools/sanitize.sh memcheck racecheck 2>&1 | tail -n 6
  for d in 128 64; do
    for pg in 16 256; do
      for w in "$WIDE" ""; do
        stamp "MQA 32/1 D = $d page $pg [${w:-16 rows}]"
        CUPY_FLASHATTN_SM90_DEFINES=$w timeout 120 python3 tools/decode_ring_probe.py \
          --rows 64:4096,16:16384 --splits 0 --heads 32/1 --dim $d --page $pg \
          $([ "$w$pg$d" = "${WIDE}16128" ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
      done
    done
  done
  stamp "bench_decode MQA row"
  CUPY_FLASHATTN_SM90_DEFINES=$WIDE timeout 200 python3 benchmarks/bench_decode.py --rows 64:4096 \
    --heads 32/1 --pages 1,8,16,64,256 --kv bf16 --out "$L/bench" > "$L/bench_decode.txt" 2>&1
  grep "^| [0-9]" "$L/bench_decode.txt" | cut -d"|" -f2-10,12-13,16-19
  tar -C "$OUT" -czf "$OUT/wide.tgz" wide && rm -rf "$L"
  stamp done
  exit 0
fi
if [ "${MODE:-wide}" = mini ]; then
  # Under 4 minutes of device time left: the 32-row kernel's tests and its A/B only.
  L="$OUT/mini"; mkdir -p "$L"
  stamp "MQA 32/1 D = 128 page 16, wide then 16-row (B = 64 ctx 4096)"
  CUPY_FLASHATTN_SM90_DEFINES=$WIDE timeout 70 python3 tools/decode_ring_probe.py --rows 64:4096 \
    --splits 0 --heads 32/1 --dim 128 --page 16 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  timeout 40 python3 tools/decode_ring_probe.py --rows 64:4096 --splits 0 --heads 32/1 --dim 128 \
    --page 16 --no-peer 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  stamp "decode GPU tests (32-row kernel included) and decode steps"
  OUT="$L/tests" SERIAL= PYTEST_TIMEOUT=100 PRECOMPILE=0 \
    TESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
  tar -C "$OUT" -czf "$OUT/mini.tgz" mini
  stamp done
  exit 0
fi
if [ "${MODE:-wide}" = first ]; then
  # The device was scarce (stop 39): one call, most important first, each part tarred as it
  # finishes so a call cut by its time limit still brings back what ran.
  L="$OUT/first"; mkdir -p "$L"
  stamp "decode GPU tests (32-row kernel included), decode steps, float8, front end"
  OUT="$L/tests" SERIAL= PYTEST_TIMEOUT=150 \
    TESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_frontend.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
  tar -C "$OUT" -czf "$OUT/first_tests.tgz" first/tests
  for w in "$WIDE" ""; do
    stamp "MQA 32/1 D = 128 page 16 [${w:-16 rows}]"
    CUPY_FLASHATTN_SM90_DEFINES=$w timeout 100 python3 tools/decode_ring_probe.py \
      --rows 64:4096,16:16384 --splits 0 --heads 32/1 --dim 128 --page 16 \
      $([ -n "$w" ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  done
  stamp "bench_decode MQA row"
  CUPY_FLASHATTN_SM90_DEFINES=$WIDE timeout 150 python3 benchmarks/bench_decode.py --rows 64:4096 \
    --heads 32/1 --pages 16,256 --kv bf16 --out "$L/bench" > "$L/bench_decode.txt" 2>&1
  grep "^| [0-9]" "$L/bench_decode.txt" | cut -d"|" -f2-10,12-13,16-19
  stamp "sanitizers over the decode cases"
  CUPY_FLASHATTN_SM90_DEFINES=$WIDE CASES_K=decode OUT="$L/san" TOOL_TIMEOUT=120 \
    bash tools/sanitize.sh memcheck racecheck 2>&1 | tail -n 4
  tar -C "$OUT" -czf "$OUT/first_b.tgz" first/probe.txt first/bench_decode.txt first/san 2>/dev/null
  for sp in 29 32 33 16; do
    stamp "B = 1 ctx 32768 timeline, $sp splits"
    timeout 60 python3 tools/decode_timeline.py --rows 1:32768 --splits $sp 2>&1 \
      | tee -a "$L/timeline.txt" | grep "^B="
  done
  for d in 64; do
    for w in "$WIDE" ""; do
      stamp "MQA 32/1 D = $d page 16 [${w:-16 rows}]"
      CUPY_FLASHATTN_SM90_DEFINES=$w timeout 100 python3 tools/decode_ring_probe.py \
        --rows 64:4096,16:16384 --splits 0 --heads 32/1 --dim $d --page 16 --no-peer 2>&1 \
        | tee -a "$L/probe.txt" | grep "^\["
    done
  done
  tar -C "$OUT" -czf "$OUT/first_c.tgz" first/probe.txt first/timeline.txt 2>/dev/null
  stamp done
  exit 0
fi
echo "unknown MODE=${MODE}" >&2
exit 2
