#!/usr/bin/env bash
# Stop 38's device calls (repo root), logs under $OUT (at most 8 files come back: tarred).
# Stop 38 itself got no device time (its budget was spent by refused starts); these are the
# next session's calls, planned to run back to back on one warm machine (idle release 30 s):
#
# MODE=confirm (call 1, ~5 min): issue 15's rows of record after the last decode change (the
#   small-grid split rule, 7ec2e9b): MODE=confirm bash tools/device_stop37.sh -- the decode,
#   float8 decode and front-end GPU tests, bench_decode.py (64:4096, 1:512, 1:4096, 1:32768,
#   bf16 + float8), bench_varlen.py, bench.py D = 128 S = 512, quickbench paged D = 256.
# MODE=sweep (call 2, ~6 min): issue 16's occupancy sweep of the decode kernel through its sweep
#   switches (flash_decode.cu; NVRTC sm_90 registers in the comment there), kernel time by
#   tools/decode_ring_probe.py (page 16, split rule's count), then the decode and float8 decode
#   GPU tests under the variant that adds CTAs:
#     default;
#     fp8ctas:  float8 D = 64 / 128 / 256 at 5 / 4 / 2 CTAs per SM (B = 64, 8 kv heads: 512 CTAs
#               on 528 slots instead of 396, and 16 warps per SM to hide the per-tile latency
#               that bounds float8; D = 64 at 5 spills 44 bytes);
#     stages2:  D = 128 ring of 2 slots per warp, the 16-bit kernel at 3 CTAs per SM (12 warps
#               with one tile in flight each instead of 8 with two).
# MODE=coverage (call 3, ~4 min): issue 16's named shapes through bench_decode.py -- B = 64
#   ctx 4096 at GQA ratios 1 / 4 / 8 and MQA (32/32, 32/8, 32/4, 32/1) over pages 1, 8, 16, 64,
#   256, bf16 (the ">= 0.95 of copy" rows), and B = 1 at ctx 4096 / 32768 beside cuDNN.
set -u
OUT=${OUT:-/tmp/fa_stop38}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
if [ "${MODE:-confirm}" = confirm ]; then
  MODE=confirm OUT="$OUT" bash tools/device_stop37.sh
  exit $?
fi
if [ "$MODE" = coverage ]; then
  R="$OUT/coverage"; mkdir -p "$R"
  stamp "bench_decode: issue 16's head ratios and page sizes"
  timeout 400 python3 benchmarks/bench_decode.py --rows 64:4096 --heads 32/32,32/8,32/4,32/1 \
    --pages 1,8,16,64,256 --kv bf16 --out "$R" > "$R/bench_decode.txt" 2>&1
  grep "^| [0-9]" "$R/bench_decode.txt" | cut -d"|" -f2-10,12-13,16-19
  mkdir -p "$R/b1"
  timeout 150 python3 benchmarks/bench_decode.py --rows 1:4096,1:32768 --heads 32/8 --pages 16 \
    --kv bf16,fp8 --out "$R/b1" > "$R/b1/bench_decode.txt" 2>&1
  grep "^| [0-9]" "$R/b1/bench_decode.txt" | cut -d"|" -f2-10,12-13,16-19
  tar -C "$OUT" -czf "$OUT/coverage.tgz" coverage && rm -rf "$R"
  stamp done
  exit 0
fi
L="$OUT/sweep"; mkdir -p "$L"
FP8CTAS="FA_DECODE_FP8_CTAS_D64=5,FA_DECODE_FP8_CTAS_D128=4,FA_DECODE_FP8_CTAS_D256=2"
STAGES2="FA_DECODE_STAGES_D128=2,FA_DECODE_CTAS_D128=3"
probe() {  # $1 defines ("" = default), then decode_ring_probe.py arguments
  local defs=$1; shift
  CUPY_FLASHATTN_SM90_DEFINES="$defs" timeout 90 python3 tools/decode_ring_probe.py \
    --rows ${SROWS:-64:4096,16:16384,1:4096} --splits 0 "$@" 2>&1 | tee -a "$L/probe.txt" | grep "^\["
}
stamp "default, with cuDNN (bf16 K/V) beside"
probe "" --kv bf16 --dim 128
probe "" --kv fp8 --dim 128 --no-peer
for d in 64 256; do probe "" --kv fp8 --dim $d --no-peer; done
stamp "fp8ctas"
for d in 64 128 256; do probe "$FP8CTAS" --kv fp8 --dim $d --no-peer; done
stamp "stages2"
probe "$STAGES2" --kv bf16 --dim 128 --no-peer
probe "$STAGES2" --kv fp8 --dim 128 --no-peer
stamp "decode GPU tests under fp8ctas"
CUPY_FLASHATTN_SM90_DEFINES="$FP8CTAS" OUT="$L/tests_fp8ctas" SERIAL= PRECOMPILE=0 PYTEST_TIMEOUT=120 \
  TESTS="tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_fp8_decode.py" \
  bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
tar -C "$OUT" -czf "$OUT/sweep.tgz" sweep && rm -rf "$L"
stamp done
