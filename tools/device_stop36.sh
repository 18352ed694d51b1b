#!/usr/bin/env bash
# Stop 36's device calls (repo root), logs under $OUT.
#   MODE=probe (default): decode facts before a kernel change (issues 15 / 16) --
#     1. tools/decode_ring_probe.py under each ring setting of $RINGS (tuning defines of
#        flash_decode.cu; "default" = none): GPU time per decode step, memset vs clean L2 flush,
#        forced split counts for B = 1, cuDNN beside;
#     2. ncu (SpeedOfLight, WarpStateStats, MemoryWorkloadAnalysis) of our decode kernel and of
#        cuDNN's on B = 64 ctx 4096 page 16 (NCU=0 skips it).
#   MODE=probe2: the paged D = 256 change's check and the decode L2 question --
#     1. the whole GPU suite in shards (tools/gpu_suite_parallel.sh; SUITE=0 skips it);
#     2. ncu raw metrics (DRAM bytes, L2 sectors / hits / requests, L2 fabric) of our decode
#        kernel (page 16, page 16 with FA_DECODE_L2_PREFETCH=256, contiguous) and cuDNN's,
#        B = 64 ctx 4096;
#     3. tools/decode_ring_probe.py for each of $PREFETCHES, and contiguous;
#     4. tools/quickbench_sm90.py on the paged rows (D = 256 on 80-key tiles).
#     Logs in $OUT/logs.tgz.
#   MODE=check: after a decode kernel change -- the whole GPU suite in shards, the sanitizers,
#     ncu raw metrics of our decode kernel (page 16, contiguous), the ring probe (memset / clean
#     flush, cuDNN beside), then bench_decode.py ($DROWS, pages $DPAGES); logs.tgz and bench.tgz.
#   MODE=final: MODE=check, then the prefill benchmarks of record for issues 12 / 15 --
#     bench.py bf16 for each D:S of $BENCH_SETS (dense, sm80, varlen, paged 16 / 256) and
#     bench_varlen.py, into bench.tgz too.  NCU=0 / PROBE=0 skip those parts of the check.
#   MODE=record: issue 15's rows on code a check run verified -- bench_decode.py ($DROWS),
#     bench_varlen.py, bench.py per $BENCH_SETS, then the front-end GPU tests (no
#     synchronisation, graph replay), quickbench of paged D = 256 at S = 4000 / 4096 / 2000 / 2048
#     (is the gathered sequence-end tile the D = 256 paged gap?) and (TIMELINE=1, default)
#     tools/decode_timeline.py: where a B = 1 decode step's time goes; bench.tgz.
# The device call brings back at most 8 files from $OUT.
set -u
OUT=${OUT:-/tmp/fa_stop36}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
mode=${MODE:-probe}
# bench.py for each D:S pair of $BENCH_SETS, one process each, into $R/prefill_d<D>_s<S>.
bench_sets() {
  for set in ${BENCH_SETS:-128:512 256:4096}; do
    IFS=: read -r d sq <<< "$set"
    stamp "bench.py D=$d S=$sq"
    mkdir -p "$R/prefill_d${d}_s${sq}"
    timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/bench.py --dims "$d" --seqs "$sq" --dtypes bf16 \
      --out "$R/prefill_d${d}_s${sq}" > "$R/prefill_d${d}_s${sq}/bench.txt" 2>&1
    grep -h "^| bf16" "$R/prefill_d${d}_s${sq}"/*.md | grep -E "dense \||paged|varlen" | cut -d'|' -f2-10
  done
}
if [ "$mode" = probe ]; then
  for ring in ${RINGS:-default FA_DECODE_DEEP=4 FA_DECODE_DEEP=6}; do
    defs=$ring; [ "$ring" = default ] && defs=
    stamp "ring probe $ring"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout ${PROBE_TIMEOUT:-120} python3 tools/decode_ring_probe.py \
      ${PROBE_ARGS:---splits 0,8,16,24,32} 2>&1 | tee -a "$OUT/ring_probe.txt" | grep -v "^#"
  done
  if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
    for who in "decode_bf16" "sdpa|cudnn|fmha|flash_fprop"; do
      stamp "ncu $who"
      timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --kernel-name regex:"$who" --launch-skip 3 \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section LaunchStats --section Occupancy \
        python3 tools/decode_ring_probe.py --rows 64:4096 --splits 0 >> "$OUT/ncu_decode.txt" 2>&1
      grep -E "^  [a-z_]|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Dynamic Shared" \
        "$OUT/ncu_decode.txt" | tail -n 12
    done
  fi
fi
if [ "$mode" = probe2 ]; then
  L="$OUT/logs"; mkdir -p "$L"
  if [ "${SUITE:-1}" = 1 ]; then OUT="$L" bash tools/gpu_suite_parallel.sh; fi
  if command -v ncu >/dev/null; then
    M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,sm__inst_executed.sum
    for c in "p16::decode_bf16:" "p16_pf256:FA_DECODE_L2_PREFETCH=256:decode_bf16:" "contig::decode_bf16:--contig" "cudnn::sdpa:"; do
      IFS=: read -r tag defs who extra <<< "$c"
      stamp "ncu metrics $tag"
      CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 120 ncu --clock-control none --kernel-name regex:"$who" \
        --launch-skip 3 --launch-count 1 --metrics "$M" \
        python3 tools/decode_ring_probe.py --rows 64:4096 --splits 0 $extra > "$L/ncu_$tag.txt" 2>&1
      grep -E "^\s+(gpu__|dram__|lts__|l1tex__|sm__)" "$L/ncu_$tag.txt" | sed "s/^/$tag /"
    done
  fi
  for pf in ${PREFETCHES:-0 128 256}; do
    defs=; [ "$pf" != 0 ] && defs=FA_DECODE_L2_PREFETCH=$pf
    stamp "ring probe prefetch $pf"
    CUPY_FLASHATTN_SM90_DEFINES=$defs timeout 120 python3 tools/decode_ring_probe.py \
      --splits 0,16 $([ "$pf" != 0 ] && echo --no-peer) 2>&1 | tee -a "$L/ring_probe.txt" | grep -v "^#"
  done
  stamp "ring probe contiguous"
  timeout 120 python3 tools/decode_ring_probe.py --splits 0,16 --no-peer --contig 2>&1 \
    | tee -a "$L/ring_probe.txt" | grep -v "^#"
  stamp "quickbench sm90 paged"
  timeout 150 python3 tools/quickbench_sm90.py --archs sm90 --paged 16,256 --varlen \
    --rows "${QB_ROWS:-256,2048,0;256,4096,0;256,4096,1;128,512,0;128,2048,0}" 2>&1 \
    | tee "$L/quickbench.txt" | grep -v "^#"
  tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$L"
fi
if [ "$mode" = check ] || [ "$mode" = final ]; then
  L="$OUT/logs"; mkdir -p "$L"
  OUT="$L" bash tools/gpu_suite_parallel.sh
  stamp "sanitize"
  OUT="$L" TOOL_TIMEOUT=${TOOL_TIMEOUT:-120} bash tools/sanitize.sh ${TOOLS:-memcheck racecheck} 2>&1 | tail -n 4
  M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_requests_srcunit_tex_op_read.sum,sm__inst_executed.sum
  [ "${NCU:-1}" = 1 ] && for c in "p16:" "contig:--contig"; do
    IFS=: read -r tag extra <<< "$c"
    stamp "ncu metrics $tag"
    timeout 90 ncu --clock-control none --kernel-name regex:decode_bf16 --launch-skip 3 --launch-count 1 \
      --metrics "$M" python3 tools/decode_ring_probe.py --rows 64:4096 --splits 0 --no-peer $extra \
      > "$L/ncu_$tag.txt" 2>&1
    grep -E "^\s+(gpu__|dram__|lts__|sm__)" "$L/ncu_$tag.txt" | sed "s/^/$tag /"
  done
  if [ "${PROBE:-1}" = 1 ]; then
    stamp "ring probe"
    timeout 120 python3 tools/decode_ring_probe.py --splits 0,16 2>&1 | tee "$L/ring_probe.txt" | grep -v "^#"
  fi
  tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$L"
  R="$OUT/bench"; mkdir -p "$R"
  stamp "bench_decode"
  timeout ${DECODE_TIMEOUT:-200} python3 benchmarks/bench_decode.py --rows ${DROWS:-64:4096,16:16384,1:512,1:4096,1:32768} \
    --heads 32/8 --pages ${DPAGES:-16,256} --kv ${DKV:-bf16,fp8} --out "$R" > "$R/bench_decode.txt" 2>&1
  grep -v "^#" "$R/bench_decode.txt" | tail -n 24
  if [ "$mode" = final ]; then
    bench_sets
    stamp "bench_varlen"
    timeout 90 python3 benchmarks/bench_varlen.py --out "$R" > "$R/bench_varlen.txt" 2>&1
    tail -n 6 "$R/bench_varlen.txt"
  fi
  tar -C "$OUT" -czf "$OUT/bench.tgz" bench && rm -rf "$R"
fi
if [ "$mode" = record ]; then
  R="$OUT/bench"; mkdir -p "$R"
  stamp "bench_decode"
  timeout ${DECODE_TIMEOUT:-90} python3 benchmarks/bench_decode.py --rows ${DROWS:-64:4096,1:512} \
    --heads 32/8 --pages ${DPAGES:-16} --kv bf16 --out "$R" > "$R/bench_decode.txt" 2>&1
  grep -v "^#" "$R/bench_decode.txt" | grep "^| [0-9]" | cut -d'|' -f2-12
  stamp "bench_varlen"
  timeout 90 python3 benchmarks/bench_varlen.py --out "$R" > "$R/bench_varlen.txt" 2>&1
  tail -n 6 "$R/bench_varlen.txt"
  bench_sets
  stamp "front-end GPU tests"
  timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_frontend.py > "$R/frontend_tests.txt" 2>&1
  tail -n 2 "$R/frontend_tests.txt"
  stamp "quickbench: paged D = 256 with S a multiple of 80 or not (the sequence-end tile)"
  timeout 120 python3 tools/quickbench_sm90.py --archs sm90 --paged 16,256 \
    --rows "${QB_ROWS:-256,4000,0;256,4096,0;256,2000,0;256,2048,0}" 2>&1 | tee "$R/quickbench_d256.txt" | grep -v "^#"
  if [ "${TIMELINE:-1}" = 1 ]; then
    stamp "decode timeline"
    timeout 120 python3 tools/decode_timeline.py 2>&1 | tee "$R/decode_timeline.txt"
  fi
  tar -C "$OUT" -czf "$OUT/bench.tgz" bench
fi
stamp done
