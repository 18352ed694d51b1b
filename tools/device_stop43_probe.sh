#!/usr/bin/env bash
# Stop 43: where the swapped MQA decode's time goes (repo root, logs under $OUT).  Kernel time,
# MQA 32/1 D = 128: page 16 against page 256 (TMA boxes of 16 against 128 rows), and a ring of
# 3 stages (FA_SM90_STAGES_128=3: 224 KB, the O staging tile then shares Q's buffer).
set -u
OUT=${OUT:-/tmp/fa_stop43p}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
for defs in "" "FA_SM90_STAGES_128=3"; do
  for page in 16 256; do
    stamp "MQA 32/1 D = 128 page $page [${defs:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 120 python3 tools/decode_ring_probe.py \
      --rows 64:4096,16:16384,1:32768 --splits 0 --heads 32/1 --dim 128 --page $page \
      $([ -z "$defs" ] && [ $page = 16 ] || echo --no-peer) 2>&1 | tee -a "$OUT/probe.txt" | grep "^\["
  done
done
stamp done
