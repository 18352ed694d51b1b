#!/usr/bin/env bash
# Stop 42: the merge-capped split rule (decode.merge_split_cap) on the device -- MQA 32/1 and
# GQA 32/8 kernel time with the plan's split count (s=auto) beside forced counts, D = 64 / 128 /
# 256, bf16 and float8; then the decode GPU tests (the MQA plans changed).
set -u
OUT=${OUT:-/tmp/fa_stop42s}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
L="$OUT/dec"; mkdir -p "$L"
for args in "--heads 32/1 --dim 128 --rows 1:512,1:4096,1:32768,4:8192,16:16384" \
    "--heads 32/1 --dim 128 --kv fp8 --rows 1:4096,1:32768" \
    "--heads 32/1 --dim 64 --rows 1:4096,1:32768" "--heads 32/1 --dim 256 --rows 1:4096,1:32768" \
    "--heads 32/8 --dim 128 --rows 1:4096,1:32768"; do
  stamp "$args"
  timeout 100 python3 tools/decode_ring_probe.py $args --splits 0,16,32,64 --page 16 2>&1 \
    | tee -a "$L/probe.txt" | grep "^\["
done
stamp "decode tests"
OUT="$L/tests" PRECOMPILE=0 N=5 PYTEST_TIMEOUT=150 \
  TESTS="tests/gpu/test_gpu_decode.py tests/test_decode_steps.py tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_fp8_api.py tests/gpu/test_gpu_frontend.py tests/gpu/test_gpu_mixed.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
tar -C "$OUT" -czf "$OUT/dec.tgz" dec
stamp done
