#!/usr/bin/env bash
# The `gpu` test suite as N pytest processes at once on the GPU machine (repo root): the suite
# is bound by the host side of its checks (float64 NumPy references, many small launches), so
# N processes on the machine's 16 cores finish it in about 1/N of the time one process takes
# (one process did not finish it within a 520 s call).  Shard i of N keeps every N-th
# collected test from the i-th (tests/_shard.py), so slow parametrizations spread evenly.
# Kernels are compiled first (tools/precompile_parallel.py) so no two shards compile the same
# one.  Logs: $OUT/pytest_shard<i>.txt; prints one summary line per shard and the failures.
#   N (default 6), TESTS (default: all of tests/), PYTEST_TIMEOUT (default 330 s per shard;
#   with the precompile's 150 and the serial pass's SERIAL_TIMEOUT 120 it fits a 600 s call),
#   PYTEST_ARGS (extra pytest arguments, e.g. -k), PRECOMPILE=0 to skip the precompile,
#   SERIAL (default tests/gpu/test_gpu_large_offsets.py: its 4-9 GB arrays, several shards at
#   once could pass the card's memory): files left out of the shards and run after them alone.
# Exit 0 only when every shard ran and passed.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/fa_suite}; mkdir -p "$OUT"
. tools/device_env.sh
N=${N:-6}
if [ "${PRECOMPILE:-1}" = 1 ]; then
  stamp "precompile"
  timeout 150 python3 tools/precompile_parallel.py 2>&1 | tail -n 1
fi
stamp "pytest -m gpu in $N shards"
SERIAL=${SERIAL-tests/gpu/test_gpu_large_offsets.py}
ignore=""; for f in $SERIAL; do ignore+=" --ignore=$f"; done
pids=()
for ((i = 0; i < N; i++)); do
  CUPY_FLASHATTN_TEST_SHARD="$i/$N" timeout "${PYTEST_TIMEOUT:-330}" python3 -m pytest -m gpu -q \
    -p no:cacheprovider -rfE $ignore ${PYTEST_ARGS:-} ${TESTS:-tests} > "$OUT/pytest_shard$i.txt" 2>&1 &
  pids+=($!)
done
rc=0
for ((i = 0; i < N; i++)); do
  wait "${pids[$i]}"; r=$?
  [ $r -ne 0 ] && rc=1
  line=$(grep -E " in [0-9.]+s" "$OUT/pytest_shard$i.txt" | tail -n 1)  # pytest's summary
  echo "shard $i/$N: exit $r${line:+: $line}"
  [ $r -eq 124 ] && echo "shard $i/$N: TIMEOUT after ${PYTEST_TIMEOUT:-330} s"
done
if [ -n "$SERIAL" ]; then
  stamp "pytest -m gpu, alone: $SERIAL"
  timeout "${SERIAL_TIMEOUT:-120}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE ${PYTEST_ARGS:-} \
    $SERIAL > "$OUT/pytest_serial.txt" 2>&1; r=$?
  [ $r -ne 0 ] && rc=1
  echo "serial: exit $r: $(grep -E " in [0-9.]+s" "$OUT/pytest_serial.txt" | tail -n 1)"
fi
grep -h "^FAILED\|^ERROR" "$OUT"/pytest_shard*.txt "$OUT/pytest_serial.txt" 2>/dev/null | head -n 30
stamp "suite done (rc=$rc)"
exit $rc
