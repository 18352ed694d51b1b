#!/usr/bin/env bash
# Stop 48's device calls (repo root), prepared in a session without a device (none ran yet).
# STEP=ab (default), ~300 s:
#   1. precompile: the default build's prefill kernels, each A/B set's kernels and the
#      timeline builds (FA_SM90_DIAG_TIMELINE=1), each in its own kernel cache, in parallel;
#   2. where a query tile's time goes besides its key tiles (tools/sm90_timeline.py): D = 128
#      S = 2k / 8k and D = 64 S = 2k, for the default and for FA_SM90_EARLY_Q=1;
#   3. quickbench of the default build with torch SDPA's columns in the same process (issue
#      12's S = 2k rows, D = 128 S = 4k / 8k, paged 16; three rounds);
#   4. A/B, the builds alternating over two rounds (quickbench, sm90 column, back to back):
#      FA_SM90_EARLY_Q=1 against the default; and
#      D = 64 with the issue-slot trims (FA_SM90_TRIMS_MIN_D=64), with each of the wait hint and
#      the descriptor adds taken back out (which one cost D = 64 5%, stop 47).
# STEP=tests: the GPU test files that run the sm90 kernels, built with FA_SM90_EARLY_Q=1
#   (tools/device_switch_ab.sh's correctness half), 8 shards; then compute-sanitizer memcheck
#   and racecheck over tools/sanitize_cases.py on that build (EARLY_Q moves a barrier arrival).
#   When EARLY_Q has become the default, the suite (STEP=suite) covers what this step did.
# STEP=cluster: the swapped MQA decode with FA_SM90_CLUSTER_MERGE=1 (issue 16's B = 1 step):
#   tests/gpu/test_decode_sm90.py built with it (its cluster tests, and every other swapped case
#   under the cluster plan where it applies), compute-sanitizer memcheck / racecheck on a
#   cluster step.  STEP=cluster_time (same machine, after STEP=cluster: its kernel cache): the
#   step's parts (tools/decode_sm90_parts.py) and bench_decode.py's B = 1 rows with torch
#   cuDNN in the same process, default and cluster builds alternating.
# STEP=ncu: Nsight Compute facts for issue 12's "what stands between the kernel and 1.05x":
#   instructions per SASS opcode of ours against cuDNN's kernel (D = 128 S = 2k, D = 64 S = 2k
#   causal) and of paged D = 256 against dense (tools/ncu_opcodes.sh), then stall reasons
#   (tools/ncu_sm90.sh), on the default build and with FA_SM90_EARLY_Q=1.
# STEP=suite: the whole GPU suite on the default build, 8 shards (tools/gpu_suite_parallel.sh).
# A device call brings back at most 8 files: log into a scratch folder and tar it into $OUT,
# with the script under a timeout so that the tar always runs, e.g. (the run tool's command):
#   d=/tmp/s48; STEP=ab OUT=$d timeout 560 bash tools/device_stop48.sh; tar czf $OUT/s48_ab.tgz -C $d .
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/fa_stop48}; mkdir -p "$OUT"
. tools/device_env.sh
SWITCHES=FA_SM90_EARLY_Q=1
case "${STEP:-ab}" in
  suite)
    OUT="$OUT/suite" N=8 bash tools/gpu_suite_parallel.sh
    exit $? ;;
  cluster)
    CL=FA_SM90_CLUSTER_MERGE=1
    stamp "precompile the split kernels with $CL"
    CUPY_FLASHATTN_SM90_DEFINES=$CL CUPY_CACHE_DIR=/tmp/fa_cache_cluster timeout 200 \
      python3 tools/precompile_parallel.py --jobs 8 --no-decode --only '_split' 2>&1 | tail -n 1
    stamp "test_decode_sm90.py with $CL"
    CUPY_FLASHATTN_SM90_DEFINES=$CL CUPY_CACHE_DIR=/tmp/fa_cache_cluster timeout 240 \
      python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_decode_sm90.py > "$OUT/cluster_tests.txt" 2>&1
    tail -n 5 "$OUT/cluster_tests.txt"
    stamp "memcheck / racecheck, one cluster step"
    SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
    for tool in memcheck racecheck; do
      CUPY_FLASHATTN_SM90_DEFINES=$CL CUPY_CACHE_DIR=/tmp/fa_cache_cluster timeout 120 \
        "${SAN:-compute-sanitizer}" --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
        tests/gpu/test_decode_sm90.py -k "test_cluster_merge and ctx300 and bfloat16 and 128" \
        > "$OUT/cluster_$tool.txt" 2>&1; echo "$tool exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/cluster_$tool.txt" | tail -n 1)"
    done
    exit 0 ;;
  cluster_time)
    CL=FA_SM90_CLUSTER_MERGE=1
    for r in 1 2; do
      for defs in "" "$CL"; do
        stamp "decode_sm90_parts defines='$defs' round $r"
        cache=/tmp/fa_cupy_cache; [ -n "$defs" ] && cache=/tmp/fa_cache_cluster
        CUPY_FLASHATTN_SM90_DEFINES=$defs CUPY_CACHE_DIR=$cache timeout 90 python3 tools/decode_sm90_parts.py \
          --rows 1:2048,1:4096,1:32768,2:4096 --lse-read 2>&1 | tee -a "$OUT/cluster_parts.txt" | tail -n 5
        CUPY_FLASHATTN_SM90_DEFINES=$defs CUPY_CACHE_DIR=$cache timeout 150 python3 benchmarks/bench_decode.py \
          --rows 1:4096,1:32768 --heads 32/1 --pages 16 --out "$OUT/bench_cluster_${r}_${defs:+on}" 2>&1 \
          | tee -a "$OUT/cluster_bench.txt" | grep -iE "B=1|cudnn|ours" | head -n 12
      done
    done
    exit 0 ;;
  ncu)
    OUT="$OUT/ncu_ops" CASES="128,2048,0,0;128,2048,0,0,FA_SM90_EARLY_Q=1;128,2048,0,0,,cudnn;64,2048,1,0;64,2048,1,0,,cudnn;256,2048,0,0;256,2048,0,16" \
      NCU_TIMEOUT=120 bash tools/ncu_opcodes.sh 2>&1 | tail -n 60
    OUT="$OUT/ncu_stalls" CASES="128,2048,0;64,2048,1;256,2048,0,16" PRECOMPILE=0 NCU_TIMEOUT=120 \
      bash tools/ncu_sm90.sh 2>&1 | tail -n 40
    exit 0 ;;
  tests)
    OUT=$OUT SETS=$SWITCHES SKIP_BENCH=1 bash tools/device_switch_ab.sh
    CUPY_FLASHATTN_SM90_DEFINES=$SWITCHES CUPY_CACHE_DIR=/tmp/fa_cache_switch_all OUT="$OUT/sanitize" \
      TOOL_TIMEOUT=${TOOL_TIMEOUT:-150} bash tools/sanitize.sh memcheck racecheck 2>&1 | tail -n 4
    exit $? ;;
esac
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
K64='fa_fwd_sm90_bf16_d64$,fa_fwd_sm90_bf16_d64_paged$'
KALL="$K64,fa_fwd_sm90_bf16_d128\$,fa_fwd_sm90_bf16_d128_paged\$,fa_fwd_sm90_bf16_d128_wide\$,fa_fwd_sm90_bf16_d256\$,fa_fwd_sm90_bf16_d256_paged\$"
ROWS_EQ="128,2048,0;128,2048,1;64,2048,0;64,2048,1;256,2048,0;128,4096,0;128,8192,0"
ROWS_64="64,2048,0;64,2048,1;64,4096,1"
# name | defines | kernels | rows
SETS=(
  "early|$SWITCHES|$KALL|$ROWS_EQ"
  "t64|FA_SM90_TRIMS_MIN_D=64|$K64|$ROWS_64"
  "t64nohint|FA_SM90_TRIMS_MIN_D=64,FA_SM90_WAIT_HINT_NS=0|$K64|$ROWS_64"
  "t64nodesc|FA_SM90_TRIMS_MIN_D=64,FA_SM90_DESC_ADD=0|$K64|$ROWS_64"
)
TL_SETS=("tl|FA_SM90_DIAG_TIMELINE=1" "tlearly|FA_SM90_DIAG_TIMELINE=1,$SWITCHES")
stamp "precompile: default, each set's kernels, the timeline builds"
timeout 240 python3 tools/precompile_parallel.py --jobs 4 --no-decode --only "$KALL" \
  > "$OUT/precompile_default.txt" 2>&1 &
for s in "${SETS[@]}"; do
  IFS='|' read -r name defs keys rows <<< "$s"
  CUPY_FLASHATTN_SM90_DEFINES="$defs" CUPY_CACHE_DIR="/tmp/fa_cache_$name" timeout 240 \
    python3 tools/precompile_parallel.py --jobs 2 --no-decode --only "$keys" > "$OUT/precompile_$name.txt" 2>&1 &
done
for s in "${TL_SETS[@]}"; do
  IFS='|' read -r name defs <<< "$s"
  CUPY_FLASHATTN_SM90_DEFINES="$defs" CUPY_CACHE_DIR="/tmp/fa_cache_$name" timeout 240 \
    python3 tools/precompile_parallel.py --jobs 1 --no-decode \
    --only 'fa_fwd_sm90_bf16_d128$,fa_fwd_sm90_bf16_d128_wide$,fa_fwd_sm90_bf16_d64$' \
    > "$OUT/precompile_$name.txt" 2>&1 &
done
wait
grep -h precompiled "$OUT"/precompile_*.txt
for s in "${TL_SETS[@]}"; do
  IFS='|' read -r name defs <<< "$s"
  for case in "--d 128 --s 2048" "--d 128 --s 8192" "--d 64 --s 2048"; do
    stamp "timeline $name $case"
    # sm90_timeline.py adds FA_SM90_DIAG_TIMELINE=1 itself
    CUPY_CACHE_DIR="/tmp/fa_cache_$name" timeout 60 python3 tools/sm90_timeline.py $case \
      --defines "${defs#FA_SM90_DIAG_TIMELINE=1}" 2>&1 | tee -a "$OUT/timeline_$name.txt" | tail -n 12
  done
done
stamp "quickbench, default build, with torch"
timeout 150 python3 tools/quickbench_sm90.py --archs sm90 --paged 16 --rounds 3 \
  --rows "128,2048,0;128,2048,1;64,2048,0;64,2048,1;256,2048,0;256,2048,1;128,4096,0;128,8192,0" \
  > "$OUT/qb_default_torch.txt" 2>&1
grep -E "^D[0-9]+ S|torch|cudnn" "$OUT/qb_default_torch.txt" | head -n 30
for r in 1 2; do
  for s in "default|||$ROWS_EQ" "${SETS[@]}"; do
    IFS='|' read -r name defs keys rows <<< "$s"
    stamp "$name round $r"
    cache=/tmp/fa_cache_$name; [ "$name" = default ] && cache=$CUPY_CACHE_DIR
    env CUPY_FLASHATTN_SM90_DEFINES="$defs" CUPY_CACHE_DIR="$cache" timeout 90 \
      python3 tools/quickbench_sm90.py --archs sm90 --no-torch --paged 16 --rows "$rows" \
      > "$OUT/qb_${name}_$r.txt" 2>&1
    grep -E "^D[0-9]+ S" "$OUT/qb_${name}_$r.txt"
  done
done
stamp "end"
