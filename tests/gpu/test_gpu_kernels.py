"""GPU tests of the CUDA forward kernels against the float64 NumPy reference.

Bound (flash-attn's): max|out - ref64| <= 2 * max|naive_lowp - ref64| + eps, with naive_lowp
the same-precision naive attention (reference.problem_ref(upcast=False)); LSE close, +inf
positions identical.  Inputs are fresh random numbers; out / lse are NaN-poisoned before the
launch so unwritten elements fail.
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from cupy_flashattn.problem import AttentionProblem  # noqa: E402
from cupy_flashattn.reference import problem_ref  # noqa: E402

from helpers import absent_page_table, cu_seqlens  # noqa: E402

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"f16": np.dtype(np.float16), "bf16": BF16, "f32": np.dtype(np.float32)}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    from cupy_flashattn import _cuda

    if not _cuda.is_available():
        pytest.skip("no sm_80+ GPU")
    # Compile the variants these tests use once, up front.
    return _cuda.precompile(
        dtypes=("f16", "bf16"),
        head_dims=(32, 64, 96, 128, 160, 192, 256),
        features=({}, {"paged": True}, {"transform": True}),
    )


def _rand(rng, shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))


def make_problem(rng, *, dtype="bf16", d=64, h=4, hk=None, lens_q, lens_k, varlen=None,
                 page=0, causal=False, window=(-1, -1), alibi=False, softcap=0.0,
                 scale=None, seqused=False):
    """A problem with per-sequence lengths; dense when all lengths agree and varlen is falsy."""
    dt = DTYPES[dtype]
    hk = hk or h
    b = len(lens_q)
    if varlen is None:
        varlen = len(set(lens_q)) > 1 or len(set(lens_k)) > 1
    cu_q = cu_seqlens(lens_q)
    total_q = int(cu_q[-1])
    q = _rand(rng, (total_q, h, d), dt)
    kw = {}
    if page:
        max_blocks = max(1, -(-max(lens_k) // page))
        num_pages = b * max_blocks + 3
        perm = rng.permutation(num_pages)[: b * max_blocks].reshape(b, max_blocks).astype(np.int32)
        k = _rand(rng, (num_pages, page, hk, d), dt)
        v = _rand(rng, (num_pages, page, hk, d), dt)
        kw.update(block_table=cupy.asarray(perm), page_block_size=page,
                  seqused_k=cupy.asarray(np.array(lens_k, np.int32)))
        seqlen_k = max_blocks * page
    else:
        cu_k = cu_seqlens(lens_k)
        k = _rand(rng, (int(cu_k[-1]), hk, d), dt)
        v = _rand(rng, (int(cu_k[-1]), hk, d), dt)
        seqlen_k = lens_k[0]
        if varlen:
            kw.update(cu_seqlens_k=cupy.asarray(cu_k))
    if varlen:
        kw.update(cu_seqlens_q=cupy.asarray(cu_q))
    wl, wr = window
    if causal:
        wr = 0
    out = cupy.full((total_q, h, d), np.nan, dtype=dt)
    lse = cupy.full((h, total_q), np.nan, dtype=np.float32)
    slopes = cupy.asarray(rng.uniform(0.01, 0.5, (b, h)).astype(np.float32)) if alibi else None
    return AttentionProblem(
        q=q, k=k, v=v, out=out, softmax_lse=lse, batch_size=b, seqlen_q=lens_q[0],
        seqlen_k=seqlen_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
        softmax_scale=(1.0 / np.sqrt(d)) if scale is None else scale,
        window_left=wl, window_right=wr, softcap=softcap, alibi_slopes=slopes, **kw,
    )  # fmt: skip


def _check_out(problem, ref, ref_lse, naive, run=None):
    """Run the prefill kernel (or ``run``) on a NaN-poisoned problem; assert flash-attn's bound
    and the LSE."""
    from cupy_flashattn._cuda.launch import run_attention as run_prefill

    # The prefill kernel itself by default (the package entry may route to decode).
    (run or run_prefill)(problem)
    out = cupy.asnumpy(problem.out).astype(np.float64)
    lse = cupy.asnumpy(problem.softmax_lse).astype(np.float64)
    assert not np.isnan(out).any(), "output has unwritten (NaN) elements"
    err = np.abs(out - ref).max(initial=0.0)
    naive_err = np.abs(naive.astype(np.float64) - ref).max(initial=0.0)
    assert err <= 2 * naive_err + 1e-5, f"max err {err:.3g} > 2 * naive {naive_err:.3g} + eps"
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse)), "LSE +inf positions differ"
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-3, atol=2e-3)


def check(problem, lowp_dtype=None):
    """_check_out against the float64 reference of the problem itself (float32 inputs: bounded
    by a bf16 naive run, as they compute at bf16)."""
    ref, ref_lse = problem_ref(problem)
    if lowp_dtype is not None:
        import copy

        p2 = copy.copy(problem)
        p2.q, p2.k, p2.v = (cupy.asarray(cupy.asnumpy(a).astype(lowp_dtype)) for a in (problem.q, problem.k, problem.v))
        naive, _ = problem_ref(p2, upcast=False)
    else:
        naive, _ = problem_ref(problem, upcast=False)
    _check_out(problem, ref, ref_lse, naive)


SEQ_PAIRS = [(1, 239), (239, 1), (113, 203), (203, 113), (128, 217), (217, 128),
             (1023, 1024), (1024, 1023), (2048, 1), (1, 2048)]  # fmt: skip


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("d", [32, 40, 59, 64, 80, 96, 128, 160, 192, 256])
def test_head_dims(dtype, d):
    rng = np.random.default_rng(d)
    check(make_problem(rng, dtype=dtype, d=d, h=2, lens_q=[97, 97], lens_k=[131, 131], causal=d % 2 == 0))


@pytest.mark.parametrize("sq,sk", SEQ_PAIRS)
@pytest.mark.parametrize("causal", [False, True])
def test_seqlen_pairs(sq, sk, causal):
    rng = np.random.default_rng(sq * 7 + sk)
    check(make_problem(rng, dtype="bf16", d=64, h=2, lens_q=[sq], lens_k=[sk], causal=causal))


def test_float32_inputs():
    rng = np.random.default_rng(3)
    check(make_problem(rng, dtype="f32", d=64, h=2, lens_q=[77, 77], lens_k=[150, 150]), lowp_dtype=BF16)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_mixed_with_zeros(causal):
    rng = np.random.default_rng(11)
    check(make_problem(rng, dtype="f16", d=128, h=4, hk=2, lens_q=[5, 0, 130, 64, 1],
                       lens_k=[300, 17, 0, 64, 200], causal=causal))


@pytest.mark.parametrize("page", [1, 16, 48, 64, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_paged(page, causal):
    rng = np.random.default_rng(page)
    check(make_problem(rng, dtype="bf16", d=128, h=4, hk=1, lens_q=[70, 1, 33], lens_k=[300, 129, 65],
                       page=page, causal=causal))


@pytest.mark.parametrize("window", [(32, 0), (16, 16), (-1, 8), (40, -1)])
def test_local_windows(window):
    rng = np.random.default_rng(sum(window) + 100)
    check(make_problem(rng, dtype="bf16", d=64, h=2, lens_q=[150, 150], lens_k=[260, 260], window=window))


@pytest.mark.parametrize("alibi,softcap", [(True, 0.0), (False, 30.0), (True, 20.0)])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_softcap(alibi, softcap, causal):
    rng = np.random.default_rng(int(softcap) + alibi)
    check(make_problem(rng, dtype="f16", d=96, h=3, lens_q=[90, 90], lens_k=[170, 170],
                       alibi=alibi, softcap=softcap, causal=causal))


@pytest.mark.parametrize("h,hk", [(8, 8), (8, 1), (8, 2), (12, 2), (14, 2)])
def test_gqa_mqa(h, hk):
    rng = np.random.default_rng(h * 10 + hk)
    check(make_problem(rng, dtype="bf16", d=64, h=h, hk=hk, lens_q=[65, 65], lens_k=[190, 190], causal=True))


def test_paged_gqa_alibi_softcap_local():
    rng = np.random.default_rng(5)
    check(make_problem(rng, dtype="f16", d=80, h=6, hk=1, lens_q=[40, 1, 0], lens_k=[100, 37, 5],
                       page=16, window=(20, 3), alibi=True, softcap=10.0))


def test_strided_q_out_and_negative_scale():
    rng = np.random.default_rng(9)
    p = make_problem(rng, dtype="bf16", d=64, h=2, lens_q=[50], lens_k=[90], scale=-0.1)
    big = _rand(rng, (50, 4, 64), BF16)
    big[:, 1:3] = p.q
    p.q = big[:, 1:3]  # strided view: row stride 4*64
    check(p)


# ---- Paths v1's tests missed: absent pages, cache_batch_idx / leftpad_k / seqused_k on dense
# K/V, float32 inputs through paged + causal. ----------------------------------------------------


@pytest.mark.parametrize("page,d", [(16, 128), (64, 64), (256, 128), (48, 96), (1, 32)])
def test_absent_pages(page, d):
    """Block-table entries outside [0, num_pages) (-1, num_pages, huge, INT_MIN): the keys of
    that page are absent -- masked out, never read -- and a sequence whose every page is absent
    outputs 0 with LSE +inf.  Non-causal, so the reference is attention over the present keys."""
    from cupy_flashattn.reference import attention_ref

    rng = np.random.default_rng(page * 3 + d)
    h, hk = 4, 2
    lens_q, lens_k = [37, 64, 5, 1], [300, 200, 70, 129]
    p = make_problem(rng, dtype="bf16", d=d, h=h, hk=hk, lens_q=lens_q, lens_k=lens_k, page=page)
    num_pages = p.k.shape[0]
    table = absent_page_table(rng, cupy.asnumpy(p.block_table), lens_k, page, num_pages)
    p.block_table = cupy.asarray(table)
    q = cupy.asnumpy(p.q).astype(np.float32)
    k = cupy.asnumpy(p.k).astype(np.float32)
    v = cupy.asnumpy(p.v).astype(np.float32)
    total_q = q.shape[0]
    ref = np.zeros((total_q, h, d))
    naive = np.zeros((total_q, h, d), np.float32)
    ref_lse = np.full((h, total_q), np.inf)
    q0 = 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        pos = np.arange(lk)
        pages = table[b, pos // page]
        keep = (pages >= 0) & (pages < num_pages)
        if keep.any() and lq:
            kb = k[pages[keep], pos[keep] % page].astype(BF16)
            vb = v[pages[keep], pos[keep] % page].astype(BF16)
            qb = q[q0:q0 + lq].astype(BF16)
            o, l = attention_ref(qb, kb, vb, softmax_scale=p.softmax_scale, return_lse=True)
            ref[q0:q0 + lq] = o
            ref_lse[:, q0:q0 + lq] = l
            naive[q0:q0 + lq] = attention_ref(qb, kb, vb, softmax_scale=p.softmax_scale,
                                              upcast=False).astype(np.float32)  # fmt: skip
        q0 += lq
    _check_out(p, ref, ref_lse, naive)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_dense_cache_batch_idx_leftpad_seqused(causal, d):
    """A dense KV cache (Bc slots x seqlen_k rows) read through cache_batch_idx, leftpad_k and
    seqused_k: sequence b uses rows [idx[b] * Sk + pad[b], idx[b] * Sk + used[b])."""
    from cupy_flashattn import _cuda

    rng = np.random.default_rng(d + causal)
    b, h, hk, sk, bc = 4, 4, 1, 160, 7
    lq = 33
    q = _rand(rng, (b * lq, h, d), BF16)
    k = _rand(rng, (bc * sk, hk, d), BF16)
    v = _rand(rng, (bc * sk, hk, d), BF16)
    idx = np.array([5, 0, 3, 6], np.int32)
    pad = np.array([0, 17, 64, 3], np.int32)
    used = np.array([160, 100, 64, 90], np.int32)  # seq 2: pad == used -> no keys
    out = cupy.full((b * lq, h, d), np.nan, dtype=BF16)
    lse = cupy.full((h, b * lq), np.nan, dtype=np.float32)
    p = AttentionProblem(
        q=q, k=k, v=v, out=out, softmax_lse=lse, batch_size=b, seqlen_q=lq, seqlen_k=sk,
        max_seqlen_q=lq, max_seqlen_k=sk, softmax_scale=d ** -0.5, window_right=0 if causal else -1,
        cache_batch_idx=cupy.asarray(idx), leftpad_k=cupy.asarray(pad), seqused_k=cupy.asarray(used),
    )  # fmt: skip
    assert _cuda.select_kernel(p).paged is False
    check(p)


@pytest.mark.parametrize("page", [0, 16])
def test_float32_inputs_causal_gqa(page):
    rng = np.random.default_rng(31 + page)
    check(make_problem(rng, dtype="f32", d=128, h=4, hk=2, lens_q=[90, 7], lens_k=[150, 64],
                       page=page, causal=True), lowp_dtype=BF16)  # fmt: skip
