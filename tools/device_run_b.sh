#!/usr/bin/env bash
# Second device call of a verification session: the large-offset GPU tests, the four
# compute-sanitizer tools, then the quick user-visible benchmarks (decode, prefill, varlen).
# PHASE=tests|bench|all.  Everything lands in /tmp/fa_b and comes back as ONE archive
# ($OUT/run_b_$PHASE.tgz; the device returns at most 8 files) plus a summary.
set -u
OUT=${OUT:-/tmp/fa_out}; W=/tmp/fa_b; mkdir -p "$OUT" "$W"
. "$(dirname "$0")/device_env.sh"
PHASE=${PHASE:-all}  # tests (large offsets + sanitizers), bench, or all
{
if [ "$PHASE" != bench ]; then
stamp "large offsets"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE -k large_offsets \
  tests/gpu/test_gpu_large_offsets.py > "$W/large_offsets.txt" 2>&1; tail -n 3 "$W/large_offsets.txt"
stamp "sanitizers"
OUT=$W LOG_DIR=$W/sanitize_logs timeout 330 bash tools/sanitize.sh 2>&1 | tail -n 8
fi
if [ "$PHASE" != tests ]; then
stamp "bench_decode --quick"
timeout 150 python3 benchmarks/bench_decode.py --quick --out "$W/bench" > "$W/bench_decode.txt" 2>&1
grep -E "B=|Error|error" "$W/bench_decode.txt" | head -n 20
stamp "bench --quick"
timeout 150 python3 benchmarks/bench.py --quick --out "$W/bench" > "$W/bench.txt" 2>&1
grep -E "seqlen=|Error|error" "$W/bench.txt" | head -n 20
stamp "bench_varlen"
timeout 90 python3 benchmarks/bench_varlen.py --out "$W/bench" > "$W/bench_varlen.txt" 2>&1
cat "$W/bench_varlen.txt" | tail -n 8
fi
stamp "done"
} 2>&1 | tee "$OUT/run_b_$PHASE.txt"
tar czf "$OUT/run_b_$PHASE.tgz" -C /tmp --exclude=fa_b/sanitize_logs fa_b
