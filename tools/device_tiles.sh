#!/usr/bin/env bash
# sm90 key-tile width A/B in one device call: per variant ($CUPY_FLASHATTN_SM90_DEFINES), the
# correctness probe (tools/sm90_tile_probe.py, non-paged problems) and quickbench TFLOP/s of
# the rows that variant changes; the baseline first (with torch's columns) and again last.
#   VARIANTS  ';' separated "DEFINES@DIMS" (DIMS: the head dims whose rows run, e.g. 128)
set -u
OUT=${OUT:-/tmp/fa_tiles}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
rows_for() {  # head dims -> quickbench rows: S 2k / 4k / 8k at D = 128, S = 4k otherwise
  local out="" d
  for d in ${1//,/ }; do
    if [ "$d" = 128 ]; then out+="128,2048,0;128,4096,0;128,8192,0;128,2048,1;128,4096,1;128,8192,1;"
    else out+="$d,4096,0;$d,4096,1;$d,8192,0;"; fi
  done
  echo "${out%;}"
}
IFS=';' read -ra VS <<< "${VARIANTS:-@64,128,256}"
i=0
for v in "${VS[@]}"; do
  i=$((i + 1))
  export CUPY_FLASHATTN_SM90_DEFINES="${v%@*}"
  dims="${v#*@}"
  if [ -n "$CUPY_FLASHATTN_SM90_DEFINES" ] || [ "${PROBE_BASE:-0}" = 1 ]; then
    stamp "variant $i '$v': probe"
    timeout 240 python3 tools/sm90_tile_probe.py --dims "$dims" > "$OUT/probe_$i.txt" 2>&1
    grep -E "FAIL|probe:|Error|error" "$OUT/probe_$i.txt" | head -n 12
  fi
  stamp "variant $i '$v': quickbench"
  torch=--no-torch; [ $i = 1 ] && torch=
  timeout 200 python3 tools/quickbench_sm90.py --archs sm90 $torch --rows "$(rows_for "$dims")" 2>&1 | tail -n 12
done
stamp done
