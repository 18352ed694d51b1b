"""Element offsets past 2**31 on the GPU (issue 10, defect 3), for every kernel.

A serving process gives most of the card to its KV cache; a bf16 cache of 8 kv heads x 128 dims
passes 2**31 elements at 131072 pages of 16 tokens (4.3 GB).  These tests put the keys and
values a call reads -- and the rows an append writes -- above element 2**31 (and, for the dense
buffers, across element 2**32), and compare with the float64 reference computed on just the
rows involved, gathered on the host:

* a 140000-page bf16 pool (4.6 GB per pool; pages >= 131072 start past element 2**31, pages
  >= 65536 past byte 2**31): decode with append + rotary (the rotary/append kernel writes
  there), decode with split-KV (the combine kernel), paged prefill (varlen with a block table,
  prefill and decode kernels in one mixed batch), and a ``PagedKVCache`` of that many pages;
* dense k/v of 4 x (2**20 + 200) rows of 8 x 128 (2**32 + 819200 elements, 8.6 GB each):
  ``flash_attn_func`` (prefill and decode kernels) with windows straddling elements 2**31 and
  2**32, ``flash_attn_with_kvcache`` on it as a contiguous cache (rotary + append at element
  2**32 exactly, split-KV forced), and a varlen batch whose ``cu_seqlens_k`` offsets pass
  2**31 / (Hk * D) rows.

Everything the kernels must not touch is NaN (bf16 0x7FC0): unused pages, page tails past a
sequence's length, unused block-table entries (they point at a NaN page), the dense rows
outside the windows.  So a read from a wrapped (32-bit) offset gives NaN or a wrong value, and a
stray write changes the pool's NaN count, which is checked exactly after every call.  Rows a
kernel may legitimately load and then mask (the rest of a key tile next to a window, see
test_gpu_nan.py's docstring) are finite: MARGIN rows before each window.  Outputs are poisoned
with NaN through ``out=``; calls run with ``check=True`` so the host-side block-table and length
checks see the large ids too.

Memory: the paged tests hold ~9.2 GB (pools) and the dense ones ~17.2 GB (k and v), each group
freed before the next; each skips when the card has less free memory.  Select them with
``-k large_offsets``; about a minute on an H200, most of it NVRTC and the float64 reference.
Nothing touches the GPU at import or collection time.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import cupy_flashattn as fa  # noqa: E402
from cupy_flashattn.rotary import apply_rotary  # noqa: E402
from helpers import (  # noqa: E402
    BF16, assert_lse_close, assert_within_bound, randn, ref_and_naive, cu_seqlens,
)

pytestmark = pytest.mark.gpu

HK, D, P = 8, 128, 16
ROW = HK * D  # elements of one token row
PAGE = P * ROW  # 16384 elements of one page
GIB = 2**30
TWO31, TWO32 = 2**31, 2**32
NUM_PAGES = 140_000  # pages >= 131072 = 2**31 / PAGE start past element 2**31
HIGH = TWO31 // PAGE  # 131072
MID = TWO31 // (2 * PAGE)  # 65536: pages from here start past byte 2**31
NAN_PAGE = NUM_PAGES - 2  # never written: unused block-table entries point here
NAN16 = 0x7FC0  # bf16 quiet NaN
MARGIN = 256  # finite rows before a dense window (>= any kBlockN: masked keys of a loaded tile)
LSE_TOL = dict(rtol=2e-3, atol=2e-3)

# Dense buffers: 4 batch rows of SK token rows, 2**32 + 819200 elements per tensor.
B_DENSE = 4
SK = 2**20 + 200
ROWS = B_DENSE * SK
EDGE31 = TWO31 // ROW  # 2**21: first token row at element >= 2**31
EDGE32 = TWO32 // ROW  # 2**22: first token row at element >= 2**32


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    from cupy_flashattn import _cuda

    if not _cuda.is_available():
        pytest.skip("no sm_80+ GPU")


# -- helpers ----------------------------------------------------------------------------------


def _release():
    cp.get_default_memory_pool().free_all_blocks()


def _require_gib(gib: float, what: str) -> None:
    _release()
    free, _ = cp.cuda.runtime.memGetInfo()
    if free < gib * GIB:
        pytest.skip(f"{what} needs {gib:.1f} GiB of free GPU memory; {free / GIB:.1f} GiB free")


def _bits(a):
    """``a`` (bf16, C-contiguous) as uint16 token rows (rows, Hk * D), a view."""
    return a.view(cp.uint16).reshape(-1, a.shape[-2] * a.shape[-1])


def _chunks(rows2d):
    """Row blocks of at most 2**30 elements (CuPy's own kernels index each block in 32 bits)."""
    step = max(1, GIB // int(rows2d.shape[1]))
    for i in range(0, int(rows2d.shape[0]), step):
        yield rows2d[i : i + step]


@functools.cache
def _nan_count_kernel():
    return cp.ReductionKernel(
        # Decimal literals: CuPy renames the parameter inside hex literals too (0x7FFF would
        # become 0in07FFF).  32767 = 0x7FFF (all but the sign bit), 32640 = 0x7F80 (+inf).
        "uint16 bits", "int64 y", "((bits & 32767) > 32640) ? 1 : 0", "a + b", "y = a", "0",
        "fa_test_bf16_nan_count",
    )


def _nan_count(a) -> int:
    """Number of NaN elements of a bf16 device array (one host sync)."""
    kernel = _nan_count_kernel()
    return int(sum(kernel(c) for c in _chunks(_bits(a))))


def _fill_nan(a) -> None:
    for c in _chunks(_bits(a)):
        c.fill(NAN16)


def _assert_bits_equal(got, expected, what: str) -> None:
    g = np.ascontiguousarray(np.asarray(got, dtype=BF16)).view(np.uint16)
    e = np.ascontiguousarray(np.asarray(expected, dtype=BF16)).view(np.uint16)
    assert g.shape == e.shape, f"{what}: shape {g.shape} != {e.shape}"
    bad = np.argwhere(g != e)
    assert bad.size == 0, f"{what}: {len(bad)} elements differ, first at {tuple(bad[0])}"


def _rotary_tables(n: int, half: int):
    """float32 cos/sin tables (n, half) on the device."""
    inv = 1.0 / (10000.0 ** (cp.arange(half, dtype=cp.float64) / half))
    ang = cp.arange(n, dtype=cp.float64)[:, None] * inv[None, :]
    return cp.cos(ang).astype(cp.float32), cp.sin(ang).astype(cp.float32)


def _rotated(x, cos_rows, sin_rows, interleaved):
    """NumPy rotary of x (S, H, D) with cos/sin rows (S, half): the kernel's bit-exact twin."""
    pos = np.arange(x.shape[0])[None, :]
    return apply_rotary(x[None], cos_rows, sin_rows, pos, interleaved)[0]


def _poisoned(shape):
    return cp.full(shape, np.nan, dtype=BF16)


def _check_attention(out_b, lse_b, q, k, v, what, **mask):
    """out (Sq, H, D) / lse (H, Sq) of one sequence against the float64 reference."""
    ref, ref_lse, naive = ref_and_naive(q, k, v, **mask)
    assert_within_bound(out_b, ref, naive, BF16, what=what)
    assert_lse_close(lse_b, ref_lse, **LSE_TOL)


# -- (a) a 140000-page pool: pages past element 2**31 ----------------------------------------


def _pick_pages(rng, counts):
    """Distinct page ids per sequence (4 sequences): seq 0 starts exactly at page 131072 (element
    2**31) and ends on the pool's last page (where a decode step appends); seq 1 mixes low
    (< 65536), mid and high pages in a random order; seq 2 only high pages; seq 3 starts on
    pages 131070-131071, just below 2**31, then high ones.  NAN_PAGE is never used."""
    head = {0: [HIGH], 1: [0, MID - 1, MID, HIGH - 8, HIGH + 7], 2: [], 3: [HIGH - 2, HIGH - 1]}
    tail = {0: [NUM_PAGES - 1]}
    taken = {NAN_PAGE} | {p for f in (*head.values(), *tail.values()) for p in f}
    pages = []
    for b, n in enumerate(counts):
        lo = 0 if b == 1 else HIGH
        mine = list(head[b])
        while len(mine) < n - len(tail.get(b, [])):
            cand = int(rng.integers(lo, NUM_PAGES))
            if cand not in taken:
                taken.add(cand)
                mine.append(cand)
        mine += tail.get(b, [])
        if b == 1:
            rng.shuffle(mine)
        assert len(mine) == n
        pages.append(np.array(mine, dtype=np.int32))
    return pages


class PagedSeqs:
    """Four sequences of random keys/values written page by page into the NaN pool (rows past a
    sequence's length stay NaN); host copies kept; :meth:`reset` makes their pages NaN again."""

    def __init__(self, pool, rng, lens, room):
        self.k, self.v = pool["k"], pool["v"]
        self.lens = list(lens)
        counts = [-(-(n + room) // P) for n in lens]
        self.pages = _pick_pages(rng, counts)
        self.table = np.full((len(lens), max(counts) + 2), NAN_PAGE, dtype=np.int32)
        for b, pg in enumerate(self.pages):
            self.table[b, : len(pg)] = pg
        self.keys = [randn(rng, (n, HK, D), BF16) for n in lens]
        self.values = [randn(rng, (n, HK, D), BF16) for n in lens]
        for b, pg in enumerate(self.pages):
            for dst, src in ((self.k, self.keys[b]), (self.v, self.values[b])):
                host = np.full((len(pg) * P, HK, D), np.nan, dtype=BF16)
                host[: len(src)] = src
                host = host.reshape(len(pg), P, HK, D)
                for j, page in enumerate(pg):
                    dst[int(page)] = cp.asarray(host[j])

    def gather(self, b, n):
        """Positions [0, n) of sequence b as (n, Hk, D) host arrays, read back page by page."""
        pg = self.pages[b][: -(-n // P)]
        k = np.concatenate([self.k[int(p)].get() for p in pg])[:n]
        v = np.concatenate([self.v[int(p)].get() for p in pg])[:n]
        return k, v

    def reset(self):
        for pg in self.pages:
            for page in pg:
                self.k[int(page)].view(cp.uint16).fill(NAN16)
                self.v[int(page)].view(cp.uint16).fill(NAN16)


def _nan_kv(shape) -> dict:
    """bf16 k and v of ``shape`` filled with NaN: an element no test writes stays NaN, so a
    read of the wrong row shows in the output."""
    state = {"k": cp.empty(shape, dtype=BF16), "v": cp.empty(shape, dtype=BF16)}
    _fill_nan(state["k"])
    _fill_nan(state["v"])
    return state


@pytest.fixture(scope="class")
def pool():
    """The two NaN-filled 140000-page pools, freed when the class's tests are done."""
    _require_gib(2 * NUM_PAGES * PAGE * 2 / GIB + 1.5, "the 140000-page pool")
    state = _nan_kv((NUM_PAGES, P, HK, D))
    yield state
    state.clear()
    _release()


class TestPagedPoolLargeOffsets:
    """A bf16 pool of 140000 pages of 16 x 8 x 128 (2.29e9 elements per pool)."""

    @staticmethod
    def _assert_layout(seqs):
        all_pages = np.concatenate(seqs.pages).astype(np.int64)
        assert all_pages.max() == NUM_PAGES - 1  # the pool's last page is used
        assert (all_pages >= HIGH).sum() > 50 and (all_pages < MID).any()
        assert (all_pages >= MID).any() and (all_pages < HIGH).any()
        assert int(seqs.pages[0][0]) * PAGE == TWO31  # seq 0's first key is element 2**31

    def test_large_offsets_paged_decode_append_rotary(self, pool):
        """Decode step (Sq = S_new = 2, GQA 32/8, causal) with the append + rotary kernel writing
        the new rows past element 2**31, no split."""
        rng = np.random.default_rng(31)
        H, S_new = 32, 2
        seqs = PagedSeqs(pool, rng, [37, 700, 1500, 259], room=S_new)
        self._assert_layout(seqs)
        k, v = pool["k"], pool["v"]
        B = len(seqs.lens)
        lens = np.array(seqs.lens, dtype=np.int32)
        q = randn(rng, (B, S_new, H, D), BF16)
        k_new, v_new = randn(rng, (B, S_new, HK, D), BF16), randn(rng, (B, S_new, HK, D), BF16)
        cos, sin = _rotary_tables(4096, D // 4)  # rotary_dim = 64 of 128
        nan_k, nan_v = _nan_count(k), _nan_count(v)
        assert nan_k == nan_v == k.size - int(lens.sum()) * ROW  # only the sequences are finite
        out = _poisoned(q.shape)
        res, lse = fa.flash_attn_with_kvcache(
            cp.asarray(q), k, v, cp.asarray(k_new), cp.asarray(v_new), rotary_cos=cos,
            rotary_sin=sin, cache_seqlens=cp.asarray(lens), block_table=cp.asarray(seqs.table),
            causal=True, rotary_interleaved=False, num_splits=1, return_softmax_lse=True,
            out=out, check=True,
        )
        assert res is out
        # Exactly the B * S_new new rows were written, nothing else in either pool.
        assert _nan_count(k) == nan_k - B * S_new * ROW
        assert _nan_count(v) == nan_v - B * S_new * ROW
        out_h, lse_h = out.get(), lse.get()
        cos_h, sin_h = cos.get(), sin.get()
        for b in range(B):
            L = int(lens[b])
            rows = slice(L, L + S_new)
            k_rot = _rotated(k_new[b], cos_h[rows], sin_h[rows], False)
            q_rot = _rotated(q[b], cos_h[rows], sin_h[rows], False)
            got_k, got_v = seqs.gather(b, L + S_new)
            _assert_bits_equal(got_k[:L], seqs.keys[b], f"seq {b}: cached keys")
            _assert_bits_equal(got_v[:L], seqs.values[b], f"seq {b}: cached values")
            _assert_bits_equal(got_k[L:], k_rot, f"seq {b}: appended (rotated) keys")
            _assert_bits_equal(got_v[L:], v_new[b], f"seq {b}: appended values")
            _check_attention(out_h[b], lse_h[b], q_rot, got_k, got_v, f"decode seq {b}",
                             causal=True)
        seqs.reset()

    def test_large_offsets_paged_decode_split_kv(self, pool):
        """Decode (Sq = 1) with 7 splits forced: the combine kernel merges partials of pages
        past 2**31 (and empty partials of the short sequences); softcap on."""
        rng = np.random.default_rng(32)
        H = 32
        seqs = PagedSeqs(pool, rng, [37, 700, 1500, 259], room=0)
        self._assert_layout(seqs)
        k, v = pool["k"], pool["v"]
        B = len(seqs.lens)
        lens = np.array(seqs.lens, dtype=np.int32)
        q = randn(rng, (B, 1, H, D), BF16)
        nan_k = _nan_count(k)
        out = _poisoned(q.shape)
        _, lse = fa.flash_attn_with_kvcache(
            cp.asarray(q), k, v, cache_seqlens=cp.asarray(lens),
            block_table=cp.asarray(seqs.table), softcap=20.0, num_splits=7,
            return_softmax_lse=True, out=out, check=True,
        )
        assert _nan_count(k) == nan_k
        out_h, lse_h = out.get(), lse.get()
        for b in range(B):
            _check_attention(out_h[b], lse_h[b], q[b], seqs.keys[b], seqs.values[b],
                             f"split decode seq {b}", softcap=20.0)
        seqs.reset()

    def test_large_offsets_paged_prefill_varlen(self, pool):
        """flash_attn_varlen_func with a block table, 265 queries (GQA 16/8, causal): the prefill
        kernel for the long query sequences, the decode kernel for the 1-query one (mixed)."""
        rng = np.random.default_rng(33)
        H = 16
        lens_k, lens_q = [37, 700, 900, 259], [1, 128, 96, 40]
        seqs = PagedSeqs(pool, rng, lens_k, room=0)
        self._assert_layout(seqs)
        k, v = pool["k"], pool["v"]
        cu_q = cu_seqlens(lens_q)
        cu_k = cu_seqlens(lens_k)
        q = randn(rng, (int(cu_q[-1]), H, D), BF16)
        nan_k = _nan_count(k)
        out = _poisoned(q.shape)
        _, lse = fa.flash_attn_varlen_func(
            cp.asarray(q), k, v, cp.asarray(cu_q), cp.asarray(cu_k), max(lens_q), max(lens_k),
            causal=True, block_table=cp.asarray(seqs.table), return_softmax_lse=True, out=out,
            check=True,
        )
        assert _nan_count(k) == nan_k
        out_h, lse_h = out.get(), lse.get()
        for b in range(len(lens_k)):
            s, e = int(cu_q[b]), int(cu_q[b + 1])
            _check_attention(out_h[s:e], lse_h[:, s:e], q[s:e], seqs.keys[b], seqs.values[b],
                             f"paged prefill seq {b}", causal=True)
        seqs.reset()


def test_large_offsets_paged_kv_cache_object():
    """A PagedKVCache of 140000 pages: sequence a gets pages 0-2, a filler sequence the pages up
    to 131071, then a grows onto pages 131072+ and b lives there entirely.  Decode with append +
    rotary through the cache (its own append, split-KV by the heuristic over the 2.24M-position
    capacity), then paged prefill through the cache."""
    _require_gib(2 * NUM_PAGES * PAGE * 2 / GIB + 2.0, "a 140000-page PagedKVCache")
    rng = np.random.default_rng(34)
    H, chunk = 32, 16384 * P
    cache = fa.PagedKVCache(NUM_PAGES, P, HK, D, BF16, xp=cp)
    try:
        _fill_nan(cache.k_pages)
        _fill_nan(cache.v_pages)
        a = cache.add_sequence()
        ka = [randn(rng, (40, HK, D), BF16)]
        va = [randn(rng, (40, HK, D), BF16)]
        cache.append(a, cp.asarray(ka[0][None]), cp.asarray(va[0][None]))
        filler = cache.add_sequence()  # NaN tokens: pages 3 .. 131071, never read
        nan_tokens = cp.full((1, chunk, HK, D), np.nan, dtype=BF16)
        need, done = (HIGH - 3) * P, 0
        while done < need:
            n = min(chunk, need - done)
            cache.append(filler, nan_tokens[:, :n], nan_tokens[:, :n])
            done += n
        del nan_tokens
        ka.append(randn(rng, (500, HK, D), BF16))
        va.append(randn(rng, (500, HK, D), BF16))
        cache.append(a, cp.asarray(ka[1][None]), cp.asarray(va[1][None]))
        b = cache.add_sequence()
        kb, vb = [randn(rng, (300, HK, D), BF16)], [randn(rng, (300, HK, D), BF16)]
        cache.append(b, cp.asarray(kb[0][None]), cp.asarray(vb[0][None]))
        table = cache.block_table([a, b]).get()
        assert list(table[0, :4]) == [0, 1, 2, HIGH]  # a: low pages, then past element 2**31
        assert table[1, 0] > HIGH and table[1, : -(-300 // P)].min() > HIGH
        lens = cache.seqlens([a, b]).get()
        assert list(lens) == [540, 300]
        nan_k, nan_v = _nan_count(cache.k_pages), _nan_count(cache.v_pages)
        assert nan_k == nan_v == cache.k_pages.size - 840 * ROW

        # Decode step with append + rotary (interleaved) through the cache.
        q = randn(rng, (2, 1, H, D), BF16)
        k_new, v_new = randn(rng, (2, 1, HK, D), BF16), randn(rng, (2, 1, HK, D), BF16)
        cos, sin = _rotary_tables(2048, D // 2)
        out = _poisoned(q.shape)
        _, lse = fa.flash_attn_with_kvcache(
            cp.asarray(q), cache, None, cp.asarray(k_new), cp.asarray(v_new), rotary_cos=cos,
            rotary_sin=sin, seq_ids=[a, b], causal=True, rotary_interleaved=True,
            return_softmax_lse=True, out=out, check=True,
        )
        assert list(cache.seqlens([a, b]).get()) == [541, 301]
        assert _nan_count(cache.k_pages) == nan_k - 2 * ROW
        assert _nan_count(cache.v_pages) == nan_v - 2 * ROW
        table = cache.block_table([a, b]).get()
        out_h, lse_h = out.get(), lse.get()
        cos_h, sin_h = cos.get(), sin.get()
        full_k, full_v = [], []
        for j, (kk, vv) in enumerate(((ka, va), (kb, vb))):
            L = int(lens[j])
            rows = slice(L, L + 1)
            k_rot = _rotated(k_new[j], cos_h[rows], sin_h[rows], True)
            q_rot = _rotated(q[j], cos_h[rows], sin_h[rows], True)
            keys = np.concatenate(kk + [k_rot])
            values = np.concatenate(vv + [v_new[j]])
            pos = np.arange(L + 1)
            pages = table[j, pos // P]
            got_k = np.stack([cache.k_pages[int(p), int(r)].get() for p, r in zip(pages, pos % P)])
            got_v = np.stack([cache.v_pages[int(p), int(r)].get() for p, r in zip(pages, pos % P)])
            _assert_bits_equal(got_k, keys, f"cache seq {j}: keys")
            _assert_bits_equal(got_v, values, f"cache seq {j}: values")
            _check_attention(out_h[j], lse_h[j], q_rot, keys, values, f"cache decode seq {j}",
                             causal=True)
            full_k.append(keys)
            full_v.append(values)

        # Paged prefill (mixed: 96 queries -> prefill kernel, 1 -> decode kernel) via the cache.
        H2, lens_q = 16, [96, 1]
        cu_q = np.array([0, 96, 97], dtype=np.int32)
        q2 = randn(rng, (97, H2, D), BF16)
        out2 = _poisoned(q2.shape)
        _, lse2 = fa.flash_attn_varlen_func(
            cp.asarray(q2), cache, None, cp.asarray(cu_q), None, max(lens_q), None,
            seq_ids=[a, b], causal=True, return_softmax_lse=True, out=out2, check=True,
        )
        assert _nan_count(cache.k_pages) == nan_k - 2 * ROW
        out2_h, lse2_h = out2.get(), lse2.get()
        for j in range(2):
            s, e = int(cu_q[j]), int(cu_q[j + 1])
            _check_attention(out2_h[s:e], lse2_h[:, s:e], q2[s:e], full_k[j], full_v[j],
                             f"cache prefill seq {j}", causal=True)
    finally:
        del cache
        _release()


# -- (b) dense k/v of more than 2**32 elements ------------------------------------------------


class DenseRows:
    """Random rows written into [r0, r1) of the flat (ROWS, Hk, D) view of the NaN buffers; host
    copies kept; :meth:`reset` makes every written row NaN again."""

    def __init__(self, dense, rng):
        self.k2 = dense["k"].reshape(ROWS, HK, D)
        self.v2 = dense["v"].reshape(ROWS, HK, D)
        self.rng = rng
        self.regions = []

    def write(self, r0, r1):
        kh, vh = randn(self.rng, (r1 - r0, HK, D), BF16), randn(self.rng, (r1 - r0, HK, D), BF16)
        self.k2[r0:r1] = cp.asarray(kh)
        self.v2[r0:r1] = cp.asarray(vh)
        self.regions.append((r0, r1))
        return kh, vh

    def read(self, r0, r1):
        return self.k2[r0:r1].get(), self.v2[r0:r1].get()

    def mark(self, r0, r1):
        """Rows a call writes (reset to NaN with the rest)."""
        self.regions.append((r0, r1))

    def reset(self):
        for r0, r1 in self.regions:
            self.k2[r0:r1].view(cp.uint16).fill(NAN16)
            self.v2[r0:r1].view(cp.uint16).fill(NAN16)
        self.regions.clear()


def _straddles(r0, r1, edge_row):
    return r0 < edge_row < r1


@pytest.fixture(scope="class")
def dense():
    """NaN-filled k, v (4, 2**20 + 200, 8, 128), freed when the class's tests are done."""
    elems = ROWS * ROW
    assert elems > TWO32
    _require_gib(2 * elems * 2 / GIB + 1.5, "dense k/v of 2**32 elements")
    state = _nan_kv((B_DENSE, SK, HK, D))
    yield state
    state.clear()
    _release()


class TestDenseLargeOffsets:
    """k, v (4, 2**20 + 200, 8, 128) bf16: 2**32 + 819200 elements each, NaN outside the rows
    each test writes."""

    @pytest.mark.parametrize("Sq, H", [(48, 16), (1, 32)], ids=["prefill", "decode"])
    def test_large_offsets_dense_windows(self, dense, Sq, H):
        """flash_attn_func with a causal window of W keys at the end of every batch row: batch
        1's window straddles element 2**31, batch 3's element 2**32.  Sq = 48 runs the prefill
        kernel, Sq = 1 the decode kernel (split-KV by the heuristic over ~1M keys)."""
        rng = np.random.default_rng(40 + Sq)
        W = 1000
        rows = DenseRows(dense, rng)
        try:
            keys, values = [], []
            for b in range(B_DENSE):
                r1 = (b + 1) * SK
                kh, vh = rows.write(r1 - W - MARGIN, r1)
                keys.append(kh[-W:])
                values.append(vh[-W:])
            assert _straddles(2 * SK - W, 2 * SK, EDGE31)
            assert _straddles(4 * SK - W, 4 * SK, EDGE32)
            k, v = dense["k"], dense["v"]
            nan_k = _nan_count(k)
            q = randn(rng, (B_DENSE, Sq, H, D), BF16)
            out = _poisoned(q.shape)
            window = (W - Sq, 0)
            _, lse = fa.flash_attn_func(cp.asarray(q), k, v, causal=True, window_size=window,
                                        return_softmax_lse=True, out=out)
            assert _nan_count(k) == nan_k
            out_h, lse_h = out.get(), lse.get()
            for b in range(B_DENSE):
                _check_attention(out_h[b], lse_h[b], q[b], keys[b], values[b],
                                 f"dense Sq={Sq} batch {b}", causal=True, window_size=window)
        finally:
            rows.reset()

    def test_large_offsets_dense_kvcache_append_rotary_splits(self, dense):
        """The dense buffers as a contiguous cache (4, 2**20 + 200, 8, 128): rotary + append of 2
        tokens per row (batch 2 at the very end of its row, batch 3 at element 2**32 exactly,
        batch 1 just past 2**31), causal window of 998, num_splits = 3 (combine)."""
        rng = np.random.default_rng(50)
        H, S_new, Wl = 32, 2, 998
        lens = np.array([3000, EDGE31 - SK + 300, SK - S_new, EDGE32 - 3 * SK], dtype=np.int32)
        assert (SK + int(lens[1])) > EDGE31 and (3 * SK + int(lens[3])) * ROW == TWO32
        rows = DenseRows(dense, rng)
        try:
            old = []
            for b in range(B_DENSE):
                base, L = b * SK, int(lens[b])
                old.append(rows.write(base + L - Wl - MARGIN, base + L))
                rows.mark(base + L, base + L + S_new)
            assert _straddles(SK + int(lens[1]) - Wl, SK + int(lens[1]) + S_new, EDGE31)
            assert _straddles(3 * SK + int(lens[3]) - Wl, 3 * SK + int(lens[3]) + S_new, EDGE32)
            k, v = dense["k"], dense["v"]
            nan_k, nan_v = _nan_count(k), _nan_count(v)
            q = randn(rng, (B_DENSE, S_new, H, D), BF16)
            new_shape = (B_DENSE, S_new, HK, D)
            k_new, v_new = randn(rng, new_shape, BF16), randn(rng, new_shape, BF16)
            cos, sin = _rotary_tables(SK, D // 4)
            out = _poisoned(q.shape)
            window = (Wl, 0)
            _, lse = fa.flash_attn_with_kvcache(
                cp.asarray(q), k, v, cp.asarray(k_new), cp.asarray(v_new), rotary_cos=cos,
                rotary_sin=sin, cache_seqlens=cp.asarray(lens), causal=True, window_size=window,
                rotary_interleaved=True, num_splits=3, return_softmax_lse=True, out=out,
                check=True,
            )
            assert _nan_count(k) == nan_k - B_DENSE * S_new * ROW
            assert _nan_count(v) == nan_v - B_DENSE * S_new * ROW
            out_h, lse_h = out.get(), lse.get()
            for b in range(B_DENSE):
                base, L = b * SK, int(lens[b])
                cs = slice(L, L + S_new)
                cos_h, sin_h = cos[cs].get(), sin[cs].get()
                k_rot = _rotated(k_new[b], cos_h, sin_h, True)
                q_rot = _rotated(q[b], cos_h, sin_h, True)
                got_k, got_v = rows.read(base + L - Wl - MARGIN, base + L + S_new)
                _assert_bits_equal(got_k[:-S_new], old[b][0], f"batch {b}: cached keys")
                _assert_bits_equal(got_v[:-S_new], old[b][1], f"batch {b}: cached values")
                _assert_bits_equal(got_k[-S_new:], k_rot, f"batch {b}: appended keys")
                _assert_bits_equal(got_v[-S_new:], v_new[b], f"batch {b}: appended values")
                _check_attention(out_h[b], lse_h[b], q_rot, got_k[-(Wl + S_new):],
                                 got_v[-(Wl + S_new):], f"kvcache batch {b}", causal=True,
                                 window_size=window)
            del cos, sin
        finally:
            rows.reset()

    def test_large_offsets_varlen_cu_seqlens_past_2to31(self, dense):
        """Varlen over the flat (4 * SK, 8, 128) view: sequences straddling token row 2**21
        (element 2**31) and row 2**22 (element 2**32), the last one ending at the buffer's last
        row; padding sequences with no queries in between.  Causal + softcap; mixed batch (the
        1- and 8-query sequences go to the decode kernel)."""
        rng = np.random.default_rng(60)
        H = 16
        R1, R3 = EDGE31 - 300, EDGE32 - 500
        cu_k = np.array([0, R1, R1 + 700, R1 + 1000, R3, R3 + 900, ROWS], dtype=np.int32)
        lens_q = [0, 40, 1, 0, 64, 8]
        assert ROWS - (R3 + 900) == 400 and _straddles(R1, R1 + 700, EDGE31)
        assert _straddles(R3, R3 + 900, EDGE32)
        rows = DenseRows(dense, rng)
        try:
            data = {}
            for b in (1, 2, 4, 5):  # the padding sequences 0 and 3 stay NaN (no queries)
                data[b] = rows.write(int(cu_k[b]), int(cu_k[b + 1]))
            cu_q = cu_seqlens(lens_q)
            q = randn(rng, (int(cu_q[-1]), H, D), BF16)
            k2, v2 = rows.k2, rows.v2
            nan_k = _nan_count(dense["k"])
            out = _poisoned(q.shape)
            _, lse = fa.flash_attn_varlen_func(
                cp.asarray(q), k2, v2, cp.asarray(cu_q), cp.asarray(cu_k), max(lens_q),
                int(np.diff(cu_k).max()), causal=True, softcap=30.0, return_softmax_lse=True,
                out=out, check=True,
            )
            assert _nan_count(dense["k"]) == nan_k
            out_h, lse_h = out.get(), lse.get()
            for b, (kh, vh) in data.items():
                s, e = int(cu_q[b]), int(cu_q[b + 1])
                _check_attention(out_h[s:e], lse_h[:, s:e], q[s:e], kh, vh, f"varlen seq {b}",
                                 causal=True, softcap=30.0)
        finally:
            rows.reset()
