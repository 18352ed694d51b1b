#!/usr/bin/env bash
# The verification call of a Hopper-path session, in budget order (~5 min on an H100, one call):
# the whole GPU suite in shards (tools/gpu_suite_parallel.sh: precompile of both families, 6
# pytest processes, then the large-offset tests alone) on the default path (sm90 on a 9.0
# device), then the CPU-marked tests that run kernels here; the prefill-relevant GPU tests
# forced to sm80, in shards; the four sanitizers on every sanitize case; then `bench.py`
# (dense = sm90, dense-sm80 beside it, varlen, paged 16/256, torch flash/cuDNN).  Everything lands in /tmp/fa_v and comes back as one archive
# $OUT/verify.tgz plus a summary.  (Until stop 42 the suite ran in one pytest process, which
# no longer fits its 330 s: stop 42's run 2 stopped at 53%.)  STEPS picks the steps, in this
# order: s (the suite, default path), e (the CPU-marked tests that run kernels), b (prefill
# tests forced to sm80), z (sanitizers), p (bench.py); the default is all of them.  The older
# PART=a means STEPS=sezp, PART=b STEPS=b.
set -u
case ${PART:-} in a) STEPS=${STEPS:-sezp} ;; b) STEPS=${STEPS:-b} ;; esac
STEPS=${STEPS:-sebzp}
OUT=${OUT:-/tmp/fa_out}; W=/tmp/fa_v; mkdir -p "$OUT" "$W"
. "$(dirname "$0")/device_env.sh"
EXTRA="tests/test_sinks.py tests/test_decode_steps.py tests/test_failed_call_writes_nothing.py tests/test_kvcache.py tests/test_merge.py tests/test_rotary.py tests/test_plan.py tests/test_nan.py tests/test_empty.py tests/test_prefix_ranges.py tests/test_large_head_dims.py"
{
if [[ $STEPS == *s* ]]; then
stamp "GPU suite, default path (shards)"
OUT="$W/suite_default" PYTEST_TIMEOUT=${SUITE_TIMEOUT:-300} bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 12
fi
if [[ $STEPS == *e* ]]; then
# The CPU-marked tests that run kernels where a GPU is present (the shards take -m gpu only).
stamp "GPU-using CPU-marked tests"
timeout ${EXTRA_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -rfE $EXTRA > "$W/pytest_extra.txt" 2>&1
grep -E "passed|failed|FAILED|ERROR" "$W/pytest_extra.txt" | tail -n 6
fi
if [[ $STEPS == *b* ]]; then
stamp "prefill GPU tests forced to sm80 (shards)"
CUPY_FLASHATTN_PREFILL_ARCH=sm80 OUT="$W/suite_sm80" PRECOMPILE=0 SERIAL= \
  PYTEST_TIMEOUT=${SM80_TIMEOUT:-240} \
  TESTS="tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_property.py tests/gpu/test_gpu_nan.py tests/gpu/test_gpu_mixed.py tests/gpu/test_gpu_api.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
fi
if [[ $STEPS == *z* ]]; then
stamp "sanitizers"
OUT=$W LOG_DIR=$W/sanitize_logs timeout ${SAN_TIMEOUT:-330} bash tools/sanitize.sh 2>&1 | tail -n 6
fi
if [[ $STEPS == *p* ]]; then
stamp "bench"
timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench.py --out "$W/bench" ${BENCH_ARGS:---dims 64,128,256 --seqs 2048,4096,8192 --dtypes bf16,fp16} > "$W/bench.txt" 2>&1
grep -E "took|Error|error" "$W/bench.txt" | tail -n 5
fi
stamp "done"
} 2>&1 | tee "$W/summary.txt"
tar czf "$OUT/verify.tgz" -C "$W" . 2>/dev/null
cp "$W/summary.txt" "$OUT/summary.txt"
