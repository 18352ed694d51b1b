#!/usr/bin/env bash
# Stop 44: Nsight Compute on the swapped MQA decode's split kernel (repo root, logs under $OUT):
# where a B = 64 step's time goes (0.75 of copy bandwidth against cuDNN's 0.85) and a B = 1
# step's (latency).  The 4th launch of tools/ncu_decode_case.py, clocks left alone.  ROWS: the
# B:ctx rows (default "64:4096 1:4096").
set -u
OUT=${OUT:-/tmp/fa_ncu_dec}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
for c in ${ROWS:-64:4096 1:4096}; do
  IFS=':' read -r b ctx <<< "$c"
  stamp "B=$b ctx=$ctx"
  timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --target-processes all \
    --kernel-name regex:fa_fwd_sm90 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart --section LaunchStats \
    python3 tools/ncu_decode_case.py --b "$b" --ctx "$ctx" > "$OUT/ncu_b${b}_ctx${ctx}.txt" 2>&1
  grep -E "Duration|Throughput|Stall|Issued Warp|No Eligible|Warp Cycles Per Issued|Bandwidth|Hit Rate|Active Warps|Registers" \
    "$OUT/ncu_b${b}_ctx${ctx}.txt" | head -n 40
done
stamp done
