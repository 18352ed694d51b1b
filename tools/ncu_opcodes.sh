#!/usr/bin/env bash
# Warp instructions executed per SASS opcode of the sm90 prefill kernel (Nsight Compute's
# sass__inst_executed_per_opcode, 4th launch of tools/ncu_case.py, clocks left alone), one
# case per entry of $CASES -- "D,S,causal,page[,defines[,torch]]" with defines as NAME=V+NAME=V
# (the kernel switches of $CUPY_FLASHATTN_SM90_DEFINES, '+' for ',') and torch "cudnn" or
# "flash" for that SDPA backend's kernel on the same case instead of ours -- then a table of every
# case's counts side by side (millions; the first case is the baseline of the diff column).
#   OUT=$OUT CASES="128,2048,0,0;128,2048,0,0,FA_SM90_PV_WIDE=1" bash tools/ncu_opcodes.sh
set -u
OUT=${OUT:-/tmp/fa_ncu_ops}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
command -v ncu >/dev/null || { echo "ncu not found"; exit 1; }
IFS=';' read -ra CS <<< "${CASES:-128,2048,0,0;256,4096,1,0;256,4096,1,16}"
files=()
for c in "${CS[@]}"; do
  IFS=',' read -r d s causal page defs torch <<< "$c"
  defs=${defs:-}; defs=${defs//+/,}; torch=${torch:-}
  tag="d${d}_s${s}_c${causal}_p${page}$( [ -n "$defs" ] && echo "_$(echo "$defs" | tr -c 'A-Za-z0-9\n' '_')")"
  tag="$tag$( [ -n "$torch" ] && echo "_torch_$torch")"
  stamp "ncu opcodes $tag"
  CUPY_FLASHATTN_SM90_DEFINES="$defs" CUPY_CACHE_DIR="/tmp/fa_cache_ops_$(echo "$defs" | tr -c 'A-Za-z0-9\n' '_')" \
    timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none --target-processes all \
    --kernel-name 'regex:fa_fwd_sm90|sdpa|flash_fwd' --launch-skip 3 --launch-count 1 \
    --metrics sass__inst_executed_per_opcode,gpu__time_duration.sum --print-metric-instances details \
    python3 tools/ncu_case.py --d "$d" --s "$s" --paged "$page" $([ "$causal" = 1 ] && echo --causal) \
    $([ -n "$torch" ] && echo --torch "$torch") > "$OUT/ops_$tag.txt" 2>&1
  files+=("$OUT/ops_$tag.txt")
done
python3 - "${files[@]}" <<'PY'
import re, sys
cols = []
for path in sys.argv[1:]:
    text = open(path).read()
    i = text.find("sass__inst_executed_per_opcode")
    ops = {m.group(1): int(m.group(2).replace(",", "")) / 1e6
           for m in re.finditer(r"([A-Z][A-Z0-9_.]*):\s+([\d,]+)", text[i:] if i >= 0 else "")}
    t = re.search(r"gpu__time_duration.sum\s+(\w+)\s+([\d.,]+)", text)
    cols.append((path.rsplit("/ops_", 1)[-1][:-4], ops, t.group(2) + " " + t.group(1) if t else "?"))
for name, ops, t in cols:
    print(f"# {name}: {sum(ops.values()):.2f} M warp instructions, {t}")
names = sorted({o for _, ops, _ in cols for o in ops}, key=lambda o: -max(c[1].get(o, 0) for c in cols))
base = cols[0][1] if cols else {}
for o in names[:40]:
    row = " ".join(f"{c[1].get(o, 0):8.2f}" for c in cols)
    print(f"{o:10s} {row}   diff(last-first) {cols[-1][1].get(o, 0) - base.get(o, 0):+8.2f}")
PY
