#!/usr/bin/env bash
# Stop 36's device calls (repo root), logs under $OUT.
#   MODE=probe (default): decode facts before a kernel change (issues 15 / 16) --
#     1. tools/decode_ring_probe.py under each ring setting of $RINGS (tuning defines of
#        flash_decode.cu; "default" = none): GPU time per decode step, memset vs clean L2 flush,
#        forced split counts for B = 1, cuDNN beside;
#     2. ncu (SpeedOfLight, WarpStateStats, MemoryWorkloadAnalysis) of our decode kernel and of
#        cuDNN's on B = 64 ctx 4096 page 16 (NCU=0 skips it).
# The device call brings back at most 8 files from $OUT.
set -u
OUT=${OUT:-/tmp/fa_stop36}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
mode=${MODE:-probe}
if [ "$mode" = probe ]; then
  for ring in ${RINGS:-default FA_DECODE_DEEP=4 FA_DECODE_DEEP=6}; do
    defs=$ring; [ "$ring" = default ] && defs=
    stamp "ring probe $ring"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout ${PROBE_TIMEOUT:-120} python3 tools/decode_ring_probe.py \
      ${PROBE_ARGS:---splits 0,8,16,24,32} 2>&1 | tee -a "$OUT/ring_probe.txt" | grep -v "^#"
  done
  if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
    for who in "decode_bf16" "sdpa|cudnn|fmha|flash_fprop"; do
      stamp "ncu $who"
      timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --kernel-name regex:"$who" --launch-skip 3 \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section LaunchStats --section Occupancy \
        python3 tools/decode_ring_probe.py --rows 64:4096 --splits 0 >> "$OUT/ncu_decode.txt" 2>&1
      grep -E "^  [a-z_]|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Dynamic Shared" \
        "$OUT/ncu_decode.txt" | tail -n 12
    done
  fi
fi
stamp done
