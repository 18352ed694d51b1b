#!/usr/bin/env bash
# Stop 38's device calls left for the next session (repo root), logs under $OUT (at most 8 files
# come back: each mode tars its logs).  Stop 38's own runs used tools/device_stop37.sh (confirm,
# sweep, coverage, check); the device refused every start after run 10.
# MODE=verify16 (~2 min): what stop 38 changed after its last device run --
#   1. tests/test_decode_steps.py (its graph-capture test now compares a replay with its own
#      eager step bit for bit, the cache path within float16 rounding) beside the decode,
#      float8 and front-end GPU tests, on the default build (float8 D = 128 at 4 CTAs per SM,
#      the late table);
#   2. float8 D = 256 at 2 CTAs per SM (FA_DECODE_FP8_CTAS_D256=2; the sweep's probe of it
#      failed on a probe bug, since fixed): the float8 decode tests under it, then kernel time
#      default / 2 CTAs beside bf16 D = 256 (B = 64 ctx 4096, B = 16 ctx 16384, B = 1 ctx 4096);
#   3. B = 1 ctx 32768 at 16 / 29 (the rule's) / 32 splits, twice (issue 16's B = 1 row).
#      (33: 264 CTAs, exactly 2 per SM of 132 -- at 29 splits 100 SMs stream 2 CTAs and 32 one.)
# MODE=ncu12 (~3 min): issue 12's facts -- Nsight Compute's SourceCounters of the sm90 prefill
#   kernel at D = 256 S = 4096, dense and page 16 (the paged kernel issues 13.5% more
#   instructions: which lines), read with tools/ncu_source_top.py; and the stall reasons per
#   issued instruction of dense D = 128 S = 4096 (the 29% of cycles the tensor pipe idles).
# MODE=mqa (~2 min): issue 16's weak shape -- Nsight Compute (throughput, warp states, memory
#   workload, L2 sectors) of the decode kernel on MQA 32/1 beside GQA 32/8 (B = 64 ctx 4096
#   page 16) and cuDNN on the MQA row: MQA reads each key twice through L2 (two 16-row query
#   tiles per kv head) and ran at 0.59-0.66 of copy where 32/8 runs 0.96-0.98.
set -u
OUT=${OUT:-/tmp/fa_stop38}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
if [ "${MODE:-verify16}" = verify16 ]; then
  L="$OUT/verify16"; mkdir -p "$L"
  stamp "decode, float8, front-end and decode-step GPU tests (default build)"
  OUT="$L/tests" SERIAL= PYTEST_TIMEOUT=150 \
    TESTS="tests/test_decode_steps.py tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_frontend.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
  D256=FA_DECODE_FP8_CTAS_D256=2
  stamp "float8 decode tests under $D256"
  CUPY_FLASHATTN_SM90_DEFINES=$D256 OUT="$L/tests_d256" SERIAL= PYTEST_TIMEOUT=150 \
    TESTS="tests/gpu/test_gpu_fp8_decode.py" bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
  for defs in "" "$D256"; do
    stamp "float8 D = 256 [${defs:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 90 python3 tools/decode_ring_probe.py \
      --rows 64:4096,16:16384,1:4096 --splits 0 --kv fp8 --dim 256 --no-peer 2>&1 \
      | tee -a "$L/probe.txt" | grep "^\["
  done
  stamp "bf16 D = 256"
  timeout 90 python3 tools/decode_ring_probe.py --rows 64:4096,16:16384,1:4096 --splits 0 \
    --kv bf16 --dim 256 --no-peer 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  # B = 1 ctx 32768: the split rule keeps the wave rule's 29 splits; run 10 timed 16 splits
  # 2 us faster (59.5 vs 61.5 us event), stop 37's run 2 1 us slower -- twice each, to see.
  for rep in 1 2; do
    for sp in 16 29 32 33; do
      stamp "B = 1 ctx 32768 timeline, $sp splits ($rep)"
      timeout 60 python3 tools/decode_timeline.py --rows 1:32768 --splits $sp 2>&1 \
        | tee -a "$L/timeline.txt" | grep "^B="
    done
  done
  tar -C "$OUT" -czf "$OUT/verify16.tgz" verify16 && rm -rf "$L"
  stamp done
  exit 0
fi
if [ "${MODE:-verify16}" = ncu12 ]; then
  L="$OUT/ncu12"; mkdir -p "$L"
  MODE=ncusrc PAGES="0 16" S=4096 D=256 OUT="$L" NCU_TIMEOUT=150 bash tools/device_stop35.sh 2>&1 | tail -n 20
  PRECOMPILE=0 CASES="128,4096,0" OUT="$L" GREP="stalled|Duration" \
    NCU_EXTRA="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    bash tools/ncu_sm90.sh 2>&1 | tail -n 40
  tar -C "$OUT" -czf "$OUT/ncu12.tgz" ncu12 && rm -rf "$L"
  stamp done
  exit 0
fi
if [ "${MODE:-verify16}" = mqa ]; then
  L="$OUT/mqa"; mkdir -p "$L"
  M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active
  for c in "mqa:decode_bf16:32/1" "gqa:decode_bf16:32/8" "cudnn_mqa:sdpa|cudnn|fmha|flash_fprop:32/1"; do
    IFS=: read -r tag who heads <<< "$c"
    stamp "ncu $tag"
    timeout 120 ncu --clock-control none --kernel-name regex:"$who" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
      --section Occupancy --metrics "$M" \
      python3 tools/decode_ring_probe.py --rows 64:4096 --splits 0 --heads "$heads" \
      $([ "$tag" = cudnn_mqa ] || echo --no-peer) > "$L/ncu_$tag.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|^\s+(dram__|lts__|sm__)" \
      "$L/ncu_$tag.txt" | sed "s/^/$tag /" | head -n 14
  done
  tar -C "$OUT" -czf "$OUT/mqa.tgz" mqa && rm -rf "$L"
  stamp done
  exit 0
fi
echo "unknown MODE=${MODE}" >&2
exit 2
