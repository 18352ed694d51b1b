#!/usr/bin/env bash
# Stop 44's last device call (repo root, logs under $OUT), on the code as it lands: MQA decode
# (the combine kernel's fast path for float32 partials, the swapped decode's split rule).
#   1. (~4-5 min) the whole GPU suite, 8 shards, after a parallel precompile.
#   2. (~1.5 min) all four sanitizers on every sanitize case.
#   3. (~0.5 min) benchmarks/bench_decode.py, MQA 32/1 and GQA 32/8, pages 16 and 256 (issue 16).
set -u
OUT=${OUT:-/tmp/fa_stop44f}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
L="$OUT/s44f"; mkdir -p "$L"
stamp "whole GPU suite"
OUT="$L/suite" N=8 PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-200} SERIAL="" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 14
stamp "sanitizers, every case"
OUT="$L/san" TOOL_TIMEOUT=80 bash tools/sanitize.sh 2>&1 | tail -n 6
stamp "bench_decode.py"
timeout ${BENCH_TIMEOUT:-60} python3 benchmarks/bench_decode.py --rows 1:4096,1:32768,16:16384,64:4096 \
  --heads 32/1,32/8 --pages 16,256 --kv bf16 --out "$L/bd" > "$L/bench_decode.txt" 2>&1
tail -n 3 "$L/bench_decode.txt"
tar -C "$OUT" -czf "$OUT/s44f.tgz" s44f
stamp done
