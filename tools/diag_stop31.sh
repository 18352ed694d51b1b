#!/usr/bin/env bash
# Stop 31's sm90 A/B call: quickbench (dense, varlen with equal lengths, paged 16 / 256;
# TFLOP/s back to back) per variant of the tuning switches of sm90/kernel_traits.cuh.
#   VARIANTS="default FA_SM90_DIAG_NO_LOADS=1 ..." (space separated; "default" = no -D).
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
for v in ${VARIANTS:-default}; do
  [ "$v" = default ] && v=""
  export CUPY_FLASHATTN_SM90_DEFINES="$v"
  stamp "variant '$v'"
  timeout 120 python3 tools/quickbench_sm90.py --archs sm90 --no-torch --varlen --paged 16,256 ${QB_ARGS:-} \
    --rows "${ROWS:-128,512,0;128,512,1;128,2048,0}" 2>&1 | tail -n 3
done
stamp done
