#!/usr/bin/env bash
# Stop 35's device calls (repo root), logs under $OUT.
#   MODE=probe (default): facts for issues 16 and 12 / 15 before any kernel change --
#     1. B = 1 decode GPU time against num_splits beside cuDNN (tools/decode_split_sweep.py);
#     2. Nsight Compute's per-instruction stall samples (SourceCounters, SASS source page as CSV)
#        of the sm90 prefill kernel, dense against paged 16 / 256 (bf16 D = 128 S = 512, the
#        paged-gap row of NOTES.md): where the paged kernel's warps wait longer.  Read the CSVs
#        with tools/ncu_source_top.py.
#   MODE=splits / MODE=ncusrc: one of the two (PAGES: the paged cases, default "0 16 256";
#     D and S: the head dim and sequence length, default 128 and 512).
#   MODE=sanitize: compute-sanitizer ($TOOLS, default memcheck racecheck) over
#     tools/sanitize_cases.py.
#   MODE=check: after a kernel change -- the whole GPU suite in shards, the sanitizers, then
#     tools/quickbench_sm90.py (sm90 dense / varlen / paged 16 / 256, $QB_ROWS) and the B = 1
#     split sweep; every log in $OUT/logs.tgz.
#   MODE=bench: the benchmarks of record for issues 12 / 15 / 16 -- bench.py bf16 D 64/128/256,
#     S 512/2k/4k (dense, sm80, varlen, paged 16 / 256); bench_decode.py (GQA 32/8, pages 16 and
#     256; B:ctx 64:4096, 16:16384, 1:512, 1:4096, 1:32768); bench_varlen.py; all in $OUT/bench.tgz.
#     DIMS, SEQS, DROWS, DPAGES, BENCH_TIMEOUT, DECODE_TIMEOUT narrow it (issue 15 alone:
#     DIMS=128 SEQS=512 DROWS=64:4096,16:16384,1:512 DPAGES=16).
# The device call brings back at most 8 files from $OUT: the ncu CSVs go into one tarball.
set -u
OUT=${OUT:-/tmp/fa_stop35}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mode=${MODE:-probe}
if [ "$mode" = probe ] || [ "$mode" = splits ]; then
  stamp "decode split sweep"
  timeout ${SPLIT_TIMEOUT:-150} python3 tools/decode_split_sweep.py ${SPLIT_ARGS:-} 2>&1 \
    | tee "$OUT/split_sweep.txt" | tail -n 6
fi
if [ "$mode" = probe ] || [ "$mode" = ncusrc ]; then
  command -v ncu >/dev/null || { echo "ncu not found"; exit 1; }
  ncu --version | tail -n 1; mkdir -p /tmp/ncu_reps
  for page in ${PAGES:-0 16 256}; do
    tag="d${D:-128}_s${S:-512}_p${page}"
    stamp "ncu source counters $tag"
    timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --target-processes all \
      --kernel-name regex:fa_fwd_sm90 --launch-skip 3 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --section SpeedOfLight \
      --export "/tmp/ncu_reps/ncu_$tag" --force-overwrite \
      python3 tools/ncu_case.py --d ${D:-128} --s ${S:-512} --paged "$page" > "$OUT/ncu_$tag.log" 2>&1
    tail -n 2 "$OUT/ncu_$tag.log"
    # The SASS source page with its per-instruction samples; the details page as a fallback.
    ncu -i "/tmp/ncu_reps/ncu_$tag.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/src_$tag.csv" 2> "$OUT/src_$tag.err" || cat "$OUT/src_$tag.err" | head -n 5
    ncu -i "/tmp/ncu_reps/ncu_$tag.ncu-rep" --page details --print-details all > "$OUT/details_$tag.txt" 2>&1
    grep -E "Duration|Warp Cycles Per Issued|Stall" "$OUT/details_$tag.txt" | head -n 12
    wc -c "$OUT/src_$tag.csv"
  done
  tar -C "$OUT" -czf "$OUT/ncu_source.tgz" $(cd "$OUT" && ls src_*.csv details_*.txt) \
    && rm -f "$OUT"/src_*.csv "$OUT"/src_*.err "$OUT"/details_*.txt "$OUT"/ncu_*.log
fi
if [ "$mode" = sanitize ]; then
  stamp "sanitize"
  OUT="$OUT" TOOL_TIMEOUT=${TOOL_TIMEOUT:-150} bash tools/sanitize.sh ${TOOLS:-memcheck racecheck} 2>&1 | tail -n 8
fi
if [ "$mode" = check ]; then
  mkdir -p "$OUT/logs"
  OUT="$OUT/logs" bash tools/gpu_suite_parallel.sh
  stamp "sanitize"
  OUT="$OUT/logs" TOOL_TIMEOUT=${TOOL_TIMEOUT:-150} bash tools/sanitize.sh ${TOOLS:-memcheck racecheck} 2>&1 | tail -n 4
  stamp "quickbench sm90"
  timeout ${QB_TIMEOUT:-150} python3 tools/quickbench_sm90.py --archs sm90 --paged 16,256 --varlen \
    --rows "${QB_ROWS:-128,512,0;128,512,1;128,2048,0;128,4096,1;64,4096,0;256,4096,0}" 2>&1 \
    | tee "$OUT/logs/quickbench.txt" | grep -v "^#"
  stamp "decode split sweep"
  timeout ${SPLIT_TIMEOUT:-120} python3 tools/decode_split_sweep.py ${SPLIT_ARGS:-} 2>&1 \
    | tee "$OUT/logs/split_sweep.txt" | tail -n 4
  tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
fi
if [ "$mode" = bench ]; then
  R="$OUT/bench"; mkdir -p "$R"
  stamp "precompile"
  timeout 120 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
  stamp "bench.py"
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench.py --dims ${DIMS:-64,128,256} \
    --seqs ${SEQS:-512,2048,4096} --dtypes bf16 --out "$R" > "$R/bench.txt" 2>&1
  grep -h "^| bf16" "$R"/*.md | grep -E "dense \||paged" | cut -d'|' -f2-10
  stamp "bench_decode"
  timeout ${DECODE_TIMEOUT:-150} python3 benchmarks/bench_decode.py --rows ${DROWS:-64:4096,16:16384,1:512,1:4096,1:32768} \
    --heads 32/8 --pages ${DPAGES:-16,256} --out "$R" > "$R/bench_decode.txt" 2>&1
  grep -v "^#" "$R/bench_decode.txt" | tail -n 24
  stamp "bench_varlen"
  timeout 90 python3 benchmarks/bench_varlen.py --out "$R" > "$R/bench_varlen.txt" 2>&1
  tail -n 6 "$R/bench_varlen.txt"
  tar -C "$OUT" -czf "$OUT/bench.tgz" bench && rm -rf "$R"
fi
stamp done
