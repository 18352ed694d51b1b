"""NaN and inf inputs (issue 10, defect 2): a row whose scores are NaN gives NaN, never the
"this row saw no key" marker (out 0, LSE +inf), and merge_attention_states keeps it NaN.

Semantics, on every backend (flash-attn's, and a plain softmax's):
- a NaN in q, a NaN in k, a NaN ALiBi slope, or an inf in k that makes ``q.k = +inf``
  (``exp(inf - inf)``) makes every row whose visible scores include it NaN: all of its output
  columns and its LSE;
- an inf in k that makes ``q.k = -inf`` weighs that key 0, like a masked key;
- a NaN in v (key j, column d) makes column d of the rows that give key j a nonzero weight NaN;
  their other columns and their LSE stay finite and correct;
- keys a row does not see (causal / local mask) never make it NaN through q.k; and a row that sees
  no key gives exactly 0 and LSE +inf whatever the inputs hold.

The expected NaN positions are derived here from the inputs and the mask geometry alone, and
checked both against the float64 reference (the oracle must agree) and against the backend;
every other element must be finite and within flash-attn's bound of the reference.  The
builders and the check are shared with ``tests/gpu/test_gpu_nan.py``.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from cupy_flashattn.merge import merge_attention_states
from cupy_flashattn.problem import AttentionProblem, resolve_sequence
from cupy_flashattn.reference import attention_ref, problem_ref
from helpers import cu_seqlens, BF16, EPS, randn, scatter_into_pages, to_np

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [F16, BF16, F32, F64]

# Values the backends must overwrite (an unwritten element then fails the bound, not the NaN test).
OUT_SENTINEL, LSE_SENTINEL = 1234.0, -4321.0


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


# --------------------------------------------------------------------------------------------
# Problems (NumPy) in the three layouts
# --------------------------------------------------------------------------------------------


_cu = cu_seqlens  # (tests/helpers.py)


def build(seed, *, layout, dtype, lens_q, lens_k, H=4, Hk=2, D=64, causal=False,
          window=(-1, -1), alibi=False, softcap=0.0, page=16, num_splits=0):
    """A NumPy AttentionProblem.  layout: "dense" (all lengths equal, no cu_seqlens), "varlen"
    (cu_seqlens_q / cu_seqlens_k) or "paged" (pages scattered by a permutation, seqused_k).
    ALiBi slopes are (B, H) in [0.01, 0.3]."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    B = len(lens_q)
    q = randn(rng, (sum(lens_q), H, D), dtype)
    fields = {}
    if layout == "dense":
        assert len(set(lens_q)) == 1 and len(set(lens_k)) == 1
        k = randn(rng, (B * lens_k[0], Hk, D), dtype)
        v = randn(rng, (B * lens_k[0], Hk, D), dtype)
        fields.update(seqlen_q=lens_q[0], seqlen_k=lens_k[0])
    elif layout == "varlen":
        k = randn(rng, (sum(lens_k), Hk, D), dtype)
        v = randn(rng, (sum(lens_k), Hk, D), dtype)
        fields.update(seqlen_q=0, seqlen_k=0, cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k))
    elif layout == "paged":
        keys = [randn(rng, (n, Hk, D), dtype) for n in lens_k]
        values = [randn(rng, (n, Hk, D), dtype) for n in lens_k]
        k, v, table = scatter_into_pages(rng, keys, values, page, dtype)
        fields.update(seqlen_q=0, seqlen_k=table.shape[1] * page, cu_seqlens_q=_cu(lens_q),
                      seqused_k=np.array(lens_k, np.int32), block_table=table,
                      page_block_size=page)
    else:
        raise ValueError(layout)
    left, right = window
    if causal:
        right = 0
    slopes = rng.uniform(0.01, 0.3, (B, H)).astype(np.float32) if alibi else None
    return AttentionProblem(
        q=q, k=k, v=v, out=np.full(q.shape, OUT_SENTINEL, dtype),
        softmax_lse=np.full((H, q.shape[0]), LSE_SENTINEL, np.float32), batch_size=B,
        max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), softmax_scale=1.0 / np.sqrt(D),
        window_left=left, window_right=right, softcap=softcap, alibi_slopes=slopes,
        num_splits=num_splits, **fields,
    )  # fmt: skip


def fresh_outputs(problem):
    """The problem with new sentinel-filled out / softmax_lse (NumPy)."""
    return dataclasses.replace(
        problem,
        out=np.full(problem.q.shape, OUT_SENTINEL, problem.q.dtype),
        softmax_lse=np.full((problem.num_heads, problem.total_q), LSE_SENTINEL, np.float32),
    )


# --------------------------------------------------------------------------------------------
# Geometry: who sees what
# --------------------------------------------------------------------------------------------


def vis_matrix(p, b) -> np.ndarray:
    """(len_q, len_k) bool: query i of sequence b sees key position j (bottom-right aligned)."""
    _, len_q, _, len_k = resolve_sequence(p, b)
    i = np.arange(len_q)[:, None]
    j = np.arange(len_k)[None, :]
    diag = i + len_k - len_q
    m = np.ones((len_q, len_k), bool)
    if p.window_left >= 0:
        m &= j >= diag - p.window_left
    if p.window_right >= 0:
        m &= j <= diag + p.window_right
    return m


def key_index(p, b, j):
    """Index of key position j of sequence b into p.k / p.v (without the head and dim)."""
    _, _, k_start, _ = resolve_sequence(p, b)
    if p.paged:
        P = p.page_block_size
        return (int(p.block_table[b, j // P]), j % P)
    return (k_start + j,)


class Expect:
    """Expected NaN positions: out (total_q, H, D) and lse (H, total_q)."""

    def __init__(self, p):
        self.out = np.zeros(p.q.shape, bool)
        self.lse = np.zeros((p.num_heads, p.total_q), bool)

    def nan_rows(self, rows, h):
        self.out[rows, h, :] = True
        self.lse[h, rows] = True


def _group(p, hk):
    g = p.num_heads // p.num_heads_k
    return slice(hk * g, (hk + 1) * g)


def poison_q(p, b, i, h, d, value=np.nan) -> Expect:
    """q of query i (sequence b), head h, dim d := NaN: only that (row, head) becomes NaN -- if
    it sees any key at all (a fully masked row stays 0 / +inf)."""
    q_start = resolve_sequence(p, b)[0]
    p.q[q_start + i, h, d] = value
    e = Expect(p)
    if vis_matrix(p, b)[i].any():
        e.nan_rows(q_start + i, h)
    return e


def poison_k(p, b, j, hk, d, value=np.nan) -> Expect:
    """k of key j (sequence b), kv head hk, dim d := value (NaN, +inf or -inf).  Every query head
    reading kv head hk, in every row that sees key j, gets score NaN (NaN), or +-inf by the sign
    of q[.., d] * value: +inf -> NaN row, -inf -> weight 0.  With softcap, tanh(+-inf) = +-1."""
    p.k[key_index(p, b, j) + (hk, d)] = value
    q_start, len_q, _, _ = resolve_sequence(p, b)
    sees = vis_matrix(p, b)[:, j]
    e = Expect(p)
    for h in range(p.num_heads)[_group(p, hk)]:
        qd = p.q[q_start:q_start + len_q, h, d].astype(np.float64)
        assert (qd != 0).all() and np.isfinite(qd).all()
        if np.isnan(value):
            hit = sees
        elif p.softcap == 0:
            hit = sees & (qd * value > 0)
        else:
            hit = np.zeros_like(sees)
        e.nan_rows(q_start + np.flatnonzero(hit), h)
    return e


def poison_v(p, b, j, hk, d, value=np.nan) -> Expect:
    """v of key j, kv head hk, dim d := NaN: column d of every (row, head) that sees key j
    (random logits: the weight is never 0) becomes NaN; the LSE does not depend on v."""
    p.v[key_index(p, b, j) + (hk, d)] = value
    q_start = resolve_sequence(p, b)[0]
    e = Expect(p)
    rows = q_start + np.flatnonzero(vis_matrix(p, b)[:, j])
    e.out[rows, _group(p, hk), d] = True
    return e


def masked_v_rows(p, b, j, hk, d, slack=None):
    """Elements a NaN v at (b, j, hk, d) may reach on the GPU although their row does not see
    key j: P V multiplies the V rows of every key in a loaded tile, masked ones by P = 0, and
    0 * NaN = NaN (as in flash-attn).  slack=None: every such element of sequence b (decode: all
    rows of a CTA share its key tiles); slack=n: only rows whose visible key range comes within
    n keys of j (prefill with a mask: kBlockM + kBlockN <= 256 -- a CTA never loads a tile
    farther away; the sm90 kernel's wider 176-key tiles serve only problems without a window,
    where every row sees every key).
    An empty row is never among them: it gives exactly 0 whatever its O accumulated."""
    q_start = resolve_sequence(p, b)[0]
    vis = vis_matrix(p, b)
    near = vis.any(axis=1) & ~vis[:, j]
    if slack is not None:
        near &= vis[:, max(0, j - slack):j + slack + 1].any(axis=1)
    m = np.zeros(p.q.shape, bool)
    m[q_start + np.flatnonzero(near), _group(p, hk), d] = True
    return m


def poison_slope(p, b, h, value=np.nan) -> Expect:
    """ALiBi slope of (sequence b, head h) := NaN: every row of (b, h) that sees a key is NaN."""
    p.alibi_slopes[b, h] = value
    q_start = resolve_sequence(p, b)[0]
    e = Expect(p)
    e.nan_rows(q_start + np.flatnonzero(vis_matrix(p, b).any(axis=1)), h)
    return e


# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------


def check(problem_np, out, lse, expect: Expect, dont_care=None, lse_rtol=1e-4, lse_atol=1e-4):
    """out (total_q, H, D) / lse (H, total_q) from a backend, against the expectation and the
    float64 reference of ``problem_np`` (NumPy arrays, already poisoned).

    - the reference's NaN positions are exactly the expected ones (the oracle agrees);
    - the backend's NaN positions are exactly the expected ones, except ``dont_care`` elements
      (NaN or correct);
    - every other element is within flash-attn's bound of the reference; rows that see no key
      are exactly 0 with LSE +inf; the other LSEs are finite and close."""
    out = to_np(out).astype(np.float64)
    lse = to_np(lse).astype(np.float64)
    dtype = np.dtype(problem_np.q.dtype)
    ref, ref_lse = problem_ref(problem_np)
    naive, _ = problem_ref(problem_np, upcast=False)
    naive = naive.astype(np.float64)

    np.testing.assert_array_equal(np.isnan(ref), expect.out, err_msg="reference NaN positions")
    np.testing.assert_array_equal(np.isnan(ref_lse), expect.lse, err_msg="reference LSE NaN")

    care = np.ones(out.shape, bool) if dont_care is None else ~dont_care
    got = np.isnan(out)
    wrong = np.argwhere(got[care] != expect.out[care])
    assert wrong.size == 0, (
        f"out NaN positions differ at {np.argwhere(care & (got != expect.out))[:8].tolist()} "
        f"(expected {int(expect.out.sum())} NaN, got {int(got[care].sum())} among checked)"
    )
    np.testing.assert_array_equal(np.isnan(lse), expect.lse, err_msg="LSE NaN positions")

    cmp = ~expect.out & ~got  # dont_care elements that are not NaN must be correct too
    err = np.abs(out - ref)[cmp].max(initial=0.0)
    naive_err = np.nanmax(np.abs(naive - ref)[cmp], initial=0.0)
    bound = 2 * naive_err + EPS[dtype]
    assert err <= bound, f"max error {err:.3g} > bound {bound:.3g} (naive {naive_err:.3g})"

    empty = np.isposinf(ref_lse)  # (H, total_q): rows that see no key
    np.testing.assert_array_equal(np.isposinf(lse), empty, err_msg="+inf LSE positions")
    assert not np.isneginf(lse).any()
    np.testing.assert_array_equal(out.transpose(1, 0, 2)[empty], 0.0, err_msg="empty rows not 0")
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=lse_rtol, atol=lse_atol)
    return ref, ref_lse


def run_cpu(problem):
    from cupy_flashattn._backend_cpu import run_attention

    p = fresh_outputs(problem)
    run_attention(p)
    return p.out, p.softmax_lse


# Sizes: the CPU kernel's 64-key blocks and 16-row tiles are crossed; sequence 1 is poisoned.
SHAPES = {
    "dense": dict(lens_q=[70, 70], lens_k=[70, 70]),
    "varlen": dict(lens_q=[37, 70, 5], lens_k=[50, 70, 130]),
    "paged": dict(lens_q=[37, 70, 5], lens_k=[50, 70, 130]),
}
MASKS = {"full": dict(), "causal": dict(causal=True), "local": dict(window=(11, 5))}
B, I, J, H, HK, D = 1, 50, 40, 3, 1, 5  # poisoned sequence, query row, key, head, kv head, dim


def _case(layout, dtype, mask, **kw):
    return build(seed_of(layout, str(dtype), mask, tuple(kw.items())), layout=layout, dtype=dtype,
                 **SHAPES[layout], **MASKS[mask], **kw)


# --------------------------------------------------------------------------------------------
# CPU backend (and the reference) on poisoned inputs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(SHAPES))
def test_nan_in_q_poisons_only_its_row_and_head(layout, dtype, mask):
    p = _case(layout, dtype, mask)
    e = poison_q(p, B, I, H, D)
    assert e.out.sum() == p.head_dim and e.lse.sum() == 1
    check(p, *run_cpu(p), e)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(SHAPES))
def test_nan_in_k_poisons_the_rows_that_see_it(layout, dtype, mask):
    """Both query heads of kv head 1, in exactly the rows that see key J; under the causal and
    local masks the other rows (and kv head 0, and the other sequences) stay finite."""
    p = _case(layout, dtype, mask)
    e = poison_k(p, B, J, HK, D)
    rows = e.lse.any(axis=0)
    assert e.lse[2:].all(axis=0)[rows].all() and not e.lse[:2].any()  # heads 2, 3 = kv head 1
    if mask != "full":
        q_start = resolve_sequence(p, B)[0]
        assert rows.sum() < 70 and not rows[q_start + 10]  # some rows of sequence 1 do not see J
    check(p, *run_cpu(p), e)


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(SHAPES))
def test_nan_in_v_poisons_one_column_of_the_rows_that_see_it(layout, dtype, mask):
    """Column D of the rows that see key J (both heads of kv head 1); their other columns and
    every LSE stay finite and correct; on the CPU, rows that do not see J are untouched."""
    p = _case(layout, dtype, mask)
    e = poison_v(p, B, J, HK, D)
    assert e.out.any() and not e.lse.any()
    check(p, *run_cpu(p), e)


@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_inf_in_k(layout, mask, sign, softcap):
    """k[J, HK, D] = +-inf: q.k = +inf (q[.., D] of the same sign) -> NaN row (exp(inf - inf));
    q.k = -inf -> key J weighs 0, the row is attention over the other keys.  With softcap the
    score is +-softcap: finite rows."""
    p = _case(layout, F32, mask, softcap=softcap)
    e = poison_k(p, B, J, HK, D, sign * np.inf)
    seen = 2 * vis_matrix(p, B)[:, J].sum()  # (row, head) pairs that see J
    if softcap == 0:
        assert 0 < e.lse.sum() < seen  # both kinds of rows occur
    else:
        assert not e.lse.any()
    check(p, *run_cpu(p), e)


@pytest.mark.parametrize("layout", list(SHAPES))
def test_nan_alibi_slope(layout):
    """A NaN slope of (sequence 1, head 3): its rows that see a key are NaN; with causal and
    len_q > len_k, the first rows see no key and still give 0 / +inf."""
    shapes = dict(lens_q=[40, 40], lens_k=[30, 30]) if layout == "dense" else \
        dict(lens_q=[37, 70, 5], lens_k=[50, 60, 130])
    p = build(seed_of("slope", layout), layout=layout, dtype=BF16, causal=True, alibi=True,
              **shapes)
    e = poison_slope(p, B, H)
    q_start, len_q, _, len_k = resolve_sequence(p, B)
    assert not e.lse[H, q_start:q_start + len_q - len_k].any()  # the fully masked rows
    assert e.lse[H, q_start + len_q - len_k:q_start + len_q].all()
    check(p, *run_cpu(p), e)


@pytest.mark.parametrize("what", ["q", "k", "v"])
def test_fully_masked_rows_stay_zero_with_plus_inf_lse(what):
    """Causal, len_q > len_k: rows 0 .. len_q - len_k - 1 see no key.  A NaN in their own q, or in
    k / v of a key in the same key tile, leaves them exactly 0 with LSE +inf."""
    p = build(seed_of("masked", what), layout="varlen", dtype=F16, causal=True,
              lens_q=[20, 30], lens_k=[20, 12])
    if what == "q":
        e = poison_q(p, 1, 3, 1, 0)  # row 3 of sequence 1 sees no key
        assert not e.out.any()
    elif what == "k":
        e = poison_k(p, 1, 11, 0, 0)  # the last key: seen by the last row only
    else:
        e = poison_v(p, 1, 11, 0, 0)
    _, ref_lse = check(p, *run_cpu(p), e)
    assert np.isposinf(ref_lse[:, 20:38]).all()


def test_vis_matrix_geometry():
    """The geometry the expectations rest on: bottom-right causal, and a local window."""
    p = build(0, layout="varlen", dtype=F16, causal=True, lens_q=[3], lens_k=[5])
    np.testing.assert_array_equal(vis_matrix(p, 0), np.tril(np.ones((3, 5), bool), 2))
    p = build(0, layout="varlen", dtype=F16, window=(1, 0), lens_q=[5], lens_k=[3])
    expect = np.tril(np.ones((5, 3), bool), -2) & np.triu(np.ones((5, 3), bool), -3)
    np.testing.assert_array_equal(vis_matrix(p, 0), expect)


def test_reference_is_a_plain_softmax_on_nan():
    """The oracle itself, against the textbook formula on a tiny case: NaN logits give NaN rows,
    a +inf logit a NaN row, a -inf logit weight 0; a row that sees no key 0 / +inf."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 6, 1, 4))
    k, v = rng.standard_normal((2, 1, 4, 1, 4))
    # Causal with Sq 6 > Sk 4 (bottom-right): row i sees keys 0 .. i - 2; rows 0, 1 none.
    q[0, 5, 0, 1] = np.nan  # row 5: NaN scores
    k[0, 2, 0, 0] = np.inf * np.sign(q[0, 4, 0, 0])  # row 4: key 2 scores +inf
    out, lse = attention_ref(q, k, v, causal=True, return_lse=True)
    assert (out[0, :2] == 0).all() and np.isposinf(lse[0, 0, :2]).all()
    assert np.isnan(out[0, 4:]).all() and np.isnan(lse[0, 0, 4:]).all()
    for i in (2, 3):  # they do not see key 2
        s = (q[0, i, 0] @ k[0, : i - 1, 0].T) / 2.0  # softmax_scale 1/sqrt(4)
        w = np.exp(s - s.max())
        np.testing.assert_allclose(out[0, i, 0], (w / w.sum()) @ v[0, : i - 1, 0], rtol=1e-12)
        np.testing.assert_allclose(lse[0, 0, i], s.max() + np.log(w.sum()), rtol=1e-12)
    # A -inf score weighs 0: row 5 with q finite again and key 2 at -inf equals keys {0, 1, 3}.
    q[0, 5, 0, 1] = 1.0
    k[0, 2, 0, 0] = -np.inf * np.sign(q[0, 5, 0, 0])
    out, lse = attention_ref(q, k, v, causal=True, return_lse=True)
    keep = [0, 1, 3]
    o2, l2 = attention_ref(q[:, 5:], k[:, keep], v[:, keep], return_lse=True)
    np.testing.assert_allclose(out[0, 5], o2[0, 0], rtol=1e-12)
    np.testing.assert_allclose(lse[0, 0, 5], l2[0, 0, 0], rtol=1e-12)


# --------------------------------------------------------------------------------------------
# The public API on NumPy (CPU backend)
# --------------------------------------------------------------------------------------------


def test_api_dense_layout_nan_rows():
    """flash_attn_func on NumPy: (B, S, H, D) output, (B, H, S) LSE."""
    import cupy_flashattn as fa

    rng = np.random.default_rng(11)
    q, k, v = (randn(rng, (2, 33, 4, 32), BF16) for _ in range(3))
    k = k[:, :, :2].copy()
    v = v[:, :, :2].copy()
    q[1, 7, 2, 3] = np.nan
    k[0, 20, 1, 0] = np.nan
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_softmax_lse=True)
    out = out.astype(np.float64)
    nan_rows = np.zeros((2, 33, 4), bool)
    nan_rows[1, 7, 2] = True
    nan_rows[0, 20:, 2:] = True  # rows >= 20 of sequence 0 see key 20; heads 2, 3 read kv head 1
    np.testing.assert_array_equal(np.isnan(out).all(-1), nan_rows)
    np.testing.assert_array_equal(np.isnan(out).any(-1), nan_rows)
    np.testing.assert_array_equal(np.isnan(lse), nan_rows.transpose(0, 2, 1))
    ref, ref_lse = attention_ref(q, k, v, causal=True, return_lse=True)
    ok = ~nan_rows
    np.testing.assert_allclose(out[ok], ref[ok], atol=2e-2)
    ok = ok.transpose(0, 2, 1)
    np.testing.assert_allclose(lse[ok], ref_lse[ok], rtol=1e-4)


def test_api_kvcache_decode_nan_in_cache():
    """flash_attn_with_kvcache (one new token per sequence) on NumPy: a NaN in sequence 0's
    cached keys makes its rows NaN (every head reading that kv head); sequence 1 is finite."""
    import cupy_flashattn as fa

    rng = np.random.default_rng(12)
    Bc, S, Hk, G, Dh = 2, 40, 2, 3, 16
    k_cache = randn(rng, (Bc, S, Hk, Dh), F16)
    v_cache = randn(rng, (Bc, S, Hk, Dh), F16)
    q = randn(rng, (Bc, 1, Hk * G, Dh), F16)
    k_cache[0, 5, 0, 2] = np.nan
    seqlens = np.array([30, 25], np.int32)
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                          causal=True, return_softmax_lse=True)
    assert np.isnan(out[0, 0, :G]).all() and np.isnan(lse[0, :G, 0]).all()
    assert np.isfinite(out[0, 0, G:]).all() and np.isfinite(lse[0, G:, 0]).all()
    assert np.isfinite(out[1]).all() and np.isfinite(lse[1]).all()


# --------------------------------------------------------------------------------------------
# merge_attention_states
# --------------------------------------------------------------------------------------------

# LSE kinds of one partial: finite, NaN (its scores held a NaN), +inf / -inf (no visible key).
KINDS = {"finite": None, "nan": np.nan, "+inf": np.inf, "-inf": -np.inf}


def merge_table(rng, out_dtype, lse_dtype, D=8, nan_out_rows=()):
    """Partials for every (kind_a, kind_b) pair, one row (varlen (16, 1, D) / LSE (1, 16)) each,
    and the expected merged rows.  Empty partials hold NaN in out (it must not leak in)."""
    pairs = [(a, b) for a in KINDS for b in KINDS]
    n = len(pairs)
    oa, ob = rng.standard_normal((n, 1, D)), rng.standard_normal((n, 1, D))
    la, lb = rng.normal(size=(1, n)), rng.normal(size=(1, n))
    exp_out = np.empty((n, 1, D))
    exp_lse = np.empty((1, n))
    for r, (ka, kb) in enumerate(pairs):
        if KINDS[ka] is not None:
            la[0, r] = KINDS[ka]
        if KINDS[kb] is not None:
            lb[0, r] = KINDS[kb]
        if np.isinf(la[0, r]):
            oa[r] = np.nan
        if np.isinf(lb[0, r]):
            ob[r] = np.nan
    oa = oa.astype(out_dtype)
    ob = ob.astype(out_dtype)
    la, lb = la.astype(lse_dtype), lb.astype(lse_dtype)
    for r in range(n):
        a, b = float(la[0, r]), float(lb[0, r])
        if np.isnan(a) or np.isnan(b):
            exp_out[r], exp_lse[0, r] = np.nan, np.nan
            continue
        parts = [(x, o.astype(np.float64)) for x, o in ((a, oa[r]), (b, ob[r])) if not np.isinf(x)]
        if not parts:
            exp_out[r], exp_lse[0, r] = 0.0, np.inf
            continue
        m = max(x for x, _ in parts)
        w = [np.exp(x - m) for x, _ in parts]
        exp_lse[0, r] = m + np.log(sum(w))
        exp_out[r] = sum(wi * o for wi, (_, o) in zip(w, parts)) / sum(w)
    return (oa, la, ob, lb), exp_out, exp_lse, pairs


def check_merge(out, lse, exp_out, exp_lse, tol):
    out = to_np(out).astype(np.float64)
    lse = to_np(lse).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(exp_out))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(exp_lse))
    np.testing.assert_array_equal(np.isposinf(lse), np.isposinf(exp_lse))
    ok = ~np.isnan(exp_out)
    np.testing.assert_allclose(out[ok], exp_out[ok], rtol=tol, atol=tol)
    ok = np.isfinite(exp_lse)
    np.testing.assert_allclose(lse[ok], exp_lse[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out_dtype,lse_dtype", [(F32, F32), (F64, F64), (F16, F32), (BF16, F32)],
                         ids=str)
def test_merge_every_pair_of_lse_kinds(out_dtype, lse_dtype):
    """NaN in either LSE -> NaN (out and LSE); +inf / -inf -> the other part; both infinite ->
    0 / +inf; finite + finite -> the usual mix."""
    rng = np.random.default_rng(20)
    args, exp_out, exp_lse, pairs = merge_table(rng, out_dtype, lse_dtype)
    out, lse = merge_attention_states(*args)
    tol = {F16: 2e-3, BF16: 2e-2}.get(out_dtype, 1e-6)
    check_merge(out, lse, exp_out, exp_lse, tol)
    nan_rows = [r for r, (a, b) in enumerate(pairs) if "nan" in (a, b)]
    assert len(nan_rows) == 7 and np.isnan(to_np(out)[nan_rows]).all()


def test_merge_nan_in_out_of_a_part_with_keys():
    """A NaN in the out of a partial that saw keys reaches the result at that element, even when
    that partial's weight underflows to 0 (its LSE 1000 below the other's)."""
    rng = np.random.default_rng(21)
    oa, ob = rng.standard_normal((2, 3, 1, 4))
    la, lb = np.zeros((1, 3)), np.zeros((1, 3))
    la[0, 1] = -1000.0
    oa[0, 0, 2] = oa[1, 0, 1] = np.nan
    out, lse = merge_attention_states(oa, la, ob, lb)
    expect = np.zeros(out.shape, bool)
    expect[0, 0, 2] = expect[1, 0, 1] = True
    np.testing.assert_array_equal(np.isnan(out), expect)
    assert np.isfinite(lse).all()
    np.testing.assert_allclose(out[1, 0, [0, 2, 3]], ob[1, 0, [0, 2, 3]], rtol=1e-12)


@pytest.mark.parametrize("what", ["q", "k", "v"])
def test_merge_of_split_attention_keeps_nan(what):
    """Attention over keys A (holding the poisoned key) and over keys B, each by the CPU backend,
    merged: the same NaN positions as attention over all keys, the rest equal to it."""
    import cupy_flashattn as fa

    rng = np.random.default_rng(22)
    q, k, v = (randn(rng, (1, 24, 4, 16), F32) for _ in range(3))
    k, v = k[:, :, :2].copy(), v[:, :, :2].copy()
    if what == "q":
        q[0, 5, 1, 3] = np.nan
    elif what == "k":
        k[0, 6, 1, 3] = np.nan
    else:
        v[0, 6, 1, 3] = np.nan
    a, b = np.arange(0, 24, 2), np.arange(1, 24, 2)  # key 6 is in A
    oa, la = fa.flash_attn_func(q, k[:, a], v[:, a], return_softmax_lse=True)
    ob, lb = fa.flash_attn_func(q, k[:, b], v[:, b], return_softmax_lse=True)
    out, lse = merge_attention_states(oa, la, ob, lb)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    assert np.isnan(ref).any()
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lse[~np.isnan(lse)], ref_lse[~np.isnan(ref_lse)], rtol=1e-5)
