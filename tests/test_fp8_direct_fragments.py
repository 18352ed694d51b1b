"""The float8 decode kernel's direct fragments (cuda_src/sm80/flash_decode.cu: its only float8
path, device-verified on an H100 2026-12-06 -- the 44 float8 GPU tests pass -- and faster than
the float16 staging tile it replaced), checked lane by lane in NumPy -- no GPU: ldmatrix (plain
and .trans) on pairs of float8 bytes read as 16-bit elements, the per-register byte-pair
conversion (Kv::to_f16x2<h>: bytes 2h, 2h+1 -> the low / high half), the PRMT that pairs a V
register's two keys per column, and the m16n8k16 mma fragment layouts (KERNEL_NOTES.md).  The
model rebuilds the B matrices the 32 lanes hand to each mma -- asserting the lanes agree on
them -- and checks S = Q K^T (with Q's word permutation, q_words_for_fp8) and O = P V (with the
epilogue's fp8_direct_column) against plain matrix products.  What it proves is the index
bookkeeping; the device tests prove the code.
"""

from __future__ import annotations

import numpy as np
import pytest

ROWS = 16  # keys per tile (kDecodeTileN) and query rows (kDecodeRows)
Q_WORD_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # q_words_for_fp8: new word w = old word Q_WORD_ORDER[w]


def ring_offset(row_bytes: int, r: int, c: int) -> int:
    """flash_decode.cu ring_offset: byte offset of 16-byte chunk c of ring row r (rows of
    row_bytes, unpadded), the chunk index XOR r % 8 (rows of >= 128 bytes) or (r / 2) % 4
    (64-byte rows)."""
    chunks = row_bytes // 16
    x = (r & 7) if chunks >= 8 else ((r >> 1) & 3)
    return r * row_bytes + 16 * (c ^ x)


def ring_of(rows: np.ndarray) -> np.ndarray:
    """A ring tile as the cp.async copies leave it: chunk c of row r at ring_offset(r, c)."""
    n, row_bytes = rows.shape
    ring = np.full(n * row_bytes, -1, np.int64)
    for r in range(n):
        for c in range(row_bytes // 16):
            o = ring_offset(row_bytes, r, c)
            assert (ring[o: o + 16] == -1).all(), "two chunks share a place"
            ring[o: o + 16] = rows[r, 16 * c: 16 * c + 16]
    return ring


@pytest.mark.parametrize("row_bytes", [64, 128, 256, 384, 512, 768, 1024])
def test_ring_swizzle_keeps_lines_and_banks(row_bytes):
    """Every 128-byte piece of a row that starts a line fills one aligned 128-byte line of the
    ring (the copies' shared-memory side; 64-byte rows: two rows per line), and the 8 rows of
    an ldmatrix phase (r0 .. r0 + 7, r0 % 8 == 0) at one logical chunk fall in 8 different
    16-byte bank groups."""
    for r in range(16):
        for c0 in range(0, max(row_bytes // 16, 8), 8):
            if row_bytes >= 128:
                lines = {ring_offset(row_bytes, r, c) // 128 for c in range(c0, c0 + 8)}
                assert len(lines) == 1 and ring_offset(row_bytes, r, c0) // 128 * 128 % 128 == 0
    if row_bytes == 64:  # rows 2i, 2i + 1 share line i
        assert {ring_offset(64, r, c) // 128 for r in (4, 5) for c in range(4)} == {2}
    for r0 in (0, 8):
        for c in range(row_bytes // 16):
            groups = {(ring_offset(row_bytes, r0 + i, c) // 16) % 8 for i in range(8)}
            assert len(groups) == 8


def ldmatrix_x4(ring: np.ndarray, row_bytes: int, lane_addr, trans: bool) -> np.ndarray:
    """regs[lane][i] as 4 bytes, for byte offsets lane_addr(l) of the 32 row starts (16 bytes
    each; lanes 8i .. 8i + 7 give matrix i's rows 0-7).  16-bit element [r][c] of matrix i is
    bytes 2c, 2c + 1 of row r."""
    flat = ring.reshape(-1)
    regs = np.zeros((32, 4, 4), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            if not trans:  # row g, elements 2t, 2t + 1: bytes 4t .. 4t + 3
                a = lane_addr(8 * i + g)
                regs[lane, i] = flat[a + 4 * t: a + 4 * t + 4]
            else:  # elements [2t][g], [2t + 1][g]: bytes 2g, 2g + 1 of rows 2t and 2t + 1
                a0, a1 = lane_addr(8 * i + 2 * t), lane_addr(8 * i + 2 * t + 1)
                regs[lane, i] = np.concatenate([flat[a0 + 2 * g: a0 + 2 * g + 2],
                                                flat[a1 + 2 * g: a1 + 2 * g + 2]])
    return regs


def to_f16x2(word_bytes, h):
    """Kv::to_f16x2<h>: (low, high) = bytes 2h, 2h + 1 (values: the bytes themselves here)."""
    return word_bytes[2 * h], word_bytes[2 * h + 1]


def prmt_3120(word_bytes):
    """pair_keys_per_column: bytes (b0, b1, b2, b3) -> (b0, b2, b1, b3)."""
    return word_bytes[[0, 2, 1, 3]]


def b_matrix(r0_of_lane, r1_of_lane) -> np.ndarray:
    """The 16 x 8 B operand the lanes hand to an mma: R0 = B[2t, 2t+1][g], R1 = B[2t+8, 2t+9][g]
    (low, high); every element set exactly once."""
    b = np.full((16, 8), np.nan)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for (k0, pair) in ((2 * t, r0_of_lane(lane)), (2 * t + 8, r1_of_lane(lane))):
            for e in range(2):
                assert np.isnan(b[k0 + e, g]), "two lanes give the same B element"
                b[k0 + e, g] = pair[e]
    assert not np.isnan(b).any()
    return b


def fp8_direct_column(n, tq, e):
    return 16 * (n >> 1) + 4 * tq + 2 * e + (n & 1)


@pytest.mark.parametrize("D", [64, 128, 256])
def test_direct_fragments_compute_s_and_o(D):
    rng = np.random.default_rng(D)
    row_bytes = D  # DecodeSmem::kRowBytesK of float8 K/V: unpadded, swizzled (ring_offset)
    k = rng.integers(0, 256, (ROWS, D))  # a byte per element; its "value" is the byte itself
    v = rng.integers(0, 256, (ROWS, D))
    q = rng.standard_normal((ROWS, D))
    p = rng.standard_normal((ROWS, ROWS))
    ring_k, ring_v = ring_of(k), ring_of(v)

    # The lane's ldmatrix row address: key lr8 = (lane & 7) + 8 ((lane >> 3) & 1), chunk
    # 2 block + (lane >> 4), through the swizzle.
    def addr(block):
        return lambda l: ring_offset(row_bytes, (l & 7) + 8 * ((l >> 3) & 1), 2 * block + (l >> 4))

    # Q in shared memory, word-permuted per 16-element block; the A fragment is the standard one.
    q_perm = q.reshape(ROWS, D // 16, 8, 2)[:, :, Q_WORD_ORDER, :].reshape(ROWS, D)

    s = np.zeros((ROWS, ROWS))
    for kk2 in range(D // 32):
        kb = ldmatrix_x4(ring_k, row_bytes, addr(kk2), trans=False)
        for half in range(2):
            kk = 2 * kk2 + half
            a = q_perm[:, 16 * kk: 16 * kk + 16]
            for n_tile in range(2):  # keys 0-7 (kb[2 half]), 8-15 (kb[2 half + 1])
                reg = 2 * half + n_tile
                b = b_matrix(lambda l: to_f16x2(kb[l, reg], 0), lambda l: to_f16x2(kb[l, reg], 1))
                s[:, 8 * n_tile: 8 * n_tile + 8] += a @ b
    np.testing.assert_allclose(s, q @ k.T, rtol=1e-12, atol=1e-9)

    o_tiles = np.zeros((D // 8, ROWS, 8))  # o[0][n] as 16 x 8 tiles
    for dd2 in range(D // 32):
        vb = ldmatrix_x4(ring_v, row_bytes, addr(dd2), trans=True)
        for half in range(2):
            blk = 2 * dd2 + half
            lo = [prmt_3120(vb[l, 2 * half]) for l in range(32)]
            hi = [prmt_3120(vb[l, 2 * half + 1]) for l in range(32)]
            for parity in range(2):  # tile 2 blk: even columns; 2 blk + 1: odd
                b = b_matrix(lambda l: to_f16x2(lo[l], parity), lambda l: to_f16x2(hi[l], parity))
                o_tiles[2 * blk + parity] += p @ b
    out = np.full((ROWS, D), np.nan)
    for n in range(D // 8):
        for lane in range(32):
            g, tq = lane >> 2, lane & 3
            for h in range(2):
                for e in range(2):  # accumulator element 2h + e: row g + 8h, column 2tq + e
                    col = fp8_direct_column(n, tq, e)
                    assert np.isnan(out[g + 8 * h, col]), "two elements map to one column"
                    out[g + 8 * h, col] = o_tiles[n, g + 8 * h, 2 * tq + e]
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, p @ v, rtol=1e-12, atol=1e-9)


def test_the_kernel_source_has_the_modelled_constants():
    """The permutation, the PRMT selector and the column map in the model are the kernel's."""
    import pathlib

    src = (pathlib.Path(__file__).resolve().parent.parent / "cuda_src" / "sm80" / "flash_decode.cu").read_text()
    assert "v[0] = a[0]; v[1] = a[2]; v[2] = b[0]; v[3] = b[2];" in src
    assert "v[0] = a[1]; v[1] = a[3]; v[2] = b[1]; v[3] = b[3];" in src
    assert "prmt.b32 %0, %1, 0, 0x3120;" in src
    assert "return 16 * (n >> 1) + 4 * tq + 2 * e + (n & 1);" in src
    assert "lr8 = (lane & 7) + 8 * ((lane >> 3) & 1)" in src
    assert "ring_offset<Sm::kRowBytesK>(lr8, 2 * kk2 + lhi)" in src
    assert "ring_offset<Sm::kRowBytesV>(lr8, 2 * dd2 + lhi)" in src
    assert "const int x = kChunks >= 8 ? (r & 7) : ((r >> 1) & 3);" in src
    assert "return r * kRowBytes + ((c ^ x) << 4);" in src
