#!/usr/bin/env bash
# One batched GPU-machine run: correctness tests, memcheck on small shapes, quick benchmark.
# Usage (repo root, on the GPU machine): OUT=/some/dir bash tools/device_check.sh [--full-bench]
set -u
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
{ time python3 -m pytest -m gpu tests/gpu/test_gpu_kernels.py -x -q -p no:cacheprovider ; } > "$OUT/pytest.txt" 2>&1
echo "== pytest"; tail -n 15 "$OUT/pytest.txt"
compute-sanitizer --tool memcheck --print-limit 20 python3 tools/memcheck_small.py > "$OUT/memcheck.txt" 2>&1
echo "== memcheck"; tail -n 4 "$OUT/memcheck.txt"
if [ "${1:-}" = "--full-bench" ]; then
  python3 benchmarks/bench.py --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
else
  python3 benchmarks/bench.py --quick --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
fi
echo "== bench"; grep -v "^#" "$OUT/bench.txt" | tail -n 20
