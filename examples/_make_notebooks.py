"""Write the example notebooks (examples/*.ipynb), outputs stripped, from the cells below.

    python examples/_make_notebooks.py          # rewrite every notebook
    python examples/_make_notebooks.py --check  # exit 1 if a committed notebook differs

Edit the notebooks here, not in Jupyter, so they stay small and reviewable; the .ipynb files
are committed (tests/test_notebooks.py executes them and checks they match this script).

Every notebook runs top to bottom on a machine without a GPU (NumPy arrays, Numba CPU backend,
small sizes) and on a GPU (CuPy arrays, CUDA kernels): the first cell picks
``xp = cupy if gpu_available() else numpy``.  ``CUPY_FLASHATTN_DEMO_CPU=1`` forces the CPU
backend; ``CUPY_FLASHATTN_ROOT`` points the first cell at a checkout (otherwise it tries the
parent of the working directory, i.e. the repository when Jupyter runs in examples/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

# -- shared cells -------------------------------------------------------------------------------

SETUP = '''\
# Setup: import the package (from this checkout, or an installed copy) and pick the backend.
import os
import sys

ROOT = os.environ.get("CUPY_FLASHATTN_ROOT") or os.path.dirname(os.getcwd())
if os.path.isdir(os.path.join(ROOT, "cupy_flashattn")) and ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import ml_dtypes
import numpy as np

import cupy_flashattn as fa
from cupy_flashattn._arrays import gpu_available
from cupy_flashattn.reference import attention_ref

USE_GPU = gpu_available() and not os.environ.get("CUPY_FLASHATTN_DEMO_CPU")
if USE_GPU:
    import cupy
xp = cupy if USE_GPU else np  # CuPy arrays -> CUDA kernels; NumPy arrays -> Numba CPU backend
DTYPE = np.dtype(ml_dtypes.bfloat16) if USE_GPU else np.dtype(np.float32)
print(f"cupy_flashattn {fa.__version__}: {xp.__name__} arrays, {DTYPE.name}",
      "(GPU)" if USE_GPU else "(no usable GPU: CPU backend)")'''

HELPERS = '''\
# Helpers: random inputs on the chosen backend, and flash-attn's accuracy criterion:
# max|out - ref64| <= 2 * max|naive - ref64| + eps, where ref64 is float64 attention and naive
# is the same attention rounded to DTYPE at every step.
rng = np.random.default_rng(0)
EPS = {"bfloat16": 1.6e-2, "float16": 2e-3, "float32": 2e-5}[DTYPE.name]


def randn(*shape):
    return xp.asarray(rng.standard_normal(shape).astype(DTYPE))


def host(a):
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def error_and_bound(out, q, k, v, **kw):
    q, k, v = host(q), host(k), host(v)
    ref = attention_ref(q, k, v, **kw)
    naive = attention_ref(q, k, v, upcast=False, **kw)
    err = float(np.abs(host(out).astype(np.float64) - ref).max(initial=0.0))
    bound = 2 * float(np.abs(naive.astype(np.float64) - ref).max(initial=0.0)) + EPS
    return err, bound'''

# -- 01 quickstart ------------------------------------------------------------------------------

QUICKSTART = [
    ("md", """\
# 01 · Quickstart: dense and varlen attention

`cupy_flashattn` implements FlashAttention's forward pass with flash-attn's function names,
arguments and layouts. CuPy arrays run on CUDA kernels compiled at run time (NVRTC); NumPy
arrays run on a Numba CPU backend with the same semantics, so this notebook also runs on a
laptop.

Every result is checked against `cupy_flashattn.reference.attention_ref` (plain NumPy,
float64) with flash-attn's criterion: the error must stay within twice the error of a naive
attention computed in the same precision, plus a small eps."""),
    ("code", SETUP),
    ("code", HELPERS),
    ("md", """\
## Dense batch: `flash_attn_func`

Layout `q (B, Sq, H, D)`, `k, v (B, Sk, Hk, D)`. Here 8 query heads share 2 key/value heads
(GQA): query head `h` reads kv head `h // (H // Hk)`. The first call of a configuration
compiles the kernel (CUDA: NVRTC, cached on disk in `CUPY_CACHE_DIR`; CPU: Numba, cached in
`__pycache__`)."""),
    ("code", """\
B, S, H, Hk, D = 2, 128, 8, 2, 64
q, k, v = randn(B, S, H, D), randn(B, S, Hk, D), randn(B, S, Hk, D)

out, lse = fa.flash_attn_func(q, k, v, causal=True, return_softmax_lse=True)
print("out", out.shape, out.dtype, "| softmax_lse", lse.shape, lse.dtype)

err, bound = error_and_bound(out, q, k, v, causal=True)
print(f"max|out - ref| = {err:.3g}  (flash-attn bound {bound:.3g}):",
      "ok" if err <= bound else "ABOVE BOUND")"""),
    ("md", """\
`softmax_lse` is the float32 natural-log sum of exponentials of each query row's scaled logits,
`(B, H, Sq)` for dense calls (`(H, total_q)` for varlen ones). It is what you need to merge
partial attention results (`fa.merge_attention_states`)."""),
    ("code", """\
_, ref_lse = attention_ref(host(q), host(k), host(v), causal=True, return_lse=True)
print(f"max|lse - ref_lse| = {np.abs(host(lse) - ref_lse).max():.2e}")"""),
    ("md", """\
## The causal mask is aligned bottom-right

When `Sq != Sk` (decoding a few new tokens against a longer cache) the last query sits on the
last key: query `i` sees key `j` iff `j <= i + Sk - Sq`. We can *watch* the mask: with `q = k = 0`
every visible key gets the same weight, and with `v[j] = e_j` the output row `i` is
`1/n` on exactly the keys query `i` sees. When `Sq > Sk` the first queries see no key at all:
their output is 0 and their LSE is `+inf` (flash-attn's convention)."""),
    ("code", """\
def visible_keys(Sq, Sk, **mask):
    Dm = 8  # one-hot values need D >= Sk
    zeros_q = xp.zeros((1, Sq, 1, Dm), DTYPE)
    zeros_k = xp.zeros((1, Sk, 1, Dm), DTYPE)
    onehot = xp.asarray(np.eye(Sk, Dm, dtype=DTYPE)[None, :, None, :])
    out, lse = fa.flash_attn_func(zeros_q, zeros_k, onehot, return_softmax_lse=True, **mask)
    return host(out)[0, :, 0, :Sk] > 0, host(lse)[0, 0]


for Sq, Sk in [(2, 5), (5, 2)]:
    seen, lse_rows = visible_keys(Sq, Sk, causal=True)
    print(f"{f'causal, Sq={Sq}, Sk={Sk}':<22}keys " + " ".join(str(j) for j in range(Sk)))
    for i in range(Sq):
        row = " ".join("x" if s else "." for s in seen[i])
        print(f"{f'query {i}':>26} {row}    lse {lse_rows[i]:+.3f}")

seen, _ = visible_keys(4, 7, window_size=(2, 1))
print("window_size=(2, 1), Sq=4, Sk=7: query i sees keys i+3-2 .. i+3+1")
for i in range(4):
    print("   ", " ".join("x" if s else "." for s in seen[i]))"""),
    ("md", """\
## Variable lengths without padding: `flash_attn_varlen_func`

Sequences are packed back to back, `q (total_q, H, D)`, `k, v (total_k, Hk, D)`, and
`cu_seqlens` (int32, `(B + 1,)`, starting at 0) says where each one starts. Sequence `b` owns
rows `cu_seqlens[b]:cu_seqlens[b+1]`; `max_seqlen_*` are host ints bounding the lengths."""),
    ("code", """\
lengths = [1, 37, 120, 9]
cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
total = int(cu[-1])
q, k, v = randn(total, H, D), randn(total, Hk, D), randn(total, Hk, D)
cu_x = xp.asarray(cu)

out, lse = fa.flash_attn_varlen_func(q, k, v, cu_x, cu_x, max(lengths), max(lengths),
                                     causal=True, return_softmax_lse=True)
print("cu_seqlens", cu.tolist(), "-> out", out.shape, "| softmax_lse", lse.shape)

worst = 0.0
for b in range(len(lengths)):
    s, e = cu[b], cu[b + 1]
    err, bound = error_and_bound(host(out)[s:e], host(q)[s:e], host(k)[s:e], host(v)[s:e],
                                 causal=True)
    worst = max(worst, err / bound)
    print(f"sequence {b} (length {lengths[b]:>3}): max error {err:.3g}, bound {bound:.3g}")
print("all within flash-attn's bound" if worst <= 1 else "SOME ABOVE BOUND")"""),
    ("md", """\
## What next

* `02_paged_kv_inference.ipynb`: a paged KV cache for prefill + decode.
* `03_page_block_size_story.ipynb`: the page-size mismatch this project started from.
* `04_interop_dlpack.ipynb`: PyTorch tensors in and out, no copy.
* `python -m cupy_flashattn check` runs a self-test like this one on your machine."""),
]

# -- 02 paged KV inference ----------------------------------------------------------------------

PAGED = [
    ("md", """\
# 02 · Paged KV cache: prefill, decode, free, reuse

A paged cache (vLLM / FlashInfer / flash-attn `block_table` layout) stores keys and values in a
pool of fixed-size pages, `k_pages, v_pages (num_blocks, page_block_size, Hk, D)`. Each sequence
owns a list of pages, its row of the block table: token `p` of sequence `b` lives in page
`block_table[b, p // P]`, row `p % P`. Pages come from a shared free list as sequences grow and
go back to it when a sequence finishes, so memory is never fragmented.

`fa.PagedKVCache` does this bookkeeping. The attention functions take the cache in place of
`k`, and read pages, block table, lengths and the page size from it."""),
    ("code", SETUP),
    ("code", HELPERS),
    ("code", """\
try:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
except ImportError:  # the pictures are optional; everything else runs without matplotlib
    plt = None
    print("matplotlib is not installed: the cache pictures are printed as text instead")

P, H, Hk, D = 8, 4, 2, 64  # small pages so that the pictures show a few of them
cache = fa.PagedKVCache(num_blocks=14, page_block_size=P, num_heads_k=Hk, head_dim=D,
                        dtype=DTYPE, max_blocks_per_seq=6, xp=xp)
print(cache)"""),
    ("code", """\
def ownership(cache):
    \"\"\"{page: (seq_id, index in the sequence, tokens in the page)} of every used page.\"\"\"
    ids = cache.seq_ids
    if not ids:
        return {}, ids, np.zeros((0, cache.max_blocks_per_seq), np.int32)
    table, lens = host(cache.block_table(ids)), host(cache.seqlens(ids))
    owner = {}
    for s, row, n in zip(ids, table, lens):
        for i in range(-(-int(n) // cache.page_block_size)):
            start = i * cache.page_block_size
            owner[int(row[i])] = (s, i, min(cache.page_block_size, int(n) - start))
    return owner, ids, table


def draw_cache(cache, title):
    owner, ids, table = ownership(cache)
    if plt is None:
        print(title)
        print("  pool :", " ".join(f"s{owner[p][0]}" if p in owner else "--"
                                    for p in range(cache.num_blocks)))
        for s, row in zip(ids, table):
            print(f"  seq {s}: block table {row.tolist()}")
        return
    colors = plt.get_cmap("tab10")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 1.2 + 0.45 * (2 + len(ids))),
                                      gridspec_kw={"height_ratios": [1.2, max(len(ids), 1)]})
    for page in range(cache.num_blocks):
        s, i, fill = owner.get(page, (None, None, 0))
        face = colors(s % 10) if s is not None else "0.92"
        top.add_patch(plt.Rectangle((page, 0), 0.95, 1, color=face))
        top.add_patch(plt.Rectangle((page, 0), 0.95, fill / cache.page_block_size,
                                    color="black", alpha=0.12))  # how full the page is
        label = f"s{s}.{i}\\n{fill}/{cache.page_block_size}" if s is not None else "free"
        top.text(page + 0.47, 0.5, label, ha="center", va="center", fontsize=8)
    top.set_xlim(0, cache.num_blocks)
    top.set_ylim(0, 1)
    top.set_yticks([])
    top.set_xticks(np.arange(cache.num_blocks) + 0.47, [str(p) for p in range(cache.num_blocks)])
    top.set_title(f"{title}\\npage pool (k_pages/v_pages): owner s<seq>.<index>, tokens / P")
    width = cache.max_blocks_per_seq
    for r, (s, row) in enumerate(zip(ids, table)):
        n_used = sum(1 for o in owner.values() if o[0] == s)
        for c in range(width):
            used = c < n_used
            bottom.add_patch(plt.Rectangle((c, r), 0.95, 0.9,
                                           color=colors(s % 10) if used else "0.97"))
            bottom.text(c + 0.47, r + 0.45, str(int(row[c])) if used else "·",
                        ha="center", va="center", fontsize=9)
    bottom.set_xlim(0, width)
    bottom.set_ylim(max(len(ids), 1), 0)
    bottom.set_yticks(np.arange(len(ids)) + 0.45, [f"seq {s}" for s in ids])
    bottom.set_xticks(np.arange(width) + 0.47, [f"col {c}" for c in range(width)])
    bottom.set_title("block_table: page id per (sequence, logical page); · = unused (holds 0)")
    handles = [Patch(color=colors(s % 10), label=f"seq {s}") for s in ids]
    if handles:
        bottom.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    plt.show()"""),
    ("md", """\
## Prefill: three prompts of different lengths

The prompts' keys/values go into the cache with one packed `append` (`cu_seqlens` says which
rows belong to which sequence); then `flash_attn_varlen_func(q, cache, None, cu_seqlens_q, None,
max_seqlen_q, None, causal=True)` attends over the cache. No `block_table`, `cu_seqlens_k` or
`page_block_size` is passed: the cache supplies them, so they cannot disagree with it."""),
    ("code", """\
prompts = [21, 6, 13]
ids = [cache.add_sequence() for _ in prompts]
cu = np.concatenate([[0], np.cumsum(prompts)]).astype(np.int32)
k_prompt, v_prompt = randn(int(cu[-1]), Hk, D), randn(int(cu[-1]), Hk, D)
cache.append(ids, k_prompt, v_prompt, cu_seqlens=cu)

q = randn(int(cu[-1]), H, D)
out = fa.flash_attn_varlen_func(q, cache, None, xp.asarray(cu), None, max(prompts), None,
                                causal=True)

# Keep each sequence's keys/values on the host to check every step against the reference.
history = {s: (host(k_prompt)[cu[j]:cu[j + 1]], host(v_prompt)[cu[j]:cu[j + 1]])
           for j, s in enumerate(ids)}
worst = 0.0
for j, s in enumerate(ids):
    err, bound = error_and_bound(host(out)[cu[j]:cu[j + 1]], host(q)[cu[j]:cu[j + 1]],
                                 *history[s], causal=True)
    worst = max(worst, err / bound)
print("lengths", host(cache.seqlens()).tolist(), "| free pages", cache.num_free_blocks,
      f"| prefill error / bound <= {worst:.2f}")
draw_cache(cache, "after prefill")"""),
    ("md", """\
## Decode: one token per sequence per step

`flash_attn_with_kvcache(q, cache, None, k_new, v_new, seq_ids=...)` appends each sequence's new
key/value (allocating a page when a sequence crosses a page boundary) and attends with the new
query. After step 2, sequence 1 finishes: `cache.free(seq)` returns its pages, and a new prompt
that arrives next gets exactly those pages (the free list is last-in, first-out)."""),
    ("code", """\
def decode_step(active):
    global worst
    B = len(active)
    q1, k1, v1 = randn(B, 1, H, D), randn(B, 1, Hk, D), randn(B, 1, Hk, D)
    out1 = fa.flash_attn_with_kvcache(q1, cache, None, k1, v1, seq_ids=active, causal=True)
    for j, s in enumerate(active):
        keys = np.concatenate([history[s][0], host(k1)[j]])
        values = np.concatenate([history[s][1], host(v1)[j]])
        history[s] = (keys, values)
        err, bound = error_and_bound(host(out1)[j], host(q1)[j], keys, values, causal=True)
        worst = max(worst, err / bound)


active = list(ids)
for step in range(3):
    decode_step(active)
print("after 3 decode steps: lengths", dict(zip(active, host(cache.seqlens(active)).tolist())))

finished = active[1]
freed = host(cache.block_table([finished]))[0, : -(-int(host(cache.seqlens([finished]))[0]) // P)]
cache.free(finished)
active.remove(finished)
print(f"sequence {finished} finished: pages {freed.tolist()} returned,",
      cache.num_free_blocks, "free")

new = cache.add_sequence()  # a new prompt arrives: prefill it alone
n_new = 11
k_p, v_p, q_p = randn(1, n_new, Hk, D), randn(1, n_new, Hk, D), randn(n_new, H, D)
cache.append([new], k_p, v_p)
out_p = fa.flash_attn_varlen_func(q_p, cache, None, xp.asarray(np.array([0, n_new], np.int32)),
                                  None, n_new, None, causal=True, seq_ids=[new])
history[new] = (host(k_p)[0], host(v_p)[0])
err, bound = error_and_bound(out_p, q_p, *history[new], causal=True)
worst = max(worst, err / bound)
print(f"sequence {new} (prompt of {n_new}) got pages",
      host(cache.block_table([new]))[0, : -(-n_new // P)].tolist(), "- reused")
active.append(new)
for step in range(4):
    decode_step(active)
print("lengths", dict(zip(active, host(cache.seqlens(active)).tolist())),
      "| free pages", cache.num_free_blocks)
print(f"every prefill/decode output within flash-attn's bound: {worst <= 1} "
      f"(worst error / bound = {worst:.2f})")
draw_cache(cache, f"after freeing sequence {finished} and adding sequence {new}")"""),
    ("md", """\
## Running out of pages

`append` checks capacity before touching anything: when the pool cannot hold the new tokens it
raises `CacheExhaustedError` (a `ValueError`) saying how many pages are needed and how to fix
it, and the cache is left exactly as it was."""),
    ("code", """\
try:
    big = cache.add_sequence()
    cache.append([big], randn(1, 6 * P, Hk, D), randn(1, 6 * P, Hk, D))
except fa.CacheExhaustedError as e:
    print(type(e).__name__ + ":", e)
print("unchanged:", cache)"""),
]

# -- 03 page_block_size story -------------------------------------------------------------------

STORY = [
    ("md", """\
# 03 · The page-size mismatch this project started from

candle's flash-attention binding once failed with

```
page_block_size 16 does not match k shape (blocks, 32, Hk, D)
```

The model configuration said the KV cache's pages hold 16 tokens; the code that *allocated* the
cache used another constant, 32. Two numbers that must agree lived in two places and drifted
apart. Had nothing checked, the kernel would have looked for token `p` in page
`block_table[b, p // 16]`, row `p % 16` of a pool whose pages hold 32 rows: silently the wrong
keys.

`cupy_flashattn` checks this before any kernel runs and raises a typed error
(`PageSizeMismatchError`, a `ShapeError` and a `ValueError`) that keeps the familiar wording,
shows both values and says how to fix it. Below: the mistake, then three fixes."""),
    ("code", SETUP),
    ("code", HELPERS),
    ("code", """\
H, Hk, D = 4, 2, 64
lengths = [40, 25]  # two sequences already in the cache
keys = [rng.standard_normal((n, Hk, D)).astype(DTYPE) for n in lengths]
values = [rng.standard_normal((n, Hk, D)).astype(DTYPE) for n in lengths]
q = randn(len(lengths), 1, H, D)  # one decode query per sequence


def paged_cache(page_size, num_blocks=8):
    \"\"\"Allocate k/v pages of `page_size` rows and scatter the sequences into them.\"\"\"
    k_pages = np.zeros((num_blocks, page_size, Hk, D), DTYPE)
    v_pages = np.zeros_like(k_pages)
    table = np.zeros((len(lengths), num_blocks // len(lengths)), np.int32)
    next_page = 0
    for b, n in enumerate(lengths):
        for i in range(-(-n // page_size)):
            table[b, i] = next_page
            next_page += 1
        pos = np.arange(n)
        k_pages[table[b, pos // page_size], pos % page_size] = keys[b]
        v_pages[table[b, pos // page_size], pos % page_size] = values[b]
    return xp.asarray(k_pages), xp.asarray(v_pages), xp.asarray(table)


cache_seqlens = xp.asarray(np.array(lengths, np.int32))
print("reference ready:", len(lengths), "sequences of", lengths, "tokens")"""),
    ("md", """\
## The mistake

The configuration says 16; the allocation uses 32."""),
    ("code", """\
PAGE_BLOCK_SIZE = 16  # model config
ALLOC_PAGE_SIZE = 32  # ... and, elsewhere, the allocator's own constant
k_cache, v_cache, block_table = paged_cache(ALLOC_PAGE_SIZE)
print("k_cache", k_cache.shape)

try:
    fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                               block_table=block_table, page_block_size=PAGE_BLOCK_SIZE)
except fa.PageSizeMismatchError as e:
    print(f"{type(e).__name__} (a ShapeError: {isinstance(e, fa.ShapeError)}, "
          f"a ValueError: {isinstance(e, ValueError)}):\\n")
    print(e)"""),
    ("md", """\
The configured object (`fa.FlashAttention`, the equivalent of candle's builder) holds the page
size once and compares it with every cache it is given, with the same error:"""),
    ("code", """\
attn = fa.FlashAttention(causal=True, page_block_size=PAGE_BLOCK_SIZE)
print(attn)
try:
    attn.with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table)
except fa.PageSizeMismatchError as e:
    print("PageSizeMismatchError:", str(e).split(":")[0], "...")"""),
    ("md", """\
## Fix 1: one constant

Allocate the cache with the configured page size (or configure the size the cache was
allocated with): a single constant used in both places."""),
    ("code", """\
PAGE_BLOCK_SIZE = 16
k_cache1, v_cache1, table1 = paged_cache(PAGE_BLOCK_SIZE)
out1 = fa.flash_attn_with_kvcache(q, k_cache1, v_cache1, cache_seqlens=cache_seqlens,
                                  block_table=table1, page_block_size=PAGE_BLOCK_SIZE)
print("fix 1:", k_cache1.shape, "-> out", out1.shape)"""),
    ("md", """\
## Fix 2: don't pass the page size at all

`page_block_size` is optional: when omitted it is read from `k_cache.shape[1]`, so the cache
allocated with 32 just works and there is no second number to keep in sync."""),
    ("code", """\
out2 = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                  block_table=block_table)
print("fix 2:", k_cache.shape, f"(page size read from k_cache.shape[1] = {k_cache.shape[1]})")"""),
    ("md", """\
## Fix 3: `PagedKVCache`

The cache object owns the pages, the block table and the lengths; the functions read all of
them, including the page size, from it. The mismatch cannot be written."""),
    ("code", """\
cache = fa.PagedKVCache(num_blocks=8, page_block_size=16, num_heads_k=Hk, head_dim=D,
                        dtype=DTYPE, xp=xp)
seqs = [cache.add_sequence() for _ in lengths]
cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
cache.append(seqs, xp.asarray(np.concatenate(keys)), xp.asarray(np.concatenate(values)),
             cu_seqlens=cu)
out3 = fa.flash_attn_with_kvcache(q, cache, None, seq_ids=seqs)
print("fix 3:", cache)"""),
    ("md", "## All three give the same, correct answer"),
    ("code", """\
for name, out in [("one constant", out1), ("page size from the cache", out2),
                  ("PagedKVCache", out3)]:
    errs = [error_and_bound(host(out)[b], host(q)[b], keys[b], values[b])
            for b in range(len(lengths))]
    err, bound = max(e for e, _ in errs), min(b for _, b in errs)
    print(f"{name:<26} max error {err:.3g} (bound {bound:.3g})",
          "ok" if err <= bound else "ABOVE BOUND")
print("fixes agree:", all(np.array_equal(host(out1), host(o)) for o in (out2, out3)))"""),
]

# -- 04 DLPack interop --------------------------------------------------------------------------

DLPACK = [
    ("md", """\
# 04 · PyTorch tensors in and out through DLPack, no copy

CuPy and PyTorch can share GPU memory through DLPack: `cupy.from_dlpack(tensor)` and
`torch.from_dlpack(cupy_array)` wrap the same device pointer, no copy. The attention functions
also accept torch CUDA tensors directly (they adopt them with `cupy.from_dlpack`) and return
CuPy arrays.

Streams: our kernels run on CuPy's *current* stream. Make it PyTorch's current stream
(`cupy.cuda.Stream.from_external(torch.cuda.current_stream())` on CuPy >= 14,
`cupy.cuda.ExternalStream(torch_stream.cuda_stream)` before) and the work is ordered with
PyTorch's without any synchronisation.

On a machine without PyTorch or without a GPU the GPU cells say why and skip."""),
    ("code", SETUP),
    ("code", """\
try:
    import torch
except ImportError:
    torch = None
TORCH_GPU = torch is not None and torch.cuda.is_available() and USE_GPU
if torch is None:
    print("PyTorch is not installed: the torch cells below skip (pip install torch to run them)")
elif not TORCH_GPU:
    why = ("torch sees no CUDA device" if not torch.cuda.is_available()
           else "cupy_flashattn uses the CPU backend")
    print(f"torch {torch.__version__} without GPU ({why}): the GPU cells skip; "
          "the CPU DLPack cell runs")
else:
    print(f"torch {torch.__version__}, CUDA device {torch.cuda.get_device_name()}")"""),
    ("md", """\
## torch -> CuPy -> attention -> torch, on torch's stream"""),
    ("code", """\
if TORCH_GPU:
    B, S, H, Hk, D = 2, 256, 8, 2, 128
    opts = {"device": "cuda", "dtype": torch.bfloat16}
    q_t, k_t, v_t = (torch.randn(B, S, h, D, **opts) for h in (H, Hk, Hk))

    def cupy_view_of(stream):
        \"\"\"The same CUDA stream as a CuPy stream object (no new stream is created).\"\"\"
        if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy >= 14: CUDA stream protocol
            return cupy.cuda.Stream.from_external(stream)
        return cupy.cuda.ExternalStream(stream.cuda_stream)

    torch_stream = cupy_view_of(torch.cuda.current_stream())
    print("same stream:", torch_stream.ptr == torch.cuda.current_stream().cuda_stream)
    with torch_stream:  # our kernels are queued on torch's current stream
        q_c = cupy.from_dlpack(q_t)  # a view, not a copy
        out_c = fa.flash_attn_func(q_t, k_t, v_t, causal=True)  # torch tensors go straight in
        out_t = torch.from_dlpack(out_c)  # and the result goes back, again without a copy

    print("q:   torch", hex(q_t.data_ptr()), "== cupy ", hex(q_c.data.ptr),
          q_t.data_ptr() == q_c.data.ptr)
    print("out: cupy ", hex(out_c.data.ptr), "== torch", hex(out_t.data_ptr()),
          out_c.data.ptr == out_t.data_ptr())
    print("out_t", tuple(out_t.shape), out_t.dtype, out_t.device)
else:
    print("skipped: needs torch with CUDA and a GPU for cupy_flashattn")"""),
    ("md", """\
A preallocated torch tensor can be the output buffer: the kernel writes into torch's memory."""),
    ("code", """\
if TORCH_GPU:
    out_buf = torch.empty_like(q_t)
    with torch_stream:
        res = fa.flash_attn_func(q_t, k_t, v_t, causal=True, out=out_buf)
    print("written in place:", res.data.ptr == out_buf.data_ptr())

    # Compare with PyTorch's own attention (kv heads repeated for GQA; equal Sq = Sk, so
    # torch's top-left causal mask equals our bottom-right one).
    ref_t = torch.nn.functional.scaled_dot_product_attention(
        q_t.transpose(1, 2), k_t.transpose(1, 2).repeat_interleave(H // Hk, 1),
        v_t.transpose(1, 2).repeat_interleave(H // Hk, 1), is_causal=True).transpose(1, 2)
    diff = (out_buf.float() - ref_t.float()).abs().max().item()
    print(f"max |ours - torch SDPA| = {diff:.3g} (bf16)")
else:
    print("skipped: needs torch with CUDA and a GPU for cupy_flashattn")"""),
    ("md", """\
## On the CPU: NumPy views of torch tensors

NumPy speaks DLPack too (`np.from_dlpack`), so CPU tensors reach the Numba backend without a
copy. (NumPy has no bfloat16 DLPack type, so this uses float32.)"""),
    ("code", """\
if torch is not None:
    q_t, k_t, v_t = (torch.randn(1, 64, h, 32) for h in (4, 2, 2))
    q_n, k_n, v_n = (np.from_dlpack(t) for t in (q_t, k_t, v_t))
    out_n = fa.flash_attn_func(q_n, k_n, v_n, causal=True)
    out_t = torch.from_dlpack(out_n)
    print("q:   torch", hex(q_t.data_ptr()), "== numpy", hex(q_n.ctypes.data),
          q_t.data_ptr() == q_n.ctypes.data)
    print("out: numpy", hex(out_n.ctypes.data), "== torch", hex(out_t.data_ptr()),
          out_n.ctypes.data == out_t.data_ptr())
    ref = attention_ref(q_n, k_n, v_n, causal=True)
    print(f"max |out - float64 reference| = {np.abs(out_n - ref).max():.2e} (float32)")
else:
    print("skipped: PyTorch is not installed")"""),
    ("md", """\
Without PyTorch the same zero-copy exchange works with any DLPack producer: JAX
(`jax.dlpack`), Numba CUDA arrays, or another CuPy array."""),
]

# -- 05 performance -----------------------------------------------------------------------------

PERF = [
    ("md", """\
# 05 · Performance against the peers

`make bench` (`benchmarks/bench.py`) writes its results to `benchmarks/results/`: a CSV
(`bench.csv`, one row per configuration), plots, and the summary table
`benchmarks/results/h200.md` for the H200 run. This notebook plots every CSV it finds there:
TFLOP/s for prefill (compute-bound; FLOPs = 4·B·H·Sq·Sk·D, half with a causal mask) and GB/s
for decode (memory-bound; bytes of K and V read / time), one line per provider, one panel per
configuration (dtype, head dim, mask). `docs/performance.md` explains how to read them.

It only reads files, so it runs anywhere; without result files it says so and stops.
`CUPY_FLASHATTN_RESULTS` points it at another directory."""),
    ("code", """\
import csv
import glob
import math
import os

ROOT = os.environ.get("CUPY_FLASHATTN_ROOT") or os.path.dirname(os.getcwd())
RESULTS = os.environ.get("CUPY_FLASHATTN_RESULTS") or os.path.join(ROOT, "benchmarks", "results")
files = sorted(glob.glob(os.path.join(RESULTS, "*.csv")))
rows = []
for path in files:
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            row["_file"] = os.path.basename(path)
            rows.append(row)
if not rows:
    print(f"No benchmark results in {RESULTS} (no *.csv). Run `make bench` on a GPU machine "
          "first; nothing to plot.")
else:
    print(f"{len(rows)} rows from {len(files)} file(s):",
          ", ".join(os.path.basename(p) for p in files))
    print("columns:", ", ".join(c for c in rows[0] if c != "_file"))"""),
    ("md", """\
The CSV layout is read defensively. A *metric column* is `tflops` / `gbps` (ours) or
`<peer>_tflops` / `<peer>_gbps` (a peer measured on the same configuration, e.g. torch SDPA's
`flash` and `cudnn` backends); a `provider` column, if present, names the provider of a row
instead. `mode` (dense, varlen, paged16, ...) distinguishes our variants; `seqlen` (or a
similar column) is the x axis; `dtype`, `d`, `causal` pick the panel."""),
    ("code", """\\
def number(value):
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def field(row, *names):
    \"\"\"The first column of `row` among `names` (case-insensitive) holding a value.\"\"\"
    lower = {c.lower(): c for c in row}
    for name in names:
        col = lower.get(name)
        if col is not None and row[col] not in (None, ""):
            return col
    return None


X_NAMES = ("seqlen", "seqlen_k", "seq_len", "sk", "s", "context", "cache_len", "kv_len")
GROUPS = {"dtype": ("dtype",), "D": ("d", "head_dim", "headdim"), "causal": ("causal",),
          "P": ("page_block_size", "page_size")}
UNITS = {"tflops": "TFLOP/s", "tflop_s": "TFLOP/s", "gbps": "GB/s", "gb_s": "GB/s"}
TORCH_BACKENDS = {"flash", "cudnn", "math", "efficient", "mem_efficient"}


def metric(col):
    \"\"\"(unit, peer name or None) of a metric column, or None.\"\"\"
    low = col.lower()
    for suffix, unit in UNITS.items():
        if low == suffix:
            return unit, None
        if low.endswith("_" + suffix):
            return unit, col[: -len(suffix) - 1]
    return None


def group_of(row):
    return tuple((label, row[c]) for label, names in GROUPS.items()
                 if (c := field(row, *names)))


def records():
    \"\"\"Long format: {(kind, unit, group): {provider: {x: y}}}, first value wins.\"\"\"
    out = {}
    for i, row in enumerate(rows):
        xcol = field(row, *X_NAMES)
        x = number(row[xcol]) if xcol else float(i)
        provider, mode, kind = (field(row, *n) for n in (("provider", "impl", "library"),
                                                         ("mode", "variant"),
                                                         ("kind", "phase", "workload")))
        for col in row:
            found = metric(col) if col != "_file" else None
            y = number(row[col]) if found else None
            if y is None:
                continue
            unit, peer = found
            if peer is None:
                name = row[provider] if provider else "cupy_flashattn"
                name += f" {row[mode]}" if mode else ""
            else:
                name = f"torch SDPA {peer}" if peer.lower() in TORCH_BACKENDS else peer
            k = row[kind].lower() if kind else ("prefill" if unit == "TFLOP/s" else "decode")
            out.setdefault((k, unit, group_of(row)), {}).setdefault(name, {}).setdefault(x, y)
    return out


panels = dict(sorted(records().items(), key=lambda kv: (kv[0][0] != "prefill", kv[0])))
print(f"{len(panels)} panel(s)")"""),
    ("code", """\
try:
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
    print("matplotlib is not installed: tables only")


def title(kind, unit, group):
    parts = []
    for label, v in group:
        if label == "causal":
            parts.append("causal" if str(v).lower() in ("1", "true") else "non-causal")
        else:
            parts.append(str(v) if label == "dtype" else f"{label}={v}")
    return f"{kind} ({unit}): " + " ".join(parts)


if not panels:
    print("nothing to plot")
else:
    for key, providers in panels.items():
        print(title(*key))
        for name, pts in providers.items():
            print(f"    {name:<26}", "  ".join(f"{x:g}: {y:.4g}" for x, y in sorted(pts.items())))
    if plt is not None:
        ncols = min(3, len(panels))
        nrows = -(-len(panels) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
        for ax, (key, providers) in zip(axes.flat, panels.items()):
            for name, pts in sorted(providers.items()):
                xs, ys = zip(*sorted(pts.items()))
                peer = not name.startswith("cupy_flashattn")
                ax.plot(xs, ys, marker="s" if peer else "o", linestyle="--" if peer else "-",
                        label=name)
            if min(min(p) for p in providers.values()) > 0:
                ax.set_xscale("log", base=2)
            ax.set_title(title(*key), fontsize=9)
            ax.set_xlabel("sequence length (keys)")
            ax.set_ylabel(key[1])
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.tight_layout()
        plt.show()"""),
    ("md", """\
Our throughput relative to each peer, where the CSV has `ratio_<peer>` columns (1.0 = as fast
as the peer on the same configuration):"""),
    ("code", """\
ratios = sorted({c for row in rows for c in row if c.lower().startswith("ratio_")})
if not ratios:
    print("no ratio_<peer> columns" if rows else "nothing to summarise")
else:
    print(f"{'configuration':<40}" + "".join(f"{c:>14}" for c in ratios))
    for row in rows:
        values = [number(row.get(c)) for c in ratios]
        if all(v is None for v in values):
            continue
        extra = [row[c] for c in (field(row, "mode", "variant"), field(row, *X_NAMES)) if c]
        config = " ".join(str(v) for v in [v for _, v in group_of(row)] + extra)
        print(f"{config:<40}" + "".join(f"{v:>14.2f}" if v is not None else f"{'-':>14}"
                                        for v in values))"""),
]

NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_paged_kv_inference.ipynb": PAGED,
    "03_page_block_size_story.ipynb": STORY,
    "04_interop_dlpack.ipynb": DLPACK,
    "05_performance.ipynb": PERF,
}


def build(name: str, cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    stem = name.split("_")[0]
    for i, (kind, text) in enumerate(cells):
        new = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
        cell = new(text)
        cell.id = f"nb{stem}-{i:02d}"  # stable ids: regenerating gives identical files
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name, NOTEBOOKS[name])) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    args = parser.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        text = render(name)
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print("wrote", path)
    if stale:
        print("out of date (run python examples/_make_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
