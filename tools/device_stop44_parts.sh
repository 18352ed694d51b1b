#!/usr/bin/env bash
# Stop 44, a short call (repo root, logs under $OUT): where the swapped MQA decode's GPU time
# goes (split kernel, combine, the step, an empty launch) with the stop 44 split rule, and the
# split sweep of B = 1 ctx 4096 / 2048 beside it.
set -u
OUT=${OUT:-/tmp/fa_stop44p}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
stamp "parts"
timeout 120 python3 tools/decode_sm90_parts.py --rows 1:2048,1:4096,1:32768,4:8192,16:16384,64:4096 2>&1 | tee "$OUT/parts.txt"
timeout 60 python3 tools/decode_sm90_parts.py --rows 1:4096,1:32768 --splits 32 2>&1 | tail -n 2 | tee -a "$OUT/parts.txt"
stamp done
