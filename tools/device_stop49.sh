#!/usr/bin/env bash
# Stop 49's device calls (repo root).
# STEP=ab (default), ~300 s:
#   1. precompile, each build in its own kernel cache, in parallel: "e" = FA_SM90_EARLY_Q=1 (the
#      candidate default), "el" = that plus FA_SM90_LPT_GROUPS=1 (grouped heavy-first claims of
#      the dynamic schedule, causal / local), "enb" = e plus FA_SM90_O_BULK=1 (O's rows leave by
#      bulk copies) with FA_SM90_NEXT_EARLY=1 (the next tile resolved before the
#      epilogue), and the timeline builds of "e" and "enb"; the prefill cases of
#      tools/sanitize_cases.py on el and enb (NaN-poisoned outputs against the float64
#      reference, no sanitizer) before anything is timed;
#   2. the timeline with the epilogue's inner marks (D = 128, S = 2k): where its 1.3 us go;
#   3. A/B e / el / enb, two rounds alternating: quickbench with make bench's heads (2048 / D),
#      the dense column (static schedule: unchanged by LPT) beside varlen and paged 16 / 256
#      (dynamic); S = 2k rows causal and not, D = 256 causal.
# STEP=both (~540 s): the whole GPU suite on U = every candidate on (EARLY_Q, LPT_GROUPS,
#   NEXT_EARLY, O_BULK), then the timeline of e and U (D = 128 S = 2k) and quickbench e vs U
#   (two rounds alternating): dense columns give NEXT_EARLY + O_BULK, the varlen / paged
#   columns against dense the LPT groups besides.
# STEP=early (~290 s): the suite on FA_SM90_EARLY_Q=1 alone, then racecheck on its prefill cases.
# STEP=suite: the whole GPU suite on the build in CUPY_FLASHATTN_SM90_DEFINES (8 shards), then
#   compute-sanitizer memcheck / racecheck over tools/sanitize_cases.py on it, if time is left.
# A device call brings back at most 8 files: log into a scratch folder and tar it into $OUT,
# with the script under a timeout so that the tar always runs, e.g.:
#   d=/tmp/s49; STEP=ab OUT=$d timeout 570 bash tools/device_stop49.sh; tar czf $OUT/ab.tgz -C $d .
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/fa_stop49}; mkdir -p "$OUT"
. tools/device_env.sh
E=FA_SM90_EARLY_Q=1
U=$E,FA_SM90_LPT_GROUPS=1,FA_SM90_NEXT_EARLY=1,FA_SM90_O_BULK=1  # every candidate at once
KEYS='fa_fwd_sm90_bf16_d64$,fa_fwd_sm90_bf16_d64_paged$,fa_fwd_sm90_bf16_d128$,fa_fwd_sm90_bf16_d128_paged$,fa_fwd_sm90_bf16_d256$,fa_fwd_sm90_bf16_d256_paged$'

# precompile NAME DEFINES JOBS ONLY: a build's kernels into its own cache /tmp/fa_cache_NAME.
precompile() {
  CUPY_FLASHATTN_SM90_DEFINES="$2" CUPY_CACHE_DIR="/tmp/fa_cache_$1" timeout 300 \
    python3 tools/precompile_parallel.py --jobs "$3" --no-decode --only "$4" > "$OUT/precompile_$1.txt" 2>&1
}
# timeline NAME DEFINES: tools/sm90_timeline.py, D = 128 S = 2k, on the timeline build NAME.
timeline() {
  stamp "timeline $1"
  CUPY_CACHE_DIR="/tmp/fa_cache_$1" timeout 60 python3 tools/sm90_timeline.py --d 128 --s 2048 \
    --defines "$2" 2>&1 | tee -a "$OUT/timeline_$1.txt" | tail -n 14
}
# quickbench NAME DEFINES CACHE ROWS ROUND: the sm90 column beside varlen and paged 16 / 256.
quickbench() {
  stamp "$1 round $5"
  CUPY_FLASHATTN_SM90_DEFINES="$2" CUPY_CACHE_DIR="$3" timeout 120 \
    python3 tools/quickbench_sm90.py --archs sm90 --no-torch --heads 0 --varlen --paged 16,256 \
    --rows "$4" > "$OUT/qb_$1_$5.txt" 2>&1
  grep -E "^D[0-9]+ S" "$OUT/qb_$1_$5.txt"
}

case "${STEP:-ab}" in
  both)
    # The suite on the union build U (its kernel cache: the default one), while "e"'s kernels
    # and the two timeline builds compile beside it; then the timeline and the A/B e vs U.
    precompile e "$E" 3 "$KEYS" &
    precompile tl "FA_SM90_DIAG_TIMELINE=1,$E" 1 'fa_fwd_sm90_bf16_d128$' &
    precompile tlu "FA_SM90_DIAG_TIMELINE=1,$U" 1 'fa_fwd_sm90_bf16_d128$' &
    stamp "suite on U = $U"
    CUPY_FLASHATTN_SM90_DEFINES="$U" OUT="$OUT/suite" N=8 PYTEST_TIMEOUT=240 SERIAL_TIMEOUT=60 \
      bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 14
    wait
    grep -h precompiled "$OUT"/precompile_*.txt
    if [ "${TL:-1}" = 1 ]; then timeline tl "$E"; timeline tlu "$U"; fi
    ROWS=${ROWS:-"128,2048,0;128,2048,1;64,2048,0;256,2048,1;256,4096,1"}
    for r in $(seq 1 "${ROUNDS:-2}"); do
      quickbench e "$E" /tmp/fa_cache_e "$ROWS" "$r"
      quickbench u "$U" "$CUPY_CACHE_DIR" "$ROWS" "$r"
    done
    stamp "end"
    exit 0 ;;
  early)
    # The short call: the whole suite on E alone (FA_SM90_EARLY_Q=1, measured in stop 48), then
    # racecheck over the prefill cases (EARLY_Q moves a barrier arrival), inside ~290 s.
    stamp "suite on $E"
    CUPY_FLASHATTN_SM90_DEFINES="$E" OUT="$OUT/suite" N=8 PYTEST_TIMEOUT=170 SERIAL_TIMEOUT=40 \
      bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 14
    stamp "racecheck, prefill cases"
    CUPY_FLASHATTN_SM90_DEFINES="$E" OUT="$OUT/sanitize" CASES_K=prefill PRECOMPILE_TIMEOUT=50 \
      TOOL_TIMEOUT=60 bash tools/sanitize.sh racecheck 2>&1 | tail -n 3
    stamp "end"
    exit 0 ;;
  suite)
    OUT="$OUT/suite" N=8 PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-330} bash tools/gpu_suite_parallel.sh
    rc=$?
    if [ "${SANITIZE:-1}" = 1 ]; then
      OUT="$OUT/sanitize" TOOL_TIMEOUT=${TOOL_TIMEOUT:-150} bash tools/sanitize.sh memcheck racecheck 2>&1 | tail -n 4
    fi
    exit $rc ;;
esac
# STEP=ab
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
SETS=("e|$E" "el|$E,FA_SM90_LPT_GROUPS=1" "enb|$E,FA_SM90_NEXT_EARLY=1,FA_SM90_O_BULK=1")
stamp "precompile e, el, enb, the timeline builds"
for s in "${SETS[@]}"; do
  IFS='|' read -r name defs <<< "$s"
  precompile "$name" "$defs" 5 "$KEYS" &
done
precompile tl "FA_SM90_DIAG_TIMELINE=1,$E" 1 'fa_fwd_sm90_bf16_d128$' &
precompile tlnb "FA_SM90_DIAG_TIMELINE=1,$E,FA_SM90_NEXT_EARLY=1,FA_SM90_O_BULK=1" 1 'fa_fwd_sm90_bf16_d128$' &
wait
grep -h precompiled "$OUT"/precompile_*.txt
for s in "${SETS[@]:1}"; do
  IFS='|' read -r name defs <<< "$s"
  stamp "prefill cases of sanitize_cases.py on $name (no sanitizer)"
  CUPY_FLASHATTN_SM90_DEFINES="$defs" CUPY_CACHE_DIR="/tmp/fa_cache_$name" timeout 120 \
    python3 tools/sanitize_cases.py -k prefill > "$OUT/check_$name.txt" 2>&1; echo "exit $?"
  tail -n 1 "$OUT/check_$name.txt"; grep "^FAIL" "$OUT/check_$name.txt" | head -n 8
done
timeline tl "$E"
timeline tlnb "$E,FA_SM90_NEXT_EARLY=1,FA_SM90_O_BULK=1"
ROWS="128,2048,0;128,2048,1;64,2048,0;64,2048,1;256,2048,1;256,4096,1"
for r in 1 2; do
  for s in "${SETS[@]}"; do
    IFS='|' read -r name defs <<< "$s"
    quickbench "$name" "$defs" "/tmp/fa_cache_$name" "$ROWS" "$r"
  done
done
stamp "end"
