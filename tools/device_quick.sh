#!/usr/bin/env bash
# One device call for a development iteration: parallel precompile, the host-cost profile
# (tools/profile_host.py), then the GPU tests named in $TESTS (default: all).  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/fa_quick}
mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
stamp "precompile"
python3 tools/precompile_parallel.py 2>&1 | tail -n 1
if [ "${PROFILE:-1}" = 1 ]; then
  stamp "profile"
  timeout 200 python3 tools/profile_host.py --profile --out "$OUT" > "$OUT/profile.txt" 2>&1
  head -n 40 "$OUT/profile.txt"
fi
stamp "pytest ${TESTS:-tests/gpu}"
timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rfE ${TESTS:-tests/gpu} > "$OUT/pytest.txt" 2>&1
tail -n 40 "$OUT/pytest.txt" | grep -E "passed|failed|FAILED|ERROR|Error" | tail -n 30
stamp "done"
