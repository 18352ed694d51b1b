#!/usr/bin/env bash
# Stop 44's last device call (repo root, logs under $OUT), on the code as it lands: the combine
# kernel's fast path for float32 partials and the swapped decode's split rule.  In priority
# order, each step capped by what is left of a 560 s budget:
#   1. (~4-5 min) the whole GPU suite, 8 shards, after a parallel precompile.
#   2. (~0.5 min) tools/decode_sm90_parts.py: split kernel / combine / step / an empty launch.
#   3. (~0.5 min) benchmarks/bench_decode.py, MQA 32/1 and GQA 32/8, pages 16 and 256 (issue 16).
#   4. the four sanitizers on the decode / combine cases.
#   5. tools/device_stop44_ncu.sh (Nsight Compute, the swapped split kernel at B = 64),
#      as long as time is left.
set -u
OUT=${OUT:-/tmp/fa_stop44f}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
L="$OUT/s44f"; mkdir -p "$L"
left() { local l=$(( ${BUDGET:-560} - ($(date +%s) - T0) )); [ $l -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
stamp "whole GPU suite"
OUT="$L/suite" N=8 PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-230} SERIAL="" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 14
stamp "decode_sm90_parts.py"
timeout "$(left 60)" python3 tools/decode_sm90_parts.py --rows 1:2048,1:4096,1:32768,4:8192,16:16384,64:4096 \
  > "$L/parts.txt" 2>&1
cat "$L/parts.txt"
stamp "bench_decode.py"
timeout "$(left 70)" python3 benchmarks/bench_decode.py --rows 1:4096,1:32768,16:16384,64:4096 \
  --heads 32/1,32/8 --pages 16,256 --kv bf16 --out "$L/bd" > "$L/bench_decode.txt" 2>&1
tail -n 20 "$L/bench_decode.txt" | grep "^|" | grep -v -- "---"
stamp "sanitizers (decode / combine cases)"
OUT="$L/san" TOOL_TIMEOUT=$(left 100) CASES_K=decode timeout "$(left 130)" bash tools/sanitize.sh 2>&1 | tail -n 6
stamp "ncu"
OUT="$L/ncu" ROWS="64:4096" NCU_TIMEOUT=$(left 90) timeout "$(left 100)" bash tools/device_stop44_ncu.sh 2>&1 | tail -n 60
tar -C "$OUT" -czf "$OUT/s44f.tgz" s44f
stamp done
