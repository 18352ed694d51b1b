#!/usr/bin/env bash
# The verification call of a Hopper-path session, in budget order: precompile both families;
# the whole GPU suite (plus the GPU-using CPU-marked tests) on the default path (sm90 on a 9.0
# device); the prefill-relevant GPU tests forced to sm80; large offsets + the four sanitizers;
# then `bench.py` (dense = sm90, dense-sm80 beside it, varlen, paged 16/256, torch flash/cuDNN).
# Everything lands in /tmp/fa_v and comes back as one archive $OUT/verify.tgz plus a summary.
# The whole run takes ~650 s, more than one device call may: PART=a runs all but the sm80-forced
# tests (~460 s), PART=b only those (~330 s) -- two calls.
set -u
PART=${PART:-ab}
OUT=${OUT:-/tmp/fa_out}; W=/tmp/fa_v; mkdir -p "$OUT" "$W"
. "$(dirname "$0")/device_env.sh"
EXTRA="tests/test_sinks.py tests/test_decode_steps.py tests/test_failed_call_writes_nothing.py tests/test_kvcache.py tests/test_merge.py tests/test_rotary.py tests/test_plan.py tests/test_nan.py tests/test_empty.py tests/test_prefix_ranges.py tests/test_large_head_dims.py"
{
stamp "precompile"
timeout 200 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
if [[ $PART == *a* ]]; then
stamp "GPU suite, default path"
timeout ${SUITE_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu $EXTRA > "$W/pytest_default.txt" 2>&1
grep -E "passed|failed|FAILED|ERROR" "$W/pytest_default.txt" | tail -n 12
fi
if [[ $PART == *b* ]]; then
stamp "prefill GPU tests forced to sm80"
CUPY_FLASHATTN_PREFILL_ARCH=sm80 timeout ${SM80_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -rfE \
  tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_property.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_api.py > "$W/pytest_sm80.txt" 2>&1
grep -E "passed|failed|FAILED|ERROR" "$W/pytest_sm80.txt" | tail -n 8
fi
if [[ $PART == *a* ]]; then
stamp "large offsets + sanitizers"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE -k large_offsets tests/gpu/test_gpu_large_offsets.py > "$W/large_offsets.txt" 2>&1; tail -n 2 "$W/large_offsets.txt"
OUT=$W LOG_DIR=$W/sanitize_logs timeout 330 bash tools/sanitize.sh 2>&1 | tail -n 6
stamp "bench"
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench.py --out "$W/bench" ${BENCH_ARGS:---dims 64,128,256 --seqs 2048,4096,8192 --dtypes bf16,fp16} > "$W/bench.txt" 2>&1
grep -E "took|Error|error" "$W/bench.txt" | tail -n 5
fi
stamp "done"
} 2>&1 | tee "$W/summary.txt"
tar czf "$OUT/verify.tgz" -C "$W" . 2>/dev/null
cp "$W/summary.txt" "$OUT/summary.txt"
