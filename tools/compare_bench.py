"""Row-by-row ratio of two benchmark runs (tools/bench_before_after.sh): for each CSV that both
directories hold (bench.csv, bench_decode.csv, varlen.csv), the time per call, back to back and
kernel-only of the new tree over the baseline's, per row (< 1 is faster).  A third directory
(the baseline re-run after the new tree) shows the run-to-run drift of the prefill rows.

    python3 tools/compare_bench.py BASE_DIR NEW_DIR [BASE_AGAIN_DIR]
"""

from __future__ import annotations

import csv
import os
import sys

#: (csv file, the columns that name a row, the time columns compared)
TABLES = (
    ("bench.csv", ("dtype", "d", "seqlen", "causal", "mode"), ("us_call", "us_b2b", "us_kernel")),
    ("bench_decode.csv", ("B", "ctx", "Hk", "page"), ("us_call", "us_b2b", "us_graph", "us_kernel")),
    ("varlen.csv", ("B", "total"), ("ours_us_call", "ours_us_b2b")),
)


def _rows(path, keys):
    with open(path) as f:
        return {tuple(r[k] for k in keys): r for r in csv.DictReader(f)}


def compare(base_dir, new_dir, again_dir=None) -> int:
    worst = 0.0
    for name, keys, cols in TABLES:
        pb, pn = os.path.join(base_dir, name), os.path.join(new_dir, name)
        if not (os.path.exists(pb) and os.path.exists(pn)):
            print(f"{name}: missing in one run")
            continue
        base, new = _rows(pb, keys), _rows(pn, keys)
        again = {}
        if again_dir and os.path.exists(os.path.join(again_dir, name)):
            again = _rows(os.path.join(again_dir, name), keys)
        print(f"\n{name}: new / base ({', '.join(cols)})" + ("; drift = base again / base" if again else ""))
        for key, b in base.items():
            if key not in new:
                continue
            ratios = [float(new[key][c]) / float(b[c]) for c in cols]
            worst = max(worst, ratios[0])
            line = f"  {' '.join(f'{k}={v}' for k, v in zip(keys, key)):<44}" + "  ".join(
                f"{c}={r:.3f}" for c, r in zip(cols, ratios))
            if key in again:
                line += f"  drift={float(again[key][cols[0]]) / float(b[cols[0]]):.3f}"
            print(line)
    print(f"\nworst one-call ratio new/base: {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(compare(*sys.argv[1:4]))
