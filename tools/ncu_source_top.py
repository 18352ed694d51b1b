"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page
(``ncu -i REPORT --page source --csv --print-source sass``, written by tools/device_stop35.sh
MODE=ncusrc): the instructions with the most stall samples, and the samples per opcode, for one
report or side by side for several (e.g. the dense and the paged sm90 prefill kernel).

    python3 tools/ncu_source_top.py src_d128_s512_p0.csv src_d128_s512_p16.csv [--top 25]

Also printed: the samples spent waiting on each mbarrier (a SYNCS...TRYWAIT and the retry
branch after it, grouped by the barrier's address operand) -- e.g. the producer's EMPTY waits
(per-thread address registers) against the consumers' FULL waits (uniform registers).
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_source_page(path: str):
    """[(address, sass text, {column: value})] of the first kernel in the CSV."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
    header = [c.strip() for c in rows[start]]
    src = header.index("Source")
    addr = header.index("Address") if "Address" in header else None
    out = []
    for r in rows[start + 1:]:
        if len(r) != len(header):
            continue
        if r[src].strip() == "Source":  # a second kernel's header
            break
        vals = {h: _number(c) for h, c in zip(header, r) if h not in ("Source", "Address")}
        out.append((r[addr] if addr is not None else "", r[src].strip(), vals))
    return header, out


def sample_column(header) -> str:
    for h in header:
        if "Warp Stall Sampling (All" in h:
            return h
    raise SystemExit(f"no stall-sampling column among {header}")


def barrier_waits(rows, col):
    """{barrier address operand: samples} of the mbarrier try-waits and their retry branches."""
    waits = collections.Counter()

    def operand(sass):
        return sass.split("TRYWAIT")[1].split(",")[1].strip()

    for i, (_, s, v) in enumerate(rows):
        if "TRYWAIT" in s:
            waits[operand(s)] += v[col]
        elif "BRA" in s:
            for j in range(i - 1, max(i - 4, -1), -1):
                if "TRYWAIT" in rows[j][1]:
                    waits[operand(rows[j][1])] += v[col]
                    break
    return waits


def opcode(sass: str) -> str:
    text = sass.split(";")[0].strip()
    if text.startswith("@"):
        text = text.split(None, 1)[1] if " " in text else text
    return text.split()[0] if text else "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    per_file = []
    for path in args.csv:
        header, rows = read_source_page(path)
        col = sample_column(header)
        total = sum(v[col] for _, _, v in rows) or 1.0
        print(f"== {path}: {len(rows)} instructions, {total:.0f} samples ({col})")
        for a, s, v in sorted(rows, key=lambda x: -x[2][col])[: args.top]:
            print(f"  {100 * v[col] / total:5.1f}%  {a:>8}  {s[:90]}")
        dealloc = next((i for i, r in enumerate(rows) if "SETMAXREG.DEALLOC" in r[1]), None)
        if dealloc is not None:  # warp-specialized: the producer's code follows its dealloc
            end = next((i for i in range(dealloc, len(rows)) if rows[i][1] == "EXIT"), len(rows))
            ex = "Instructions Executed"
            print(f"  warp instructions executed: producer (setmaxnreg.dealloc .. EXIT) "
                  f"{sum(r[2].get(ex, 0) for r in rows[dealloc:end]) / 1e6:.2f} M, before it "
                  f"{sum(r[2].get(ex, 0) for r in rows[:dealloc]) / 1e6:.2f} M")
        waits = barrier_waits(rows, col)
        print(f"  mbarrier waits: {100 * sum(waits.values()) / total:.1f}% of samples")
        for operand, x in waits.most_common(8):
            print(f"    {100 * x / total:5.1f}%  {operand}")
        by_op = collections.Counter()
        for _, s, v in rows:
            by_op[opcode(s)] += v[col] / total
        per_file.append(by_op)
    ops = sorted(set().union(*per_file), key=lambda o: -max(f[o] for f in per_file))[: args.top]
    print("share of samples per opcode: " + " | ".join(args.csv))
    for o in ops:
        print(f"  {o:<28} " + "  ".join(f"{100 * f[o]:5.1f}%" for f in per_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
