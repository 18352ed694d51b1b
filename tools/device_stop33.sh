#!/usr/bin/env bash
# Stop 33's device calls (repo root), logs under $OUT.
#   MODE=verify (default): precompile every kernel, the prefill GPU tests (sm90 on a 9.0 device:
#     edges, persistent schedule, kernels, mixed batches, NaN, API, empty, offsets, prefix
#     ranges, properties, front end), then compute-sanitizer ($TOOLS, default memcheck racecheck).
#   MODE=bench: benchmarks/bench.py bf16 D 64/128/256 S 2k/4k/8k (the benchmark of record's
#     table, CSV and plots into $OUT/results), then quickbench's paged / varlen columns.
#   MODE=rest: every other `gpu` test (decode, float8, float32/64, head dims 384/512, ...).
#   MODE=suite: the whole `gpu` suite in $N parallel shards (tools/gpu_suite_parallel.sh);
#     MODE=suite80: the same with prefill forced to the sm80 family (CUPY_FLASHATTN_PREFILL_ARCH),
#     so the suite has run on both paths (issue 12).
#   MODE=widecheck: where the wide D=128 tile starts to pay (compile.SM90_WIDE_MIN_KEYS):
#     quickbench non-causal D=128 S 512 .. 8k as shipped, with 176-key tiles everywhere
#     (FA_SM90_BLOCKN_128=176) and with 128-key tiles everywhere (FA_SM90_BLOCKN_128_WIDE=128).
#   MODE=fused: the fused split combine (flash_decode.cu FA_DECODE_FUSED_COMBINE; device-verified
#     on an H100 2026-12-06 and on by default since): the decode GPU tests on the A/B baseline
#     (FA_DECODE_FUSED_COMBINE=0, the combine kernel everywhere; test_fused_combine_switch picks
#     both builds itself), then bench_decode's B = 1 / 16 rows as shipped and with =0 (one
#     process each).
#   MODE=splits: B = 1 decode GPU time against num_splits, beside cuDNN (tools/decode_split_sweep.py).
#   MODE=fp8direct: the float8 GPU tests, then bench_decode's fp8 / bf16 rows.  (Historical
#     name: it compared FA_DECODE_FP8_DIRECT=1 with the float16 staging tile; on an H100
#     2026-12-06 the 44 float8 GPU tests passed and the direct fragments were faster, so they are
#     now the only float8 path and the switch is gone.)
set -u
OUT=${OUT:-/tmp/fa_stop33}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mode=${MODE:-verify}
PREFILL_TESTS="tests/gpu/test_sm90_edges.py tests/gpu/test_sm90_persistent.py tests/gpu/test_gpu_kernels.py
  tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_api.py tests/gpu/test_gpu_empty.py
  tests/gpu/test_gpu_large_offsets.py tests/gpu/test_gpu_prefix_ranges.py tests/gpu/test_gpu_property.py
  tests/gpu/test_gpu_frontend.py"
if [ "$mode" = verify ] || [ "$mode" = rest ]; then
  stamp "precompile"
  timeout 200 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
fi
if [ "$mode" = verify ]; then
  stamp "pytest: prefill GPU tests"
  timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE $PREFILL_TESTS \
    > "$OUT/pytest_prefill.txt" 2>&1
  grep -E "passed|failed|FAILED|ERROR|Error|Timeout" "$OUT/pytest_prefill.txt" | tail -n 20
  stamp "sanitize"
  OUT="$OUT" TOOL_TIMEOUT=${TOOL_TIMEOUT:-150} bash tools/sanitize.sh ${TOOLS:-memcheck racecheck} 2>&1 | tail -n 8
fi
if [ "$mode" = rest ]; then
  ignore=""; for f in $PREFILL_TESTS; do ignore+=" --ignore=$f"; done
  stamp "pytest: the other GPU tests"
  timeout ${PYTEST_TIMEOUT:-400} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu $ignore \
    > "$OUT/pytest_rest.txt" 2>&1
  grep -E "passed|failed|FAILED|ERROR|Error|Timeout" "$OUT/pytest_rest.txt" | tail -n 20
fi
if [ "$mode" = suite ]; then
  OUT="$OUT" bash tools/gpu_suite_parallel.sh
fi
if [ "$mode" = suite80 ]; then
  CUPY_FLASHATTN_PREFILL_ARCH=sm80 OUT="$OUT" bash tools/gpu_suite_parallel.sh
fi
if [ "$mode" = widecheck ]; then
  wrows="128,512,0;128,1024,0;128,2048,0;128,3072,0;128,4096,0;128,8192,0"
  for v in "" "FA_SM90_BLOCKN_128=176" "FA_SM90_BLOCKN_128_WIDE=128"; do
    stamp "quickbench '${v:-as shipped}'"
    CUPY_FLASHATTN_SM90_DEFINES="$v" timeout 200 python3 tools/quickbench_sm90.py --archs sm90 \
      --no-torch --rows "$wrows" 2>&1 | tail -n 6
  done
fi
if [ "$mode" = fused ]; then
  rows=${ROWS:-1:4096,1:32768,16:16384}
  stamp "decode tests, FA_DECODE_FUSED_COMBINE=0 (the default build runs in MODE=suite)"
  CUPY_FLASHATTN_SM90_DEFINES=FA_DECODE_FUSED_COMBINE=0 timeout 240 python3 -m pytest -m gpu -q \
    -p no:cacheprovider -rfE tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_fp8_decode.py \
    tests/gpu/test_gpu_frontend.py > "$OUT/pytest_fused.txt" 2>&1
  tail -n 2 "$OUT/pytest_fused.txt"; grep -m 10 FAILED "$OUT/pytest_fused.txt"
  for v in "" "FA_DECODE_FUSED_COMBINE=0"; do
    stamp "bench_decode '${v:-fused combine, as shipped}'"
    CUPY_FLASHATTN_SM90_DEFINES="$v" timeout 120 python3 benchmarks/bench_decode.py --rows "$rows" \
      --heads 32/8 --pages 16 --out "$OUT/bd_fused${v:+_off}" > "$OUT/bd_fused${v:+_off}.txt" 2>&1
    grep -E "^\| [0-9]" "$OUT/bd_fused${v:+_off}.txt" | cut -d'|' -f2-8,12-19
  done
fi
if [ "$mode" = splits ]; then
  stamp "decode split sweep"
  timeout 200 python3 tools/decode_split_sweep.py 2>&1 | tee "$OUT/split_sweep.txt" | tail -n 4
fi
if [ "$mode" = fp8direct ]; then
  rows=${ROWS:-64:4096,16:16384,1:4096}
  stamp "float8 tests"
  timeout 200 python3 -m pytest -m gpu -q \
    -p no:cacheprovider -rfE tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_fp8_api.py \
    > "$OUT/pytest_fp8_direct.txt" 2>&1
  tail -n 2 "$OUT/pytest_fp8_direct.txt"; grep -m 10 FAILED "$OUT/pytest_fp8_direct.txt"
  stamp "bench_decode fp8 and bf16"
  timeout 150 python3 benchmarks/bench_decode.py --rows "$rows" --heads 32/8 --pages 16,256 \
    --kv fp8,bf16 --out "$OUT/bd_default" > "$OUT/bd_default.txt" 2>&1
  grep -E "^\| [0-9]" "$OUT/bd_default.txt" | cut -d'|' -f2-8,16,17,18,19
fi
if [ "$mode" = bench ]; then
  stamp "bench.py"
  mkdir -p "$OUT/results"
  timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/bench.py --dims ${DIMS:-64,128,256} --seqs ${SEQS:-2048,4096,8192} \
    --dtypes ${DTYPES:-bf16} --out "$OUT/results" > "$OUT/bench.txt" 2>&1
  grep -h "^| bf16\|^| fp16" "$OUT"/results/h*.md | cut -c1-200 | head -n 60
  stamp "quickbench: varlen / paged columns"
  timeout 120 python3 tools/quickbench_sm90.py --archs sm90 --no-torch --varlen --paged 16,256 \
    --rows "128,512,0;128,512,1;128,2048,0;128,2048,1;256,2048,0" 2>&1 | tail -n 6
fi
stamp done
