#!/usr/bin/env bash
# Stop 37's device calls (repo root), logs under $OUT (at most 8 files come back: tarred).
# MODE=record (default, run 1):
#   1. issue 15's rows of record: MODE=record bash tools/device_stop36.sh (bench_decode,
#      bench_varlen, bench.py per $BENCH_SETS, the front-end GPU tests, quickbench of paged
#      D = 256, the B = 1 decode timeline);
#   2. the B = 1 timeline again on a contiguous cache and at forced split counts 8 / 32;
#   3. the page pool's layout (issue 16, float8 at 0.66-0.77 of copy): tools/decode_ring_probe.py
#      over vLLM's (pages, P, Hk, D) pool and FlashInfer's (pages, Hk, P, D), bf16 and float8.
# MODE=check (run 2, after the fused merge's change, issue 16): the whole GPU suite in shards,
#   memcheck + racecheck, the B = 1 timeline at the heuristic's and forced split counts, then
#   bench_decode.py ($DROWS, page 16, bf16 and float8); logs.tgz, bench.tgz.
# MODE=confirm (run 3, after the split rule's change): the decode and front-end GPU tests,
#   bench_decode.py on issue 15's decode rows and the B = 1 rows (bf16 and float8),
#   bench_varlen.py and bench.py D = 128 S = 512 (issue 15's prefill rows, all in this run), and
#   quickbench of paged D = 256 (page 16) at S = 4000 / 2000 (multiples of 80: no gathered
#   sequence-end tile) beside 4096 / 2048 (QB=0 skips it); bench.tgz.
#   CTESTS, DROWS, KVS narrow the tests, decode rows and KV dtypes when device time is short.
#   (Not yet run: the device budget of this stop's second session went to a refused start.
#   The next session runs it first, then sweep and coverage on the same warm machine.)
# (Since stop 38 the late table is the kernel's only order and the release counter is gone:
#  their defines no longer change the build, so MODE=sweep's "late" and "release" rows now
#  time the default.)
# MODE=sweep (~7 min): issue 16's occupancy sweep of the decode kernel through its sweep
#   switches (flash_decode.cu; NVRTC sm_90 registers in the comment there), kernel time by
#   tools/decode_ring_probe.py (page 16, the split rule's count), then the decode and float8
#   decode GPU tests under the variants (the switches off by default are tried here only):
#     default;
#     fp8ctas:  float8 D = 128 / 256 at 4 / 2 CTAs per SM (B = 64, 8 kv heads: 512 CTAs on 528
#               slots instead of 396, and 16 warps per SM; D = 64 at 5 spills 44 bytes, so its
#               probe is left out), also with late;
#     stages2:  D = 128 ring of 2 slots per warp, the 16-bit kernel at 3 CTAs per SM (12 warps
#               with one tile in flight each instead of 8 with two);
#     release:  the split counter ordered by one thread's fence.acq_rel (CUTLASS's semaphore)
#               instead of every thread's __threadfence -- B = 1 timeline (stores -> counter)
#               and kernel time at ctx 512 / 4096 / 32768.
#     late:     FA_DECODE_LATE_TABLE -- the next tile's page ids loaded one iteration ahead and
#               used only when its copies are issued (the SASS had every paged iteration wait
#               out a table load before its tile), bf16 and float8, beside page 256's rows;
#   the decode tests then run under fp8ctas, release and late together.  Also float8 D = 128 at
#   forced split counts 1-4 for B = 64 / 16 (waves against occupancy: is the B = 64 float8 row
#   bound by its 2.6-wave tail -- 1024 CTAs on 396 slots -- rather than by the kernel?).
# MODE=coverage (~4 min): issue 16's named shapes through bench_decode.py -- B = 64 ctx 4096 at
#   GQA ratios 1 / 4 / 8 and MQA (32/32, 32/8, 32/4, 32/1) over pages 1, 8, 16, 64, 256, bf16
#   (the ">= 0.95 of copy" rows), and B = 1 at ctx 4096 / 32768 beside cuDNN.
set -u
OUT=${OUT:-/tmp/fa_stop37}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
if [ "${MODE:-record}" = coverage ]; then
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
if [ "${MODE:-record}" = sweep ]; then
  L="$OUT/sweep"; mkdir -p "$L"
  FP8CTAS="FA_DECODE_FP8_CTAS_D64=5,FA_DECODE_FP8_CTAS_D128=4,FA_DECODE_FP8_CTAS_D256=2"
  STAGES2="FA_DECODE_STAGES_D128=2,FA_DECODE_CTAS_D128=3"
  RELEASE="FA_DECODE_COUNTER_RELEASE=1"
  LATE="FA_DECODE_LATE_TABLE=1"
  probe() {  # $1 defines ("" = default), then decode_ring_probe.py arguments
    local defs=$1; shift
    CUPY_FLASHATTN_SM90_DEFINES="$defs" timeout 90 python3 tools/decode_ring_probe.py \
      --rows ${SROWS:-64:4096,16:16384,1:4096} --splits 0 "$@" 2>&1 | tee -a "$L/probe.txt" | grep "^\["
  }
  stamp "default, with cuDNN (bf16 K/V) beside; page 256 for the page-16 gap"
  probe "" --kv bf16 --dim 128
  probe "" --kv bf16 --dim 128 --no-peer --page 256 --rows 64:4096,16:16384
  probe "" --kv fp8 --dim 128 --no-peer
  probe "" --kv fp8 --dim 256 --no-peer
  stamp "late table"
  probe "$LATE" --kv bf16 --dim 128 --no-peer
  probe "$LATE" --kv fp8 --dim 128 --no-peer
  stamp "float8 D = 128 waves: forced splits at 3 CTAs per SM (B = 64: 2 splits = 2.6 waves)"
  probe "" --kv fp8 --dim 128 --no-peer --rows 64:4096,16:16384 --splits 0,1,2,3,4 --splits-all
  stamp "fp8ctas"
  for d in 128 256; do probe "$FP8CTAS" --kv fp8 --dim $d --no-peer; done
  probe "$FP8CTAS,$LATE" --kv fp8 --dim 128 --no-peer
  stamp "stages2"
  probe "$STAGES2" --kv bf16 --dim 128 --no-peer
  probe "$STAGES2" --kv fp8 --dim 128 --no-peer
  for d in "" "$RELEASE"; do
    stamp "B = 1 timeline [${d:-default}]"
    CUPY_FLASHATTN_SM90_DEFINES="$d" timeout 60 python3 tools/decode_timeline.py \
      --rows 1:512,1:4096,1:32768 2>&1 | tee -a "$L/timeline.txt" | grep "^B="
    probe "$d" --kv bf16 --dim 128 --no-peer --rows 1:512,1:4096,1:32768
  done
  stamp "decode GPU tests under fp8ctas + release + late table"
  CUPY_FLASHATTN_SM90_DEFINES="$FP8CTAS,$RELEASE,$LATE" OUT="$L/tests_variants" SERIAL= PYTEST_TIMEOUT=150 \
    TESTS="tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_fp8_decode.py" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
  tar -C "$OUT" -czf "$OUT/sweep.tgz" sweep && rm -rf "$L"
  stamp done
  exit 0
fi
if [ "${MODE:-record}" = confirm ]; then
  R="$OUT/bench"; mkdir -p "$R"
  stamp "decode GPU tests"
  OUT="$R/tests" SERIAL= PYTEST_TIMEOUT=150 \
    TESTS="${CTESTS:-tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_fp8_decode.py tests/gpu/test_gpu_frontend.py}" \
    bash tools/gpu_suite_parallel.sh 2>&1 | tail -n 8
  stamp "bench_decode"
  timeout 150 python3 benchmarks/bench_decode.py --rows ${DROWS:-64:4096,1:512,1:4096,1:32768} \
    --heads 32/8 --pages 16 --kv ${KVS:-bf16,fp8} --out "$R" > "$R/bench_decode.txt" 2>&1
  grep "^| [0-9]" "$R/bench_decode.txt" | cut -d"|" -f2-10,12-13,16-19
  stamp "bench_varlen"
  timeout 90 python3 benchmarks/bench_varlen.py --out "$R" > "$R/bench_varlen.txt" 2>&1
  tail -n 4 "$R/bench_varlen.txt" | cut -c1-200
  stamp "bench.py D = 128 S = 512"
  mkdir -p "$R/prefill_d128_s512"
  timeout 120 python3 benchmarks/bench.py --dims 128 --seqs 512 --dtypes bf16 --out "$R/prefill_d128_s512" \
    > "$R/prefill_d128_s512/bench.txt" 2>&1
  grep -h "^| bf16" "$R/prefill_d128_s512"/*.md | grep -E "dense \||paged|varlen" | cut -d'|' -f2-10
  if [ "${QB:-1}" = 1 ]; then  # QB=0 leaves issue 12's probe out when device time is short
    stamp "quickbench paged D = 256"
    timeout 100 python3 tools/quickbench_sm90.py --archs sm90 --paged 16 \
      --rows "256,4000,0;256,4096,0;256,2000,0;256,2048,0" 2>&1 | tee "$R/quickbench_d256.txt" | grep -v "^#"
  fi
  tar -C "$OUT" -czf "$OUT/bench.tgz" bench && rm -rf "$R"
  stamp done
  exit 0
fi
if [ "${MODE:-record}" = check ]; then
  L="$OUT/logs"; mkdir -p "$L"
  OUT="$L" PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-240} bash tools/gpu_suite_parallel.sh
  stamp "sanitize"
  OUT="$L" TOOL_TIMEOUT=90 bash tools/sanitize.sh memcheck racecheck 2>&1 | tail -n 3
  for s in 0 8 16 32 64; do
    stamp "decode timeline --splits $s"
    timeout 60 python3 tools/decode_timeline.py --rows 1:512,1:4096,1:32768 --splits $s 2>&1 \
      | tee -a "$L/timeline.txt" | grep "^B="
  done
  tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$L"
  R="$OUT/bench"; mkdir -p "$R"
  stamp "bench_decode"
  timeout ${DECODE_TIMEOUT:-150} python3 benchmarks/bench_decode.py --rows ${DROWS:-64:4096,1:512,1:4096,1:32768} \
    --heads 32/8 --pages 16 --kv bf16,fp8 --out "$R" > "$R/bench_decode.txt" 2>&1
  grep "^| [0-9]" "$R/bench_decode.txt" | cut -d"|" -f2-7,10,16-19
  tar -C "$OUT" -czf "$OUT/bench.tgz" bench && rm -rf "$R"
  stamp done
  exit 0
fi
MODE=record BENCH_SETS=${BENCH_SETS:-128:512} OUT="$OUT" bash tools/device_stop36.sh 2>&1 | tail -n 60
L="$OUT/more"; mkdir -p "$L"
for a in "--page 0" "--splits 8" "--splits 32"; do
  stamp "decode timeline $a"
  timeout 60 python3 tools/decode_timeline.py --rows 1:512,1:4096,1:32768 $a 2>&1 | tee -a "$L/timeline_more.txt" | tail -n 6
done
for kv in fp8 bf16; do
  stamp "pool layout $kv"
  timeout 120 python3 tools/decode_ring_probe.py --rows 64:4096,16:16384 --kv $kv --layouts nhd,hnd \
    --no-peer 2>&1 | tee -a "$L/layout_probe.txt" | grep -v "^#"
done
tar -C "$OUT" -czf "$OUT/more.tgz" more && rm -rf "$L"
stamp done
