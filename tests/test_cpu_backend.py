"""The Numba CPU backend against the float64 reference.

Every test builds an :class:`AttentionProblem` directly (dense, varlen, paged with scattered
pages, or a KV cache with batch indices and left padding), poisons ``out`` and
``softmax_lse`` with NaN, runs :func:`run_attention` and checks, with flash-attn's criterion,

    max|out - ref| <= 2 * max|naive - ref| + eps[dtype]

where ``ref`` is ``problem_ref`` in float64 and ``naive`` is ``problem_ref(upcast=False)``
(scores, probabilities and output rounded to the input dtype).  LSE is compared to the float64 reference (rtol 1e-4) with the +inf
positions (rows that see no key) identical, and those rows' outputs must be exactly 0.

Memory that must never be read (cache rows past a sequence's length, the tail of a partial
last page, unused pages and table slots, left padding) is filled with NaN, so reading it
would show up as a NaN in the output.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cupy_flashattn._backend_cpu import resolve_sequences, run_attention
from cupy_flashattn.problem import AttentionProblem, resolve_sequence
from cupy_flashattn.reference import problem_ref

from helpers import cu_seqlens

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [F16, BF16, F32, F64]
DTYPE_IDS = ["f16", "bf16", "f32", "f64"]

# The additive slack of the error bound, about the rounding unit of each dtype's result (the
# outputs are O(1)), so a wrong mask or a missed rescale still fails.
EPS = {F64: 1e-10, F32: 1e-5, F16: 1e-3, BF16: 1e-2}

# Mask / logit variants, as AttentionProblem fields; "alibi" asks the builders for slopes.
MASKS = {
    "full": {},
    "causal": dict(window_right=0),
    "local": dict(window_left=11, window_right=5),
    "left_window": dict(window_left=20),
    "right_window": dict(window_right=7),
    "softcap": dict(softcap=2.5, scale_factor=3.0),
    "alibi": dict(alibi=True),
    "causal_softcap_alibi": dict(window_right=0, softcap=4.0, alibi=True, scale_factor=2.0),
}


# --------------------------------------------------------------------------------------------
# Problem builders
# --------------------------------------------------------------------------------------------


def _seed(*parts) -> int:
    """A seed derived from a test's parameters (stable across runs, unlike hash())."""
    return zlib.crc32(repr(parts).encode())


def _randn(rng, shape, dtype):
    """Fresh standard-normal values in ``dtype`` (never zeros, so a missed write shows)."""
    return rng.standard_normal(shape).astype(dtype)


def _prefix_ranges(rng, batch_size, max_key=45, max_ranges=2):
    """Random sorted, disjoint [start, end) key ranges per sequence (some unused: (0, 0))."""
    out = np.zeros((batch_size, max_ranges, 2), np.int32)
    for b in range(batch_size):
        cuts = np.sort(rng.choice(max_key, size=2 * max_ranges, replace=False))
        used = rng.integers(0, max_ranges + 1)
        out[b, :used] = cuts.reshape(max_ranges, 2)[:used]
    return out


def _problem(rng, q, k, v, batch_size, *, alibi=False, scale_factor=1.0, sinks=False,
             prefix=False, **fields):
    """An AttentionProblem with NaN-poisoned out / softmax_lse and the given fields (``sinks``,
    ``prefix``: random attention sinks / mm_prefix_ranges)."""
    total_q, heads, head_dim = q.shape
    if alibi:
        fields["alibi_slopes"] = rng.uniform(0.01, 1.0, (batch_size, heads)).astype(np.float32)
    if sinks:
        fields["sinks"] = rng.uniform(-2.0, 3.0, heads).astype(np.float32)
    if prefix:
        fields["mm_prefix_ranges"] = _prefix_ranges(rng, batch_size)
    fields.setdefault("softmax_scale", scale_factor / np.sqrt(head_dim))
    return AttentionProblem(
        q=q,
        k=k,
        v=v,
        out=np.full(q.shape, np.nan, dtype=q.dtype),
        softmax_lse=np.full((heads, total_q), np.nan, dtype=np.float32),
        batch_size=batch_size,
        **fields,
    )


def make_dense(seed, *, batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, **masks):
    """Dense batch: q (B*Sq, H, D), k/v (B*Sk, Hk, D), no cu_seqlens."""
    rng = np.random.default_rng(seed)
    q = _randn(rng, (batch * seqlen_q, heads, head_dim), dtype)
    k = _randn(rng, (batch * seqlen_k, heads_k, head_dim), dtype)
    v = _randn(rng, (batch * seqlen_k, heads_k, head_dim), dtype)
    return _problem(
        rng, q, k, v, batch,
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, max_seqlen_q=seqlen_q, max_seqlen_k=seqlen_k,
        **masks,
    )  # fmt: skip


_cu_seqlens = cu_seqlens  # (tests/helpers.py)


def make_varlen(seed, *, lens_q, lens_k, heads, heads_k, head_dim, dtype, **masks):
    """Packed varlen batch described by cu_seqlens_q / cu_seqlens_k."""
    rng = np.random.default_rng(seed)
    q = _randn(rng, (sum(lens_q), heads, head_dim), dtype)
    k = _randn(rng, (sum(lens_k), heads_k, head_dim), dtype)
    v = _randn(rng, (sum(lens_k), heads_k, head_dim), dtype)
    return _problem(
        rng, q, k, v, len(lens_q),
        seqlen_q=0, seqlen_k=0, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
        cu_seqlens_q=_cu_seqlens(lens_q), cu_seqlens_k=_cu_seqlens(lens_k),
        **masks,
    )  # fmt: skip


def make_paged(
    seed, *, lens_q, lens_k, page_size, heads, heads_k, head_dim, dtype,
    key_lengths="seqused_k", **masks,
):  # fmt: skip
    """Paged KV cache: each sequence's pages are scattered through the pool by a random
    permutation of page ids; the last page of a sequence is usually partial.  Spare pages, the
    table slots past a sequence's last page, and the tail rows of partial pages hold NaN.

    key_lengths: "seqused_k" (flash_attn_with_kvcache style, seqlen_k = table capacity) or
    "cu_seqlens_k" (flash_attn_varlen_func with a block table)."""
    rng = np.random.default_rng(seed)
    batch = len(lens_q)
    pages_per_seq = [-(-n // page_size) for n in lens_k]
    max_blocks = max(pages_per_seq) + 1  # one always-unused column
    num_spare = 3
    num_blocks = sum(pages_per_seq) + num_spare
    page_ids = rng.permutation(num_blocks).astype(np.int32)
    spare_ids = page_ids[sum(pages_per_seq) :]

    k = _randn(rng, (num_blocks, page_size, heads_k, head_dim), dtype)
    v = _randn(rng, (num_blocks, page_size, heads_k, head_dim), dtype)
    k[spare_ids] = np.nan
    v[spare_ids] = np.nan
    block_table = rng.choice(spare_ids, (batch, max_blocks)).astype(np.int32)
    next_page = 0
    for b, (length, count) in enumerate(zip(lens_k, pages_per_seq)):
        block_table[b, :count] = page_ids[next_page : next_page + count]
        next_page += count
        tail = length - (count - 1) * page_size  # rows used in the last page
        if count > 0 and tail < page_size:
            k[block_table[b, count - 1], tail:] = np.nan
            v[block_table[b, count - 1], tail:] = np.nan

    q = _randn(rng, (sum(lens_q), heads, head_dim), dtype)
    fields = dict(cu_seqlens_q=_cu_seqlens(lens_q), max_seqlen_q=max(lens_q))
    if key_lengths == "seqused_k":
        fields.update(seqlen_k=max_blocks * page_size, seqused_k=np.array(lens_k, np.int32))
    else:
        fields.update(seqlen_k=0, cu_seqlens_k=_cu_seqlens(lens_k))
    return _problem(
        rng, q, k, v, batch,
        seqlen_q=0, max_seqlen_k=max(lens_k), block_table=block_table,
        page_block_size=page_size, **fields, **masks,
    )  # fmt: skip


def make_kvcache(
    seed, *, seqlen_q, lens_k, leftpad, cache_rows, capacity, heads, heads_k, head_dim, dtype,
    **masks,
):  # fmt: skip
    """Contiguous KV cache (cache_rows * capacity, Hk, D) read through cache_batch_idx, with
    sequence b's keys at cache positions [leftpad[b], leftpad[b] + lens_k[b]); everything else
    in the cache (padding, positions past seqused_k, unused cache rows) holds NaN."""
    rng = np.random.default_rng(seed)
    batch = len(lens_k)
    cache_batch_idx = rng.choice(cache_rows, batch, replace=False).astype(np.int32)
    leftpad = np.asarray(leftpad, np.int32)
    seqused_k = (leftpad + np.asarray(lens_k)).astype(np.int32)
    k = np.full((cache_rows * capacity, heads_k, head_dim), np.nan, dtype=dtype)
    v = np.full((cache_rows * capacity, heads_k, head_dim), np.nan, dtype=dtype)
    for b in range(batch):
        cache_start = cache_batch_idx[b] * capacity
        rows = slice(cache_start + leftpad[b], cache_start + seqused_k[b])
        k[rows] = _randn(rng, k[rows].shape, dtype)
        v[rows] = _randn(rng, v[rows].shape, dtype)
    q = _randn(rng, (batch * seqlen_q, heads, head_dim), dtype)
    return _problem(
        rng, q, k, v, batch,
        seqlen_q=seqlen_q, seqlen_k=capacity, max_seqlen_q=seqlen_q, max_seqlen_k=capacity,
        seqused_k=seqused_k, cache_batch_idx=cache_batch_idx, leftpad_k=leftpad,
        **masks,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------


def run_and_check(problem):
    """Run the backend and compare with the reference (see the module docstring)."""
    dtype = np.dtype(problem.q.dtype)
    run_attention(problem)
    assert problem.out.dtype == dtype
    out = problem.out.astype(np.float64)
    lse = problem.softmax_lse
    assert np.isfinite(out).all(), "output has NaN/inf (poison left, or a masked key was read)"

    ref_out, ref_lse = problem_ref(problem)
    naive_out, _ = problem_ref(problem, upcast=False)
    err = np.abs(out - ref_out).max(initial=0.0)
    naive_err = np.abs(naive_out.astype(np.float64) - ref_out).max(initial=0.0)
    bound = 2 * naive_err + EPS[dtype]
    assert err <= bound, f"{dtype}: max|out-ref| {err:.3g} > 2 * {naive_err:.3g} + {EPS[dtype]:g}"

    assert lse.dtype == np.float32
    no_key = np.isposinf(ref_lse)
    np.testing.assert_array_equal(np.isposinf(lse), no_key, err_msg="+inf LSE positions differ")
    np.testing.assert_allclose(lse[~no_key], ref_lse[~no_key], rtol=1e-4, atol=1e-4)
    # Rows that see no key output exactly 0 (out is (total_q, H, D), lse (H, total_q)).
    assert (problem.out.transpose(1, 0, 2)[no_key] == 0).all()
    return problem


# --------------------------------------------------------------------------------------------
# Dense batches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(97, 150), (150, 97)], ids=["q<k", "q>k"])
def test_dense_masks_and_dtypes(seqlen_q, seqlen_k, dtype, mask):
    run_and_check(
        make_dense(
            _seed(seqlen_q, seqlen_k, str(dtype), mask), batch=2, seqlen_q=seqlen_q,
            seqlen_k=seqlen_k, heads=4, heads_k=2, head_dim=64, dtype=dtype, **MASKS[mask],
        )  # fmt: skip
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("head_dim", [40, 59, 64, 80, 128])
def test_head_dims(head_dim, dtype):
    run_and_check(
        make_dense(
            head_dim, batch=2, seqlen_q=97, seqlen_k=97, heads=2, heads_k=1,
            head_dim=head_dim, dtype=dtype, window_right=0,
        )  # fmt: skip
    )


@pytest.mark.parametrize("mask", ["full", "causal", "local"])
@pytest.mark.parametrize(
    "seqlen_q, seqlen_k", [(1, 1), (1, 97), (97, 1), (97, 97), (1, 1025), (17, 16)]
)
def test_lengths(seqlen_q, seqlen_k, mask):
    run_and_check(
        make_dense(
            seqlen_q * 7919 + seqlen_k, batch=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
            heads=3, heads_k=3, head_dim=64, dtype=F32, **MASKS[mask],
        )  # fmt: skip
    )


def test_long_sequence_1025():
    """Several key blocks and query tiles, ragged at both ends (1025 = 16 * 64 + 1)."""
    run_and_check(
        make_dense(
            1025, batch=1, seqlen_q=1025, seqlen_k=1025, heads=2, heads_k=1,
            head_dim=64, dtype=F16, window_left=300, window_right=0, alibi=True,
        )  # fmt: skip
    )


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("heads_k, ratio", [(3, 1), (2, 4), (2, 6), (1, 7)])
def test_gqa_mqa_ratios(heads_k, ratio, dtype):
    run_and_check(
        make_dense(
            ratio * 10 + heads_k, batch=2, seqlen_q=33, seqlen_k=70, heads=heads_k * ratio,
            heads_k=heads_k, head_dim=40, dtype=dtype, window_left=16, window_right=3,
            alibi=True,
        )  # fmt: skip
    )


def test_strided_q_and_out_views():
    """q and out may be strided views with unit last stride; nothing outside them is written."""
    rng = np.random.default_rng(5)
    problem = make_dense(
        5, batch=2, seqlen_q=20, seqlen_k=30, heads=4, heads_k=2, head_dim=40, dtype=F32,
        window_right=0,
    )  # fmt: skip
    q_buffer = _randn(rng, (80, 6, 48), F32)
    q_buffer[::2, 1:5, :40] = problem.q
    problem.q = q_buffer[::2, 1:5, :40]
    out_buffer = np.full((40, 4, 64), 7.0, dtype=F32)
    problem.out = out_buffer[:, :, 8:48]
    problem.out[...] = np.nan
    lse_buffer = np.full((4, 50), 7.0, dtype=np.float32)
    problem.softmax_lse = lse_buffer[:, 5:45]
    problem.softmax_lse[...] = np.nan
    run_and_check(problem)
    assert (out_buffer[:, :, :8] == 7.0).all() and (out_buffer[:, :, 48:] == 7.0).all()
    assert (lse_buffer[:, :5] == 7.0).all() and (lse_buffer[:, 45:] == 7.0).all()


# --------------------------------------------------------------------------------------------
# Varlen, paged, KV cache
# --------------------------------------------------------------------------------------------

# Zero-length queries, zero-length keys (rows output 0 / +inf), both, Sq > Sk and Sq < Sk.
VARLEN_LENS_Q = [0, 97, 1, 5, 0, 40, 3]
VARLEN_LENS_K = [3, 120, 0, 97, 0, 17, 64]


@pytest.mark.parametrize("mask", ["full", "causal", "local", "causal_softcap_alibi"])
@pytest.mark.parametrize("dtype", [BF16, F32, F64], ids=["bf16", "f32", "f64"])
def test_varlen_with_empty_sequences(dtype, mask):
    run_and_check(
        make_varlen(
            _seed(str(dtype), mask), lens_q=VARLEN_LENS_Q, lens_k=VARLEN_LENS_K, heads=6,
            heads_k=2, head_dim=59, dtype=dtype, **MASKS[mask],
        )  # fmt: skip
    )


@pytest.mark.parametrize("key_lengths", ["seqused_k", "cu_seqlens_k"])
@pytest.mark.parametrize("page_size", [1, 16, 48, 256])
@pytest.mark.parametrize(
    "dtype, mask", [(F16, "causal"), (F32, "full"), (F64, "local"), (BF16, "alibi")],
    ids=["f16-causal", "f32-full", "f64-local", "bf16-alibi"],
)  # fmt: skip
def test_paged_scattered_pages(dtype, mask, page_size, key_lengths):
    # Decode (1 query), a short prefill, an empty cache and a 97-token chunk on 300 keys.
    run_and_check(
        make_paged(
            _seed(str(dtype), mask, page_size, key_lengths), lens_q=[1, 7, 2, 97],
            lens_k=[97, 33, 0, 300], page_size=page_size, heads=4, heads_k=1, head_dim=80,
            dtype=dtype, key_lengths=key_lengths, **MASKS[mask],
        )  # fmt: skip
    )


@pytest.mark.parametrize("mask", ["full", "causal", "local"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kvcache_batch_idx_and_leftpad(dtype, mask):
    run_and_check(
        make_kvcache(
            _seed(str(dtype), mask), seqlen_q=4, lens_k=[50, 1, 0, 77], leftpad=[5, 0, 3, 51],
            cache_rows=6, capacity=128, heads=4, heads_k=2, head_dim=64, dtype=dtype, **MASKS[mask],
        )  # fmt: skip
    )


# --------------------------------------------------------------------------------------------
# Rows without keys, memory safety
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fully_masked_rows_give_zero_and_inf(dtype):
    # Causal with Sq=8 > Sk=3: query i sits at key position i - 5, so rows 0..4 see no key.
    problem = run_and_check(
        make_dense(
            3, batch=2, seqlen_q=8, seqlen_k=3, heads=2, heads_k=1, head_dim=40, dtype=dtype,
            window_right=0,
        )  # fmt: skip
    )
    for b in range(2):
        masked_rows = slice(b * 8, b * 8 + 5)
        assert (problem.out[masked_rows] == 0).all()
        assert np.isposinf(problem.softmax_lse[:, masked_rows]).all()
        assert np.isfinite(problem.softmax_lse[:, b * 8 + 5 : b * 8 + 8]).all()
    # len_k == 0 for a whole sequence.
    problem = run_and_check(
        make_varlen(
            4, lens_q=[3, 2], lens_k=[0, 4], heads=2, heads_k=2, head_dim=16, dtype=dtype
        )  # fmt: skip
    )
    assert (problem.out[:3] == 0).all() and np.isposinf(problem.softmax_lse[:, :3]).all()


def test_out_of_range_page_ids_are_never_read():
    """Page ids outside [0, num_blocks) are absent keys: sequence 0's last page id is
    num_blocks, every page id of sequence 1 is -1."""
    problem = make_paged(
        11, lens_q=[4, 3], lens_k=[40, 20], page_size=16, heads=2, heads_k=1, head_dim=32,
        dtype=F32,
    )  # fmt: skip
    num_blocks = problem.k.shape[0]
    expected = make_paged(
        11, lens_q=[4, 3], lens_k=[40, 20], page_size=16, heads=2, heads_k=1, head_dim=32,
        dtype=F32,
    )  # fmt: skip
    expected.seqused_k = np.array([32, 0], np.int32)  # keys 32..39 lived on the dropped page
    problem.block_table[0, 2] = num_blocks
    problem.block_table[1, :] = -1
    run_attention(problem)
    ref_out, ref_lse = problem_ref(expected)
    np.testing.assert_allclose(problem.out, ref_out, rtol=0, atol=1e-5)
    np.testing.assert_allclose(problem.softmax_lse, ref_lse, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Random small configurations
# --------------------------------------------------------------------------------------------


@st.composite
def small_problems(draw):
    """A small random problem of any layout, dtype, GQA ratio, mask and logit option."""
    seed = draw(st.integers(0, 2**32 - 1))
    dtype = draw(st.sampled_from(DTYPES))
    heads_k = draw(st.integers(1, 2))
    heads = heads_k * draw(st.sampled_from([1, 2, 3, 7]))
    head_dim = draw(st.sampled_from([1, 8, 16, 40, 59]))
    masks = dict(
        window_left=draw(st.integers(-1, 8)),
        window_right=draw(st.integers(-1, 8)),
        softcap=draw(st.sampled_from([0.0, 0.0, 1.5])),
        alibi=draw(st.booleans()),
        scale_factor=draw(st.sampled_from([0.5, 1.0, 2.0])),
        sinks=draw(st.booleans()),
        prefix=draw(st.booleans()),
    )
    geometry = dict(heads=heads, heads_k=heads_k, head_dim=head_dim, dtype=dtype, **masks)
    batch = draw(st.integers(1, 3))
    lengths = st.lists(st.integers(0, 40), min_size=batch, max_size=batch)
    layout = draw(st.sampled_from(["dense", "varlen", "paged", "kvcache"]))
    if layout == "dense":
        seqlen_q, seqlen_k = draw(st.integers(0, 40)), draw(st.integers(0, 40))
        return make_dense(seed, batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, **geometry)
    if layout == "varlen":
        return make_varlen(seed, lens_q=draw(lengths), lens_k=draw(lengths), **geometry)
    if layout == "paged":
        return make_paged(
            seed, lens_q=draw(lengths), lens_k=draw(lengths),
            page_size=draw(st.sampled_from([1, 2, 3, 5, 16, 64])),
            key_lengths=draw(st.sampled_from(["seqused_k", "cu_seqlens_k"])), **geometry,
        )  # fmt: skip
    capacity = draw(st.integers(1, 40))
    lens_k = draw(st.lists(st.integers(0, capacity), min_size=batch, max_size=batch))
    leftpad = [draw(st.integers(0, capacity - n)) for n in lens_k]
    return make_kvcache(
        seed, seqlen_q=draw(st.integers(0, 8)), lens_k=lens_k, leftpad=leftpad,
        cache_rows=batch + draw(st.integers(0, 2)), capacity=capacity, **geometry,
    )  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=small_problems())
def test_random_small_problems(problem):
    ranges = resolve_sequences(problem)
    for b in range(problem.batch_size):
        assert tuple(int(r[b]) for r in ranges) == resolve_sequence(problem, b)
    run_and_check(problem)


def test_one_kernel_signature_per_compute_dtype():
    """Every layout and dtype shares two compiled kernels (float32, float64): compile time
    counts in CI."""
    from cupy_flashattn._backend_cpu import _flash_fwd_kernel

    geometry = dict(heads=2, heads_k=1, head_dim=8)
    for dtype in DTYPES:
        run_attention(make_dense(0, batch=1, seqlen_q=3, seqlen_k=5, dtype=dtype, **geometry))
        run_attention(
            make_paged(0, lens_q=[2], lens_k=[9], page_size=4, dtype=dtype, alibi=True, **geometry)
        )
        run_attention(
            make_kvcache(
                0, seqlen_q=2, lens_k=[3], leftpad=[1], cache_rows=2, capacity=6, dtype=dtype,
                window_right=0, softcap=1.0, **geometry,
            )  # fmt: skip
        )
    assert len(_flash_fwd_kernel.signatures) <= 2
