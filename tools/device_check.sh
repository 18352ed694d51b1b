#!/usr/bin/env bash
# One batched GPU-machine run (repo root): parallel precompile, tile sweep, correctness tests,
# memcheck on small shapes, full benchmark with the winning tiles.
# Usage: OUT=/some/dir bash tools/device_check.sh [--no-sweep] [--quick-bench]
set -u
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1

# Compile kernels in parallel processes into CuPy's disk cache (NVRTC is single-threaded).
# $1: "sweep" (every tile variant of benchmarks/bench.py SWEEP, dense + paged bf16) or
# "shipped" (every shipped key, with the current CUPY_FLASHATTN_TRAITS).
precompile() {
python3 - "$1" <<'PY'
import sys, itertools
from concurrent.futures import ProcessPoolExecutor
def job(a):
    ov, key = a
    from cupy_flashattn._cuda import compile as cc
    if ov: cc.override_traits(ov[0], cc.Traits(*ov))
    cc.get_kernel(cc.KernelKey(*key))
    return key
if __name__ == "__main__":
    from cupy_flashattn._cuda import compile as cc
    if sys.argv[1] == "sweep":
        sys.path.insert(0, "benchmarks")
        from bench import SWEEP
        jobs = [(v, ("bf16", d, False, pg)) for d, vs in SWEEP.items() for v in vs for pg in (False, True)]
    else:
        jobs = [(None, (k.dtype, k.head_dim, k.transform, k.paged)) for k in cc.shipped_keys()]
    with ProcessPoolExecutor(14) as ex:
        n = len(list(ex.map(job, jobs)))
    print(f"precompiled {n} kernels")
PY
}

if [ "${1:-}" != "--no-sweep" ]; then
  stamp "precompile sweep"; precompile sweep > "$OUT/precompile_sweep.txt" 2>&1; tail -n 2 "$OUT/precompile_sweep.txt"
  stamp "sweep"; python3 benchmarks/bench.py --sweep --dims 128,64,256 --out "$OUT" > "$OUT/sweep.txt" 2>&1
  grep -v "^# sweep" "$OUT/sweep.txt" | tail -n 20; rm -f "$OUT/sweep.txt"
  [ -f "$OUT/winner.env" ] && . "$OUT/winner.env" && export CUPY_FLASHATTN_TRAITS
fi
echo "CUPY_FLASHATTN_TRAITS=${CUPY_FLASHATTN_TRAITS:-}"
if [ "${1:-}" = "--no-sweep" ]; then
  stamp "paged diag"; python3 benchmarks/bench.py --paged-diag > "$OUT/paged_diag.txt" 2>&1
  grep "paged-diag" "$OUT/paged_diag.txt"
fi
stamp "precompile shipped"; precompile shipped > "$OUT/precompile.txt" 2>&1; tail -n 2 "$OUT/precompile.txt"

stamp "pytest + memcheck (concurrently)"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 tools/memcheck_small.py > "$OUT/memcheck.txt" 2>&1 &
MC=$!
{ time timeout 150 python3 -m pytest -m gpu tests/gpu/test_gpu_kernels.py -q -p no:cacheprovider ; } > "$OUT/pytest.txt" 2>&1
echo "== pytest"; grep -E "passed|failed|error|real" "$OUT/pytest.txt" | tail -n 8
wait $MC
echo "== memcheck"; tail -n 3 "$OUT/memcheck.txt"

stamp "bench"
if [ "${1:-}" = "--quick-bench" ] || [ "${2:-}" = "--quick-bench" ]; then
  python3 benchmarks/bench.py --quick --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
else
  python3 benchmarks/bench.py --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
fi
tar -C "$OUT" -czf "$OUT/bench_results.tar.gz" bench && rm -rf "$OUT/bench"  # few files come back
echo "== bench"; grep -E "d=128 seqlen=4096 batch=4 heads=16 causal=0|bench took" "$OUT/bench.txt" | grep -E "dtype=bf16|took"
stamp "done"
