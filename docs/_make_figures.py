"""Draw the figures of docs/ (committed as PNG): ``python docs/_make_figures.py``.

docs/paged_layout.png: two sequences in a paged KV cache with page_block_size P = 4 -- their
logical token positions, the block table, and where each token sits in the page pool.
Needs matplotlib (``pip install matplotlib``; it is in the ``bench`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported (below, in the functions)

HERE = Path(__file__).resolve().parent

# The example: P = 4, a pool of 8 pages, two sequences.
P = 4
NUM_BLOCKS = 8
MAX_BLOCKS = 4
LENGTHS = [10, 6]
TABLE = [[7, 2, 5], [0, 3]]  # pages owned, in logical order (the rest of the row is 0, unused)


def _colors():
    import matplotlib.pyplot as plt

    blues, oranges = plt.get_cmap("Blues"), plt.get_cmap("Oranges")
    return {
        (0, 0): blues(0.35), (0, 1): blues(0.55), (0, 2): blues(0.75),
        (1, 0): oranges(0.35), (1, 1): oranges(0.6),
    }


def paged_layout(path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    color = _colors()
    fig, ax = plt.subplots(figsize=(12.5, 7.6))
    ax.set_xlim(0, 25)
    ax.set_ylim(0, 15.2)
    ax.axis("off")

    def box(x, y, w, h, face, text="", size=9, weight="normal", edge="0.25", lw=0.8):
        ax.add_patch(Rectangle((x, y), w, h, facecolor=face, edgecolor=edge, linewidth=lw))
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                    fontweight=weight)

    # 1. logical positions
    ax.text(0.2, 14.6, "1. Logical key positions (what attention sees)", fontsize=12,
            fontweight="bold")
    x0 = 3.0
    for b, n in enumerate(LENGTHS):
        y = 13.3 - 1.55 * b
        ax.text(x0 - 0.3, y + 0.4, f"seq {b}  (len {n})", ha="right", va="center", fontsize=10)
        for p in range(n):
            box(x0 + p * 0.95, y, 0.95, 0.8, color[(b, p // P)], str(p))
        for i in range(-(-n // P)):  # brace under each logical page
            xs = x0 + i * P * 0.95
            xe = x0 + min(n, (i + 1) * P) * 0.95
            ax.plot([xs + 0.05, xe - 0.05], [y - 0.12, y - 0.12], color="0.3", lw=1.2)
            ax.text((xs + xe) / 2, y - 0.35, f"logical page {i}", ha="center", va="center",
                    fontsize=7.5, color="0.3")
    ax.text(13.8, 12.9, "logical page of position p:  i = p // P\n"
            "row inside that page:        r = p % P\n"
            "(P = page_block_size = 4)",
            fontsize=10, va="center", family="monospace")

    # 2. block table
    ax.text(0.2, 10.6, "2. block_table  int32 (B=2, max_blocks_per_seq=4): page id of each "
            "logical page", fontsize=12, fontweight="bold")
    bt_x, bt_y, cw = 3.0, 9.0, 1.4
    for i in range(MAX_BLOCKS):
        ax.text(bt_x + i * cw + cw / 2, bt_y + 1.05, f"i={i}", ha="center", fontsize=9)
    cells = {}
    for b, row in enumerate(TABLE):
        y = bt_y - 1.0 * b
        ax.text(bt_x - 0.3, y + 0.4, f"seq {b}", ha="right", va="center", fontsize=10)
        for i in range(MAX_BLOCKS):
            if i < len(row):
                box(bt_x + i * cw, y, cw, 0.8, color[(b, i)], str(row[i]), size=11,
                    weight="bold")
                cells[(b, i)] = (bt_x + i * cw + cw / 2, y)
            else:
                box(bt_x + i * cw, y, cw, 0.8, "0.95", "0", size=10)
    ax.text(bt_x + MAX_BLOCKS * cw + 0.3, bt_y - 0.1,
            "grey: unused entries (0 -- a valid page id, never read:\n"
            "positions >= the sequence's length are masked)", fontsize=9, va="center",
            color="0.35")

    # 3. page pool
    ax.text(0.2, 6.5, "3. Page pool  k_pages / v_pages  (num_blocks=8, page_block_size=4, Hk, D)",
            fontsize=12, fontweight="bold")
    pw, gap, py, rh = 2.35, 0.6, 1.2, 0.95
    owner = {}
    for b, row in enumerate(TABLE):
        for i, page in enumerate(row):
            owner[page] = (b, i)
    tops = {}
    for page in range(NUM_BLOCKS):
        x = 0.8 + page * (pw + gap)
        ax.text(x + pw / 2, py - 0.45, f"page {page}", ha="center", fontsize=10,
                fontweight="bold")
        for r in range(P):
            y = py + (P - 1 - r) * rh
            if page in owner:
                b, i = owner[page]
                p = i * P + r
                if p < LENGTHS[b]:
                    box(x, y, pw, rh, color[(b, i)], f"row {r}: seq {b}, p={p}", size=8)
                else:
                    box(x, y, pw, rh, "white", f"row {r}: (empty)", size=8)
            else:
                box(x, y, pw, rh, "0.93", f"row {r}", size=8)
        tops[page] = (x + pw / 2, py + P * rh)
    ax.text(0.8, 0.25, "Each row holds one token's (Hk, D) keys (k_pages) or values (v_pages). "
            "Pages 1, 4, 6 are free.  Token p of sequence b:  "
            "k_pages[block_table[b, p // P], p % P]", fontsize=9.5)

    for (b, i), (cx, cy) in cells.items():
        page = TABLE[b][i]
        tx, ty = tops[page]
        ax.add_patch(FancyArrowPatch((cx, cy), (tx, ty + 0.05), arrowstyle="-|>",
                                     mutation_scale=12, color=color[(b, i)], lw=1.6,
                                     connectionstyle="arc3,rad=0.08", shrinkA=2, shrinkB=2))
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: reproducible
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    path = args.out / "paged_layout.png"
    paged_layout(path)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
