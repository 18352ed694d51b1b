#!/usr/bin/env bash
# Stall reasons and throughput of the sm90 prefill kernel (issue 12's "what stands between it
# and 1.05x cuDNN"): Nsight Compute on the 4th launch of tools/ncu_case.py for each case in
# $CASES ("D,S,causal[,page];..."), clocks left alone (METHOD.md).  Reports land in $OUT.
#   NCU_EXTRA: more ncu options, e.g. the stall reasons per warp state and source line:
#     NCU_EXTRA="--section SourceCounters --print-details all" GREP="Stall|Duration"
#   PRECOMPILE=0 skips the parallel precompile (the cases compile their few kernels).
set -u
OUT=${OUT:-/tmp/fa_ncu}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
command -v ncu >/dev/null || { echo "ncu not found"; exit 1; }
[ "${PRECOMPILE:-1}" = 1 ] && timeout 200 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
IFS=';' read -ra CS <<< "${CASES:-128,2048,0;128,2048,1;64,4096,0}"
for c in "${CS[@]}"; do
  IFS=',' read -r d s causal page <<< "$c"  # page: optional, a paged pool of that page size
  page=${page:-0}
  tag="d${d}_s${s}_c${causal}_p${page}"
  echo "== $tag"
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --target-processes all \
    --kernel-name regex:fa_fwd_sm90 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    ${NCU_EXTRA:-} \
    python3 tools/ncu_case.py --d "$d" --s "$s" --paged "$page" $([ "$causal" = 1 ] && echo --causal) \
    > "$OUT/ncu_$tag.txt" 2>&1
  grep -E "${GREP:-Duration|Compute \(SM\) Throughput|Memory Throughput|Stall|Issued Warp|No Eligible|Warp Cycles Per Issued}" \
    "$OUT/ncu_$tag.txt" | head -n 30
done
