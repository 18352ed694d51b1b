"""NaN / inf inputs on the CUDA kernels (issue 10, defect 2): the semantics of tests/test_nan.py
(see its docstring) for the prefill kernel (dense, varlen, paged; plain and transform
instantiations), the decode kernel with split-KV forced through ``num_splits`` (so the combine
kernel merges NaN, empty and finite partials), and merge_attention_states on CuPy arrays (the
combine kernel for float16/bfloat16/float32, the generic CuPy code for float64).

One GPU-only latitude, as in flash-attn: a NaN in v also reaches column d of rows that do not
see its key when their CTA loads that key's tile (P V multiplies it by P = 0; 0 * NaN = NaN).
Those elements may be NaN or correct (``masked_v_rows``); rows farther than kBlockM + kBlockN
keys (prefill) must be exact, and rows that see no key still give exactly 0 / +inf.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
pytest.importorskip("ml_dtypes")

from helpers import BF16  # noqa: E402
from test_nan import (  # noqa: E402
    LSE_SENTINEL, OUT_SENTINEL, build, check, check_merge, masked_v_rows, merge_table, poison_k,
    poison_q, poison_slope, poison_v, resolve_sequence, seed_of,
)

from cupy_flashattn.merge import merge_attention_states  # noqa: E402
from cupy_flashattn.reference import attention_ref  # noqa: E402

pytestmark = pytest.mark.gpu

F16 = np.dtype(np.float16)
GPU_DTYPES = [F16, BF16]
LSE_TOL = dict(lse_rtol=1e-3, lse_atol=2e-3)


@pytest.fixture(scope="module", autouse=True)
def gpu():
    from cupy_flashattn import _cuda

    if not _cuda.is_available():
        pytest.skip("no sm_80+ GPU")


def to_device(p):
    """The NumPy problem on the GPU, with sentinel-filled out / softmax_lse."""
    dev = {f.name: cupy.asarray(getattr(p, f.name)) for f in dataclasses.fields(p)
           if isinstance(getattr(p, f.name), np.ndarray)}
    dev["out"] = cupy.full(p.q.shape, OUT_SENTINEL, dtype=p.q.dtype)
    dev["softmax_lse"] = cupy.full((p.num_heads, p.total_q), LSE_SENTINEL, dtype=np.float32)
    return dataclasses.replace(p, **dev)


def run_prefill(p):
    from cupy_flashattn._cuda.launch import run_attention

    d = to_device(p)
    run_attention(d)  # the prefill kernel itself, whatever the router would pick
    return d.out, d.softmax_lse


def run_decode(p):
    from cupy_flashattn import _cuda

    d = to_device(p)
    assert _cuda.decode_applies(d)
    _cuda.run_attention(d)
    return d.out, d.softmax_lse


# ---- prefill ---------------------------------------------------------------------------------

# Several query tiles and key tiles of every bucket; sequence 1 is poisoned at key J, and under
# the causal mask its rows below J - 256 are farther from J than any CTA's key range reaches.
SHAPES = {
    "dense": dict(lens_q=[600, 600], lens_k=[600, 600]),
    "varlen": dict(lens_q=[37, 600, 5], lens_k=[50, 600, 130]),
    "paged": dict(lens_q=[37, 600, 5], lens_k=[50, 600, 130]),
}
B, I, J, H, HK = 1, 520, 500, 3, 1


def _case(layout, dtype, D, causal, page=16, **kw):
    return build(seed_of("gpu", layout, str(dtype), D, causal, page, tuple(kw.items())),
                 layout=layout, dtype=dtype, D=D, causal=causal, page=page, **SHAPES[layout], **kw)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(SHAPES))
def test_prefill_nan_in_q(layout, dtype, D, causal):
    p = _case(layout, dtype, D, causal)
    e = poison_q(p, B, I, H, D - 1)
    assert e.lse.sum() == 1
    check(p, *run_prefill(p), e, **LSE_TOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [59, 64, 128, 256])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(SHAPES))
def test_prefill_nan_in_k(layout, dtype, D, causal):
    """Both query heads of kv head 1 in the rows that see key J are NaN; causal: the rows before
    J (in the same and in other tiles) stay finite and correct."""
    p = _case(layout, dtype, D, causal)
    e = poison_k(p, B, J, HK, 3)
    if causal:
        q_start = resolve_sequence(p, B)[0]
        assert e.lse[2:, q_start + J:q_start + 600].all() and not e.lse[:, :q_start + J].any()
    check(p, *run_prefill(p), e, **LSE_TOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(SHAPES))
def test_prefill_nan_in_v(layout, dtype, D, causal):
    p = _case(layout, dtype, D, causal)
    e = poison_v(p, B, J, HK, D - 1)
    loose = masked_v_rows(p, B, J, HK, D - 1, slack=256)
    if causal:
        q_start = resolve_sequence(p, B)[0]
        assert not loose[: q_start + J - 256].any()  # rows 0 .. J - 257 are checked exactly
    check(p, *run_prefill(p), e, dont_care=loose, **LSE_TOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_prefill_nan_in_the_next_sequences_first_value(D, causal):
    """A dense batch of Sk = 600 keys (no key tile divides it): sequence 0's last key tile
    reaches past its end into sequence 1's first rows.  Those rows must load as zeros -- the
    sm90 kernel takes that tile by TMA from maps that end at each sequence's end
    (flash_fwd.cu dense_kv_bounded) -- so a NaN in sequence 1's first V row stays out of
    sequence 0 (0 * NaN would be NaN)."""
    p = _case("dense", F16, D, causal)
    e = poison_v(p, 1, 0, HK, D - 1)
    loose = masked_v_rows(p, 1, 0, HK, D - 1, slack=256)
    assert not loose[:600].any() and not e.out[:600].any()  # sequence 0: every element exact
    check(p, *run_prefill(p), e, dont_care=loose, **LSE_TOL)


@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_prefill_inf_in_k(layout, causal, sign, softcap):
    """+-inf in k: rows whose q.k is +inf are NaN, those with -inf attend to the other keys;
    softcap (the transform kernel) makes the score +-softcap: every row finite."""
    p = _case(layout, BF16, 128, causal, softcap=softcap)
    e = poison_k(p, B, J, HK, 7, sign * np.inf)
    assert e.lse.any() == (softcap == 0)
    check(p, *run_prefill(p), e, **LSE_TOL)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("layout", ["varlen", "paged"])
def test_prefill_nan_alibi_slope(layout, D):
    """Transform kernel: a NaN slope of (sequence 1, head 3) makes its rows NaN, except the rows
    that see no key (causal, len_q > len_k), which stay 0 / +inf."""
    p = build(seed_of("gpu-slope", layout, D), layout=layout, dtype=BF16, D=D, causal=True,
              alibi=True, lens_q=[37, 300, 5], lens_k=[50, 200, 130])
    e = poison_slope(p, B, H)
    q_start = resolve_sequence(p, B)[0]
    assert not e.lse[H, q_start:q_start + 100].any() and e.lse[H, q_start + 100:q_start + 300].all()
    check(p, *run_prefill(p), e, **LSE_TOL)


@pytest.mark.parametrize("what", ["q", "k", "v"])
@pytest.mark.parametrize("page", [0, 16])
def test_prefill_fully_masked_rows_stay_zero(what, page):
    """Causal, len_q > len_k: the first 180 rows of sequence 1 see no key, yet share query tiles
    (and so key tiles) with rows that do.  NaN in their own q, or in k / v of the last key, leaves
    them exactly 0 with LSE +inf."""
    layout = "paged" if page else "varlen"
    p = build(seed_of("gpu-masked", what, page), layout=layout, dtype=F16, D=64, causal=True,
              lens_q=[20, 200], lens_k=[20, 20], page=page or 16)
    if what == "q":
        e = poison_q(p, 1, 150, 1, 0)
        assert not e.lse.any()
    elif what == "k":
        e = poison_k(p, 1, 19, 0, 0)
    else:
        e = poison_v(p, 1, 19, 0, 0)
    loose = masked_v_rows(p, 1, 19, 0, 0, slack=256) if what == "v" else None
    _, ref_lse = check(p, *run_prefill(p), e, dont_care=loose, **LSE_TOL)
    assert np.isposinf(ref_lse[:, 20:200]).all()


# ---- decode (split-KV + combine) ----------------------------------------------------------------

DEC = dict(H=8, Hk=2)  # 4 query heads per kv head: packed rows of one CTA
DEC_SHAPES = {1: dict(lens_q=[1, 1, 1], lens_k=[0, 777, 300]),
              3: dict(lens_q=[3, 3, 3], lens_k=[0, 777, 300])}


def _dcase(layout, len_q, splits, D=128, dtype=BF16, **kw):
    return build(seed_of("dec", layout, len_q, splits, D, str(dtype), tuple(kw.items())),
                 layout=layout, dtype=dtype, D=D, causal=True, num_splits=splits,
                 **DEC_SHAPES[len_q], **DEC, **kw)


def _dcheck(p, e, dont_care=None):
    _, ref_lse = check(p, *run_decode(p), e, dont_care=dont_care, **LSE_TOL)
    assert np.isposinf(ref_lse[:, resolve_sequence(p, 0)[0]]).all()  # sequence 0: no key


@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("len_q", [1, 3])
@pytest.mark.parametrize("layout", ["varlen", "paged"])
def test_decode_nan_in_q(layout, len_q, splits):
    """Only the packed row of (query, head 5) is NaN; the other heads of its CTA are finite."""
    p = _dcase(layout, len_q, splits)
    e = poison_q(p, 1, len_q - 1, 5, 100)
    assert e.lse.sum() == 1
    _dcheck(p, e)


@pytest.mark.parametrize("key", [500, 776])
@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("len_q", [1, 3])
@pytest.mark.parametrize("layout", ["varlen", "paged"])
def test_decode_nan_in_k(layout, len_q, splits, key):
    """Key 500 (inside one split): every row of kv head 1 in sequence 1 is NaN, through one NaN
    partial merged with finite ones.  Key 776 (the last) with 3 queries: only the last query's
    rows see it; the first two stay finite."""
    p = _dcase(layout, len_q, splits)
    e = poison_k(p, 1, key, 1, 9)
    assert e.lse.sum() == 4 * (len_q if key == 500 else 1)
    _dcheck(p, e)


@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("layout", ["varlen", "paged"])
def test_decode_nan_in_v(layout, splits):
    p = _dcase(layout, 3, splits)
    e = poison_v(p, 1, 776, 1, 127)
    _dcheck(p, e, dont_care=masked_v_rows(p, 1, 776, 1, 127))


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_inf_in_k(splits, sign):
    p = _dcase("varlen", 1, splits, D=64)
    e = poison_k(p, 1, 300, 1, 2, sign * np.inf)
    _dcheck(p, e)


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_decode_nan_alibi_slope(splits):
    p = _dcase("paged", 3, splits, D=64, alibi=True)
    e = poison_slope(p, 2, 6)
    assert e.lse[6].sum() == 3
    _dcheck(p, e)


@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_decode_splits_every_partial_nan(dtype, D):
    """q NaN in a row: every split's partial is NaN (LSE NaN); the combine gives NaN, not the
    empty marker; splits of sequence 2 beyond its keys are empty (-inf) and weigh nothing."""
    p = _dcase("varlen", 1, 16, D=D, dtype=dtype)
    e = poison_q(p, 2, 0, 0, 0)
    e2 = poison_k(p, 1, 10, 0, D - 1)
    e.out |= e2.out
    e.lse |= e2.lse
    _dcheck(p, e)


# ---- merge_attention_states on CuPy -------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [F16, BF16, np.dtype(np.float32), np.dtype(np.float64)],
                         ids=str)
def test_merge_gpu_every_pair_of_lse_kinds(out_dtype):
    """The combine kernel (16/32-bit outs, float32 LSE) and the generic CuPy code (float64)."""
    rng = np.random.default_rng(40)
    lse_dtype = np.float64 if out_dtype == np.float64 else np.float32
    args, exp_out, exp_lse, _ = merge_table(rng, out_dtype, lse_dtype)
    out, lse = merge_attention_states(*(cupy.asarray(a) for a in args))
    assert isinstance(out, cupy.ndarray)
    tol = {F16: 2e-3, BF16: 2e-2}.get(np.dtype(out_dtype), 1e-5)
    check_merge(out, lse, exp_out, exp_lse, tol)
    # and the same as the NumPy merge, NaN for NaN
    o_np, l_np = merge_attention_states(*args)
    np.testing.assert_array_equal(np.isnan(cupy.asnumpy(out)), np.isnan(o_np))
    np.testing.assert_array_equal(np.isnan(cupy.asnumpy(lse)), np.isnan(l_np))


def test_merge_gpu_nan_in_out_of_a_part_with_keys():
    """A NaN in the out of a partial with a finite LSE reaches the result even at weight ~0."""
    rng = np.random.default_rng(41)
    oa, ob = rng.standard_normal((2, 3, 1, 4)).astype(np.float32)
    la, lb = np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32)
    la[0, 1] = -1000.0
    oa[0, 0, 2] = oa[1, 0, 1] = np.nan
    out, lse = merge_attention_states(*(cupy.asarray(a) for a in (oa, la, ob, lb)))
    expect = np.zeros(out.shape, bool)
    expect[0, 0, 2] = expect[1, 0, 1] = True
    np.testing.assert_array_equal(np.isnan(cupy.asnumpy(out)), expect)
    assert np.isfinite(cupy.asnumpy(lse)).all()


@pytest.mark.parametrize("what", ["q", "k", "v"])
def test_merge_gpu_of_split_prefill(what):
    """Prefill kernel on keys A (with the poisoned key) and on keys B, merged on the GPU: the NaN
    positions of attention over all keys, the rest close to it (non-causal: every row sees all)."""
    import cupy_flashattn as fa

    rng = np.random.default_rng(42)
    q = rng.standard_normal((1, 200, 4, 64)).astype(BF16)
    k, v = (rng.standard_normal((1, 300, 2, 64)).astype(BF16) for _ in range(2))
    if what == "q":
        q[0, 17, 1, 3] = np.nan
    elif what == "k":
        k[0, 100, 1, 3] = np.nan
    else:
        v[0, 100, 1, 3] = np.nan
    a, b = np.arange(0, 300, 2), np.arange(1, 300, 2)  # key 100 in A
    dev = cupy.asarray
    oa, la = fa.flash_attn_func(dev(q), dev(k[:, a]), dev(v[:, a]), return_softmax_lse=True)
    ob, lb = fa.flash_attn_func(dev(q), dev(k[:, b]), dev(v[:, b]), return_softmax_lse=True)
    out, lse = merge_attention_states(oa, la, ob, lb)
    out, lse = cupy.asnumpy(out).astype(np.float64), cupy.asnumpy(lse)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    assert np.isnan(ref).any()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(out[ok], ref[ok], atol=3e-2)
    ok = ~np.isnan(ref_lse)
    np.testing.assert_allclose(lse[ok], ref_lse[ok], rtol=1e-3, atol=2e-3)
