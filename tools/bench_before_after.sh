#!/usr/bin/env bash
# One device call that times the SAME quick benchmarks on two trees, so a kernel change is
# judged against its baseline in one process environment (same GPU, clocks, torch):
#   BASE=<tarball of the baseline tree, e.g. git archive -o .baseline.tgz <rev>>
#   OUT=$OUT BASE=.baseline.tgz bash tools/bench_before_after.sh
# Runs, per tree: precompile, bench_decode --quick, bench --quick, bench_varlen (baseline first,
# then this tree, then the baseline's prefill again to see drift); writes each tree's CSVs under
# $RUNS/<tree>/ (archived to $OUT/runs.tgz) and prints tools/compare_bench.py's table (this tree / baseline per row).
# EXTRA="--dims 64,256 --seqs 4096" adds one more bench.py run per tree (rows --quick lacks),
# under <tree>/extra.
set -u
OUT=${OUT:-/tmp/fa_ba}; mkdir -p "$OUT"
RUNS=/tmp/fa_ba_runs; rm -rf "$RUNS"  # per-tree outputs; they come back as one archive
BASE_DIR=/tmp/fa_base; rm -rf "$BASE_DIR"; mkdir -p "$BASE_DIR"; tar xzf "${BASE:-.baseline.tgz}" -C "$BASE_DIR"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
HERE=$(pwd)
run_tree() {  # tree-dir label [prefill-only]
  local dir=$1 label=$2 out="$RUNS/$2"; mkdir -p "$out"
  ( cd "$dir" && export PYTHONPATH=. CUPY_CACHE_DIR=/tmp/fa_cache_$label
    python3 tools/precompile_parallel.py > /dev/null 2>&1
    if [ -z "${3:-}" ]; then
      stamp "$label bench_decode"; timeout 150 python3 benchmarks/bench_decode.py --quick --out "$out" > "$out/decode.txt" 2>&1
      stamp "$label bench_varlen"; timeout 90 python3 benchmarks/bench_varlen.py --out "$out" > "$out/varlen.txt" 2>&1
    fi
    stamp "$label bench --quick"; timeout 150 python3 benchmarks/bench.py --quick --out "$out" > "$out/prefill.txt" 2>&1
    if [ -n "${EXTRA:-}" ] && [ -z "${3:-}" ]; then
      stamp "$label bench $EXTRA"; timeout 200 python3 benchmarks/bench.py $EXTRA --out "$out/extra" > "$out/extra.txt" 2>&1
    fi )
}
run_tree "$BASE_DIR" base
run_tree "$HERE" new
run_tree "$BASE_DIR" base2 prefill-only
stamp "compare"
{ python3 tools/compare_bench.py "$RUNS/base" "$RUNS/new" "$RUNS/base2"
  if [ -n "${EXTRA:-}" ]; then echo; echo "== extra: $EXTRA"; python3 tools/compare_bench.py "$RUNS/base/extra" "$RUNS/new/extra"; fi
} | tee "$OUT/compare.txt"
tar czf "$OUT/runs.tgz" --exclude='*.png' -C /tmp fa_ba_runs
