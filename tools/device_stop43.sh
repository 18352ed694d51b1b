#!/usr/bin/env bash
# Stop 43's first device call (repo root, logs under $OUT): MQA decode on the sm90 split-KV
# kernel with swapped rows (_cuda/decode_sm90.py), verified and measured.
#   1. (~1 min) compile the split kernels and the decode kernels in parallel processes.
#   2. (~2-3 min) the swapped-decode, decode, front-end, mixed-batch and decode-step GPU tests
#      (6 shards).
#   3. (~1.5 min) kernel time, MQA 32/1 D = 128 page 16: swapped with the plan's split count
#      and forced counts, against CUPY_FLASHATTN_DECODE_SM90=0 (the mma.sync decode kernel);
#      cuDNN beside.
#   4. (~2 min) memcheck / racecheck / initcheck / synccheck on the MQA decode cases.
#   5. (~2 min, BENCH=0 skips) benchmarks/bench_decode.py, MQA and GQA rows (issue 16).
set -u
OUT=${OUT:-/tmp/fa_stop43}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
L="$OUT/s43"; mkdir -p "$L"
stamp "compile split + decode kernels"
timeout 200 python3 - <<'PY' 2>&1 | tail -n 3
import dataclasses
from concurrent.futures import ProcessPoolExecutor

def build(fields):
    from cupy_flashattn._cuda import compile as cc
    cc.get_kernel(cc.KernelKey(*fields))

def decode(_):
    from cupy_flashattn._cuda import decode as dc
    return len(dc.precompile_decode())

if __name__ == "__main__":
    from cupy_flashattn._cuda import compile as cc
    keys = [dataclasses.astuple(k) for k in cc.shipped_keys("sm90") if k.split or (k.paged and not k.transform)]
    with ProcessPoolExecutor(14) as ex:
        fs = [ex.submit(build, k) for k in keys] + [ex.submit(decode, 0)]
        for f in fs:
            f.result()
    print(f"compiled {len(keys)} sm90 keys + decode")
PY
stamp "tests"
OUT="$L/tests" PRECOMPILE=0 N=6 PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-220} SERIAL="" \
  TESTS="tests/gpu/test_decode_sm90.py tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_frontend.py tests/gpu/test_gpu_mixed.py tests/test_plan.py tests/test_decode_sm90_plan.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 12
for sw in 1 0; do
  stamp "MQA 32/1 D = 128 page 16 [DECODE_SM90=$sw]"
  CUPY_FLASHATTN_DECODE_SM90=$sw timeout 150 python3 tools/decode_ring_probe.py \
    --rows 64:4096,16:16384,4:8192,1:4096,1:32768 --splits-all \
    --splits $([ $sw = 1 ] && echo ${SPLITS:-0,2,4,8,16,32} || echo 0) --heads 32/1 --dim 128 --page 16 \
    $([ $sw = 1 ] || echo --no-peer) 2>&1 | tee -a "$L/probe.txt" | grep "^\["
done
stamp "sanitizers, MQA decode cases"
OUT="$L/san" TOOL_TIMEOUT=100 CASES_K=MQA bash tools/sanitize.sh 2>&1 | tail -n 6
if [ "${BENCH:-1}" = 1 ]; then
  stamp "bench_decode.py (MQA and GQA, page 16, bf16 cache)"
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_decode.py --rows 1:4096,1:32768,16:16384,64:4096 \
    --heads 32/1,32/8 --pages 16 --kv bf16 --out "$L/bd" > "$L/bench_decode.txt" 2>&1
  tail -n 4 "$L/bench_decode.txt"
fi
tar -C "$OUT" -czf "$OUT/s43.tgz" s43
stamp done
