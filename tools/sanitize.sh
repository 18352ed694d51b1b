#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck, initcheck and synccheck over tools/sanitize_cases.py,
# which runs every CUDA kernel once at tiny sizes (prefill dense/varlen/paged in fp16/bf16 at
# D = 64 and 128, plain and softcap+ALiBi, and the float32 / float64 kernel; decode with and without split-KV (combine);
# rotary/append contiguous and paged; PagedKVCache; merge_attention_states; absent page ids).
#
# Usage, on the GPU machine, from anywhere (it cd's to the repo root):
#   OUT=/some/dir bash tools/sanitize.sh                 # all four tools
#   OUT=/some/dir bash tools/sanitize.sh memcheck        # a subset
# Steps: (1) one plain run of the cases compiles every kernel into $CUPY_CACHE_DIR and checks
# the results, so (2) the sanitized runs only load cubins; the tools run in parallel (one
# process each; PARALLEL=0 runs them one after the other), under --no-pool (cudaMalloc per
# array, so memcheck/initcheck see each array's own bounds).
# Writes $OUT/sanitize_<tool>.txt: the tool's summary line first, then the cases' result line,
# the exit status and time, and the first reports; full logs stay in $LOG_DIR.  Prints one
# line per tool with its error count; exit 0 only when every tool ran and reported 0 errors.
# Budget: < 5 minutes on an H200 (plain run ~30-60 s cold; each tool well under TOOL_TIMEOUT).
# Environment: OUT, LOG_DIR, CUPY_CACHE_DIR, PYTHON (python3), COMPUTE_SANITIZER (a path),
# PRECOMPILE_TIMEOUT (120), TOOL_TIMEOUT (170), PARALLEL (1), PRINT_LIMIT (50), CASES_K (only
# the cases whose name contains it).
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/fa_sanitize}
LOG_DIR=${LOG_DIR:-/tmp/fa_sanitize_logs}
mkdir -p "$OUT" "$LOG_DIR"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/fa_cupy_cache}
PY=${PYTHON:-python3}
TOOLS=${*:-memcheck racecheck initcheck synccheck}
PRECOMPILE_TIMEOUT=${PRECOMPILE_TIMEOUT:-120}
TOOL_TIMEOUT=${TOOL_TIMEOUT:-170}
PARALLEL=${PARALLEL:-1}
PRINT_LIMIT=${PRINT_LIMIT:-50}
T0=$(date +%s)

find_sanitizer() {
  if [ -n "${COMPUTE_SANITIZER:-}" ] && [ -x "$COMPUTE_SANITIZER" ]; then
    echo "$COMPUTE_SANITIZER"; return 0
  fi
  if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return 0; fi
  local c
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           /usr/local/cuda-*/bin/compute-sanitizer /usr/local/cuda-*/compute-sanitizer/compute-sanitizer \
           /opt/nvidia/compute-sanitizer/compute-sanitizer; do
    if [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if ! SAN=$(find_sanitizer); then
  for t in $TOOLS; do
    echo "NOT RUN: compute-sanitizer not found (PATH, /usr/local/cuda*/bin; set COMPUTE_SANITIZER)" \
      > "$OUT/sanitize_$t.txt"
    echo "sanitize $t: NOT RUN (compute-sanitizer not found)"
  done
  exit 2
fi
echo "sanitizer: $SAN ($("$SAN" --version 2>/dev/null | grep -m1 -i version))"

# (1) Plain run: compiles (NVRTC) and caches every kernel, checks the numbers.
timeout "$PRECOMPILE_TIMEOUT" "$PY" tools/sanitize_cases.py -k "${CASES_K:-}" > "$LOG_DIR/plain.log" 2>&1
rc=$?
echo "plain run (compile + check): $(tail -n 1 "$LOG_DIR/plain.log") rc=$rc [$(( $(date +%s) - T0 ))s]"
if [ "$rc" -ne 0 ]; then grep -E "^FAIL" "$LOG_DIR/plain.log" | head -n 10; fi

# (2) The sanitized runs.
run_tool() {
  local tool=$1 extra=() start
  case $tool in
    racecheck) extra=(--racecheck-report hazard) ;;
  esac
  start=$(date +%s)
  timeout "$TOOL_TIMEOUT" "$SAN" --tool "$tool" --print-limit "$PRINT_LIMIT" ${extra[@]+"${extra[@]}"} \
    "$PY" tools/sanitize_cases.py --no-pool -k "${CASES_K:-}" > "$LOG_DIR/sanitize_$tool.log" 2>&1
  echo "$? $(( $(date +%s) - start ))" > "$LOG_DIR/sanitize_$tool.status"
}
for t in $TOOLS; do
  rm -f "$LOG_DIR/sanitize_$t.status"
  if [ "$PARALLEL" = "1" ]; then run_tool "$t" & else run_tool "$t"; fi
done
wait

# (3) Summaries.
status=0
for t in $TOOLS; do
  log=$LOG_DIR/sanitize_$t.log
  read -r trc secs 2>/dev/null < "$LOG_DIR/sanitize_$t.status" || { trc="?"; secs="?"; }
  summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$log" 2>/dev/null | tail -n 1)
  cases=$(grep -E "^sanitize cases:" "$log" 2>/dev/null | tail -n 1)
  if [ -z "$summary" ]; then
    errors="?"
    summary="no summary line (rc=$trc: timed out after ${TOOL_TIMEOUT}s or crashed; see $log)"
  elif [[ $summary =~ \(([0-9]+)\ errors?,\ ([0-9]+)\ warnings? ]]; then  # racecheck
    errors=${BASH_REMATCH[1]}
    warnings=${BASH_REMATCH[2]}
  elif [[ $summary =~ SUMMARY:\ ([0-9]+)\ error ]]; then
    errors=${BASH_REMATCH[1]}
  else
    errors="?"
  fi
  {
    echo "$summary"
    echo "tool=$t rc=$trc time=${secs}s cases: ${cases:-no result line}"
    echo "--- first reports (full log: $log)"
    grep -E "^========= " "$log" 2>/dev/null | grep -vE "SUMMARY|^========= COMPUTE-SANITIZER$" \
      | head -n 60
    grep -E "^FAIL" "$log" 2>/dev/null | head -n 10
  } > "$OUT/sanitize_$t.txt"
  extra_info=""
  if [ "$t" = racecheck ] && [ -n "${warnings:-}" ]; then extra_info=" warnings=$warnings"; fi
  printf 'sanitize %-9s errors=%s%s  (%ss, rc=%s; %s)\n' "$t" "$errors" "$extra_info" "$secs" \
    "$trc" "${cases:-no result line}"
  if [ "$errors" != 0 ] || [ "$trc" != 0 ]; then status=1; fi
  unset warnings
done
echo "sanitize done [$(( $(date +%s) - T0 ))s]"
exit $status
