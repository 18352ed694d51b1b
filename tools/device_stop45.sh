#!/usr/bin/env bash
# Stop 45's device calls (repo root, logs under $OUT, one archive $OUT/s45_<MODE>.tgz), in
# priority order, each step capped by what is left of BUDGET (default 560 s):
# MODE=first
#   1. the whole GPU suite, 8 shards (tools/gpu_suite_parallel.sh);
#   2. the D = 64 kernels on three consumer warpgroups (FA_SM90_WGS_64=3, 192 x 80 tiles; the
#      switch was removed after this run, benchmarks/NOTES.md stop 45): the
#      prefill / sm90 GPU tests in 8 shards under the switch, then quickbench D = 64 with and
#      without it (a define: one process per build);
#   3. bench.py D 64 / 128 / 256 x S 2k / 4k / 8k, bf16 + fp16 (issue 12's rows);
#   4. the four sanitizers on every case;
#   5. bench_decode.py, MQA 32/1 and GQA 32/8, pages 16 and 256 (issue 16).
# MODE=second: the CPU-marked tests that run kernels and the prefill tests forced to sm80
#   (device_verify_sm90.sh STEPS=eb), quickbench's D = 64 A/B once more (QB=1),
#   decode_sm90_parts.py, Nsight Compute on the swapped MQA split kernel at B = 64
#   (tools/device_stop44_ncu.sh).
# MODE=direct: the swapped decode's direct output (one split, no combine): the whole GPU suite,
#   the sanitizers on the decode cases, decode_sm90_parts.py with the LSE unread (direct where
#   the batch fills the SMs) and read (partials + combine), bench_decode.py's MQA rows, then
#   tools/prefill_gap_probe.py (issue 12's back-to-back gap).
# MODE=splitwg: FA_SM90_SPLIT_WGS=1 (the split kernels on one consumer warpgroup with more K / V
#   stages; the switch was removed after this run, benchmarks/NOTES.md stop 45): the swapped
#   decode's GPU tests and the decode sanitizer cases under the switch, then
#   decode_sm90_parts.py without and with it, alternating, twice.
set -u
MODE=${MODE:-first}
OUT=${OUT:-/tmp/fa_s45}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
W=/tmp/fa_s45; L="$W/s45_$MODE"; mkdir -p "$L"  # logs; only the archive goes to $OUT
left() { local l=$(( ${BUDGET:-560} - ($(date +%s) - T0) )); [ $l -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
QB_ROWS="64,2048,0;64,2048,1;64,4096,0;64,4096,1;64,8192,0;64,8192,1"
quickbench_ab() {  # $1: round
  for v in 2 3; do
    stamp "quickbench D = 64, FA_SM90_WGS_64=$v (round $1)"
    CUPY_FLASHATTN_SM90_DEFINES=FA_SM90_WGS_64=$v CUPY_CACHE_DIR=/tmp/fa_cache_wgs$v timeout "$(left 70)" \
      python3 tools/quickbench_sm90.py --rows "$QB_ROWS" --paged 16 --varlen > "$L/qb_wgs${v}_r$1.txt" 2>&1
    tail -n 9 "$L/qb_wgs${v}_r$1.txt"
  done
}
if [ "$MODE" = first ]; then
  stamp "whole GPU suite"
  OUT="$L/suite" N=8 PYTEST_TIMEOUT=$(left 230) bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 14
  stamp "FA_SM90_WGS_64=3: prefill / sm90 GPU tests (8 shards)"
  CUPY_FLASHATTN_SM90_DEFINES=FA_SM90_WGS_64=3 CUPY_CACHE_DIR=/tmp/fa_cache_wgs3 OUT="$L/wgs3_tests" N=8 \
    SERIAL= PYTEST_TIMEOUT=$(left 120) \
    TESTS="tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_property.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_api.py tests/gpu/test_sm90_edges.py tests/gpu/test_sm90_persistent.py tests/gpu/test_decode_sm90.py tests/gpu/test_gpu_prefix_ranges.py tests/gpu/test_gpu_empty.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 12
  quickbench_ab 1
  stamp "bench.py"
  timeout "$(left 130)" python3 benchmarks/bench.py --out "$L/bench" --dims 64,128,256 \
    --seqs 2048,4096,8192 --dtypes bf16,fp16 > "$L/bench.txt" 2>&1
  grep -E "took|Error|error" "$L/bench.txt" | tail -n 3
  stamp "sanitizers"
  OUT="$L/san" LOG_DIR="$L/san_logs" TOOL_TIMEOUT=$(left 80) timeout "$(left 110)" bash tools/sanitize.sh 2>&1 | tail -n 6
  stamp "bench_decode.py"
  timeout "$(left 70)" python3 benchmarks/bench_decode.py --rows 1:4096,1:32768,16:16384,64:4096 \
    --heads 32/1,32/8 --pages 16,256 --kv bf16 --out "$L/bd" > "$L/bench_decode.txt" 2>&1
  tail -n 20 "$L/bench_decode.txt" | grep "^|" | grep -v -- "---"
elif [ "$MODE" = direct ]; then
  stamp "whole GPU suite"
  OUT="$L/suite" N=8 PYTEST_TIMEOUT=$(left 230) bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 14
  stamp "sanitizers (decode cases)"
  OUT="$L/san" LOG_DIR="$L/san_logs" CASES_K=decode TOOL_TIMEOUT=$(left 80) timeout "$(left 110)" \
    bash tools/sanitize.sh 2>&1 | tail -n 6
  for lse in "" --lse-read; do
    stamp "decode_sm90_parts.py $lse"
    timeout "$(left 60)" python3 tools/decode_sm90_parts.py $lse \
      --rows 1:256,32:8192,48:4096,64:4096,96:2048,128:2048 > "$L/parts$lse.txt" 2>&1
    cat "$L/parts$lse.txt"
  done
  stamp "decode_sm90_parts.py B = 48 / 64, forced splits"
  for sp in 1 2; do
    timeout "$(left 40)" python3 tools/decode_sm90_parts.py --splits $sp --rows 48:4096,64:4096 2>&1 | grep -v "^empty"
  done
  stamp "bench_decode.py (MQA)"
  timeout "$(left 70)" python3 benchmarks/bench_decode.py --rows 1:4096,1:32768,16:16384,64:4096,128:2048 \
    --heads 32/1 --pages 16 --kv bf16 --out "$L/bd" > "$L/bench_decode.txt" 2>&1
  tail -n 12 "$L/bench_decode.txt" | grep "^|" | grep -v -- "---"
  stamp "prefill_gap_probe.py"
  timeout "$(left 90)" python3 tools/prefill_gap_probe.py > "$L/gap.txt" 2>&1
  cat "$L/gap.txt"
elif [ "$MODE" = splitwg ]; then
  S1="CUPY_FLASHATTN_SM90_DEFINES=FA_SM90_SPLIT_WGS=1 CUPY_CACHE_DIR=/tmp/fa_cache_swg1"
  stamp "FA_SM90_SPLIT_WGS=1: swapped decode tests (8 shards)"
  env $S1 OUT="$L/tests" N=8 SERIAL= PYTEST_TIMEOUT=$(left 150) \
    TESTS="tests/gpu/test_decode_sm90.py tests/gpu/test_gpu_frontend.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 12
  stamp "FA_SM90_SPLIT_WGS=1: sanitizers (decode cases)"
  env $S1 OUT="$L/san" LOG_DIR="$L/san_logs" CASES_K=decode TOOL_TIMEOUT=$(left 60) \
    timeout "$(left 90)" bash tools/sanitize.sh 2>&1 | tail -n 6
  ROWS=1:4096,1:32768,4:8192,16:16384,64:4096,128:2048
  for r in 1 2; do
    for v in 2 1; do
      stamp "parts, FA_SM90_SPLIT_WGS=$v (round $r)"
      CUPY_FLASHATTN_SM90_DEFINES=FA_SM90_SPLIT_WGS=$v CUPY_CACHE_DIR=/tmp/fa_cache_swg$v \
        timeout "$(left 40)" python3 tools/decode_sm90_parts.py --rows $ROWS > "$L/parts_wgs${v}_r$r.txt" 2>&1
      cat "$L/parts_wgs${v}_r$r.txt"
    done
  done
  stamp "parts --lse-read, B = 64 (two splits + combine), both builds"
  for v in 2 1; do
    CUPY_FLASHATTN_SM90_DEFINES=FA_SM90_SPLIT_WGS=$v CUPY_CACHE_DIR=/tmp/fa_cache_swg$v \
      timeout "$(left 30)" python3 tools/decode_sm90_parts.py --lse-read --rows 64:4096,16:16384 2>&1 | grep -v "^empty"
  done
else
  stamp "verify: extra + sm80-forced"
  OUT="$L/verify" STEPS=eb SM80_TIMEOUT=$(left 200) bash tools/device_verify_sm90.sh 2>&1 | tail -n 14
  [ "${QB:-0}" = 1 ] && quickbench_ab 2
  stamp "decode_sm90_parts.py"
  timeout "$(left 60)" python3 tools/decode_sm90_parts.py --rows 1:2048,1:4096,1:32768,4:8192,16:16384,64:4096 \
    > "$L/parts.txt" 2>&1
  cat "$L/parts.txt"
  stamp "ncu"
  OUT="$L/ncu" ROWS="64:4096" NCU_TIMEOUT=$(left 90) timeout "$(left 100)" bash tools/device_stop44_ncu.sh 2>&1 | tail -n 60
fi
tar -C "$W" -czf "$OUT/s45_$MODE.tgz" "s45_$MODE"
stamp done
