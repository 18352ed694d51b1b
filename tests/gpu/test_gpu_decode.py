"""GPU tests of the decode path (cuda_src/sm80/flash_decode.cu, kv_cache.cu, _cuda/decode.py) against
the float64 NumPy reference, with flash-attn's bound (max|out - ref64| <= 2 * naive + eps).
Outputs are NaN-poisoned before the launch; caches after an append are compared EXACTLY with
the generic NumPy rotary + append of the same call."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")

import cupy_flashattn as fa  # noqa: E402
from cupy_flashattn import rotary as rot  # noqa: E402
from cupy_flashattn.problem import AttentionProblem  # noqa: E402
from cupy_flashattn.reference import problem_ref  # noqa: E402

from helpers import absent_page_table, cu_seqlens  # noqa: E402

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
EPS = {F16: 2e-3, BF16: 1.6e-2}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    from cupy_flashattn import _cuda

    if not _cuda.is_available():
        pytest.skip("no sm_80+ GPU")
    return _cuda.precompile_decode()


def _rand(rng, shape, dt):
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def make_problem(rng, *, dt=BF16, d=64, h=4, hk=1, lens_q, lens_k, page=0, window=(-1, -1),
                 causal=False, alibi=False, softcap=0.0, num_splits=0, varlen_q=None, scale=None):
    b = len(lens_q)
    cu_q = cu_seqlens(lens_q)
    total_q = int(cu_q[-1])
    q = cupy.asarray(_rand(rng, (total_q, h, d), dt))
    kw = {}
    if varlen_q is None:
        varlen_q = len(set(lens_q)) > 1
    if page:
        max_blocks = max(1, -(-max(lens_k) // page))
        num_pages = b * max_blocks + 3
        perm = rng.permutation(num_pages)[: b * max_blocks].reshape(b, max_blocks).astype(np.int32)
        k = cupy.asarray(_rand(rng, (num_pages, page, hk, d), dt))
        v = cupy.asarray(_rand(rng, (num_pages, page, hk, d), dt))
        kw.update(block_table=cupy.asarray(perm), page_block_size=page)
        seqlen_k = max_blocks * page
    else:
        seqlen_k = max(lens_k)
        k = cupy.asarray(_rand(rng, (b * seqlen_k, hk, d), dt))
        v = cupy.asarray(_rand(rng, (b * seqlen_k, hk, d), dt))
    kw.update(seqused_k=cupy.asarray(np.array(lens_k, np.int32)))
    if varlen_q:
        kw.update(cu_seqlens_q=cupy.asarray(cu_q))
    wl, wr = window
    if causal:
        wr = 0
    slopes = cupy.asarray(rng.uniform(0.01, 0.5, (b, h)).astype(np.float32)) if alibi else None
    return AttentionProblem(
        q=q, k=k, v=v, out=cupy.full((total_q, h, d), np.nan, dtype=dt),
        softmax_lse=cupy.full((h, total_q), np.nan, dtype=np.float32), batch_size=b,
        seqlen_q=lens_q[0], seqlen_k=seqlen_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
        softmax_scale=(1.0 / np.sqrt(d)) if scale is None else scale, window_left=wl,
        window_right=wr, softcap=softcap, alibi_slopes=slopes, num_splits=num_splits, **kw,
    )  # fmt: skip


def check(problem, expect_decode=True):
    from cupy_flashattn import _cuda

    assert _cuda.decode_applies(problem) == expect_decode
    _cuda.run_attention(problem)
    out = cupy.asnumpy(problem.out).astype(np.float64)
    lse = cupy.asnumpy(problem.softmax_lse).astype(np.float64)
    ref, ref_lse = problem_ref(problem)
    naive, _ = problem_ref(problem, upcast=False)
    assert not np.isnan(out).any(), "output has unwritten (NaN) elements"
    assert not np.isnan(lse).any(), "lse has unwritten (NaN) elements"
    err = np.abs(out - ref).max(initial=0.0)
    naive_err = np.abs(naive.astype(np.float64) - ref).max(initial=0.0)
    bound = 2 * naive_err + EPS[np.dtype(problem.q.dtype)]
    assert err <= bound, f"max err {err:.3g} > bound {bound:.3g}"
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse)), "LSE +inf positions differ"
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-3, atol=2e-3)


# -- kernel level ------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
@pytest.mark.parametrize("d", [32, 59, 64, 80, 128, 256])
@pytest.mark.parametrize("splits", [0, 1, 3])
def test_head_dims_and_splits(dt, d, splits):
    rng = np.random.default_rng(d * 10 + splits)
    check(make_problem(rng, dt=dt, d=d, h=8, hk=2, lens_q=[1, 1, 1], lens_k=[1, 777, 300],
                       num_splits=splits))


@pytest.mark.parametrize("d", [40, 59, 128, 200, 256])
@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("splits", [5, 37, 70])
def test_many_splits(d, page, splits):
    """The split merge at more splits than a warp has lanes (the LSE pass takes 32 splits per
    pass; the last split CTA's merge loads 16 splits per round trip at D = 128, 32 at D = 40,
    8 past 128 columns) and past 128 head-dim columns (the combine kernel's two column passes,
    the fused merge's two chunks a lane: D = 200 fills the second only partly; D = 40: 10
    chunks on 16 lanes), with empty splits (the short sequences' later splits see no key).
    D = 59 (adapted operands) merges in the combine kernel, the others in the last split CTA."""
    rng = np.random.default_rng(d + 7 * page + 1000 * splits)
    check(make_problem(rng, d=d, h=8, hk=2, lens_q=[1, 1, 1], lens_k=[4100, 9, 1500],
                       page=page, num_splits=splits))


@pytest.mark.parametrize("page", [0, 1, 16, 48, 256])
@pytest.mark.parametrize("splits", [0, 1, 3])
def test_pages(page, splits):
    rng = np.random.default_rng(page + 1000 * splits)
    check(make_problem(rng, d=128, h=8, hk=2, lens_q=[1, 1, 1, 1], lens_k=[5, 1000, 257, 16],
                       page=page, num_splits=splits))


@pytest.mark.parametrize("sk", [1, 2, 15, 16, 17, 4097, 131072])
def test_seqlen_k(sk):
    rng = np.random.default_rng(sk)
    check(make_problem(rng, dt=F16, d=64, h=4, hk=1, lens_q=[1], lens_k=[sk], page=16 if sk > 9 else 0))


@pytest.mark.parametrize("h,hk,sq", [(8, 8, 1), (8, 8, 16), (8, 1, 2), (32, 1, 1), (8, 2, 3),
                                     (12, 2, 4), (14, 2, 2), (32, 8, 16), (6, 3, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_packing(h, hk, sq, causal):
    rng = np.random.default_rng(h * 100 + hk * 10 + sq)
    check(make_problem(rng, dt=BF16, d=64, h=h, hk=hk, lens_q=[sq, sq], lens_k=[190, 33], page=16,
                       causal=causal, num_splits=3 if causal else 0))


@pytest.mark.parametrize("d", [40, 59, 80, 128])
@pytest.mark.parametrize("h,hk,sq", [(32, 1, 1), (24, 1, 2), (16, 2, 5), (32, 8, 9), (64, 1, 1)])
@pytest.mark.parametrize("page", [0, 1, 16, 48])
def test_wide_groups(d, h, hk, sq, page):
    """More than 16 packed rows per kv head (MQA; GQA with several query tokens): several 16-row
    tiles of one kv head, each its own CTA over the same keys.  48 / 40 / 36 rows leave the last
    tile partly padding; 64 rows take four.  Split (the heuristic's, and forced 3: the fused
    merge) and unsplit.  On compute capability 9.0, MQA with one query token runs the sm90
    split kernel with swapped rows instead (tests/gpu/test_decode_sm90.py), correct all the
    same."""
    from cupy_flashattn import _cuda

    for splits in (0, 3):
        rng = np.random.default_rng(d * 1000 + h * 10 + sq + page + splits)
        problem = make_problem(rng, dt=F16 if d == 80 else BF16, d=d, h=h, hk=hk,
                               lens_q=[sq] * 3, lens_k=[1, 300, 97], page=page, num_splits=splits,
                               causal=sq > 1)
        (launch,) = _cuda.describe_launches(problem)
        if launch["kind"] != "decode_sm90":
            assert launch["kind"] == "decode" and launch["grid"][0] % -(-sq * (h // hk) // 16) == 0, launch
        check(problem)


@pytest.mark.parametrize("alibi,softcap,window", [(True, 0.0, (-1, -1)), (False, 30.0, (-1, -1)),
                                                  (True, 20.0, (40, 0)), (False, 0.0, (7, 3))])
def test_wide_group_logit_variants(alibi, softcap, window):
    """ALiBi slopes and the local window per packed row of a group of two 16-row tiles (the
    second tile's rows are other query heads and, with 2 queries, another query index), softcap."""
    rng = np.random.default_rng(int(softcap) + 3 * alibi + window[0])
    check(make_problem(rng, dt=F16, d=128, h=16, hk=1, lens_q=[2, 2], lens_k=[170, 400],
                       alibi=alibi, softcap=softcap, window=window, page=16, num_splits=3))


@pytest.mark.parametrize("window", [(32, 0), (16, 16), (-1, 8), (40, -1), (0, 0)])
def test_local_windows(window):
    rng = np.random.default_rng(sum(window) + 77)
    check(make_problem(rng, d=64, h=8, hk=2, lens_q=[5, 5], lens_k=[260, 7], window=window, num_splits=3))


@pytest.mark.parametrize("alibi,softcap", [(True, 0.0), (False, 30.0), (True, 20.0)])
def test_alibi_softcap(alibi, softcap):
    rng = np.random.default_rng(int(softcap) + alibi)
    check(make_problem(rng, dt=F16, d=96, h=6, hk=2, lens_q=[3, 3], lens_k=[170, 400], causal=True,
                       alibi=alibi, softcap=softcap, page=48, num_splits=0))


def test_varlen_mixed_and_empty():
    rng = np.random.default_rng(5)
    check(make_problem(rng, d=128, h=8, hk=2, lens_q=[1, 0, 3, 1, 2], lens_k=[300, 17, 0, 1, 2000],
                       page=16, causal=True, num_splits=3))


@pytest.mark.parametrize("page", [1, 16, 48])
@pytest.mark.parametrize("h,hk", [(8, 2), (32, 1)])
@pytest.mark.parametrize("softcap,splits", [(0.0, 0), (0.0, 3), (30.0, 3)])
def test_absent_pages(page, h, hk, softcap, splits):
    """Block-table entries outside [0, num_pages) (helpers.absent_page_table) inside a
    sequence's length: their keys are absent -- masked, never read (paged.cuh) -- as in the
    prefill kernel and the CPU backend; a sequence whose every page is absent outputs 0 with
    LSE +inf.  The decode kernel zero-fills an absent key's row, so without the mask its logit
    would be 0, not -inf.  Softcap 0 takes the plain-logit path, which skips the mask on
    tiles every row sees whole (a tile with an absent key must still be masked); 30 the
    transform path.  The reference is attention over the present keys (no window or ALiBi:
    positions do not matter)."""
    from cupy_flashattn import _cuda
    from cupy_flashattn.reference import attention_ref

    rng = np.random.default_rng(page * 7 + h + int(softcap) + splits)
    lens_k = [300, 200, 70, 129]
    p = make_problem(rng, d=128, h=h, hk=hk, lens_q=[1, 1, 1, 1], lens_k=lens_k, page=page,
                     softcap=softcap, num_splits=splits)
    num_pages = p.k.shape[0]
    table = absent_page_table(rng, cupy.asnumpy(p.block_table), lens_k, page, num_pages)
    p.block_table = cupy.asarray(table)
    assert _cuda.decode_applies(p)
    _cuda.run_attention(p)
    out = cupy.asnumpy(p.out).astype(np.float64)
    lse = cupy.asnumpy(p.softmax_lse).astype(np.float64)
    q, k, v = (cupy.asnumpy(x) for x in (p.q, p.k, p.v))
    ref = np.zeros(out.shape)
    naive = np.zeros(out.shape)
    ref_lse = np.full(lse.shape, np.inf)
    for b, lk in enumerate(lens_k):
        pos = np.arange(lk)
        pages = table[b, pos // page]
        keep = (pages >= 0) & (pages < num_pages)
        if not keep.any():
            continue
        kb, vb = k[pages[keep], pos[keep] % page], v[pages[keep], pos[keep] % page]
        o, l = attention_ref(q[b:b + 1], kb, vb, softmax_scale=p.softmax_scale, softcap=softcap,
                             return_lse=True)  # fmt: skip
        ref[b:b + 1], ref_lse[:, b:b + 1] = o, l
        naive[b:b + 1] = attention_ref(q[b:b + 1], kb, vb, softmax_scale=p.softmax_scale,
                                       softcap=softcap, upcast=False)  # fmt: skip
    assert not np.isnan(out).any() and not np.isnan(lse).any(), "unwritten (NaN) elements"
    err = np.abs(out - ref).max()
    bound = 2 * np.abs(naive - ref).max() + EPS[BF16]
    assert err <= bound, f"max err {err:.3g} > bound {bound:.3g}"
    assert (out[2] == 0).all() and np.isposinf(lse[:, 2]).all(), "all pages absent: 0, LSE +inf"
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), fin)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-3, atol=2e-3)


def test_negative_scale_and_routing():
    rng = np.random.default_rng(9)
    check(make_problem(rng, d=64, h=4, hk=4, lens_q=[2], lens_k=[90], scale=-0.1))
    check(make_problem(rng, d=64, h=4, hk=4, lens_q=[40], lens_k=[90]), expect_decode=False)


def test_splits_heuristic():
    from cupy_flashattn._cuda import decode

    assert decode.num_splits_heuristic(512, 4096, 132, 2) == 1
    s = decode.num_splits_heuristic(8, 4096, 132, 2)
    assert 1 < s <= 16
    assert decode.num_splits_heuristic(8, 200, 132, 2) == 4  # one CTA per SM, >= 64 keys a split
    assert decode.num_splits_heuristic(8, 16, 132, 2) == 1


# -- the public API: append, rotary, leftpad, batch_idx ----------------------------------------


def _cos_sin(rng, seqlen_ro, rot_half, dt):
    ang = rng.uniform(0, 2 * np.pi, (seqlen_ro, rot_half))
    return np.cos(ang).astype(dt), np.sin(ang).astype(dt)


@pytest.mark.parametrize("layout", ["contig", "leftpad", "batch_idx", "page1", "page16", "page48"])
@pytest.mark.parametrize("rot_frac,interleaved", [(0, False), (0.5, True), (0.5, False), (1, True), (1, False)])
@pytest.mark.parametrize("s_new", [1, 3])
def test_with_kvcache_append_rotary(layout, rot_frac, interleaved, s_new):
    dt = BF16 if s_new == 1 else F16
    rng = np.random.default_rng(zlib.crc32(repr((layout, rot_frac, interleaved, s_new)).encode()))
    B, H, Hk, D, Sq = 3, 8, 2, 64, s_new
    cap = 300
    lens = np.array([0, 200, 297 - s_new][:B], np.int32)
    q = _rand(rng, (B, Sq, H, D), dt)
    k_new, v_new = _rand(rng, (B, s_new, Hk, D), dt), _rand(rng, (B, s_new, Hk, D), dt)
    kw = {}
    paged = layout.startswith("page")
    if paged:
        P = int(layout[4:])
        mb = -(-cap // P)
        table = rng.permutation(B * mb + 2)[: B * mb].reshape(B, mb).astype(np.int32)
        kc, vc = _rand(rng, (B * mb + 2, P, Hk, D), dt), _rand(rng, (B * mb + 2, P, Hk, D), dt)
        kw["block_table"] = table
    else:
        rows = B + 2 if layout == "batch_idx" else B
        kc, vc = _rand(rng, (rows, cap, Hk, D), dt), _rand(rng, (rows, cap, Hk, D), dt)
        if layout == "batch_idx":
            kw["cache_batch_idx"] = np.array([4, 0, 2], np.int32)
        if layout == "leftpad":
            kw["cache_leftpad"] = np.array([0, 37, 5], np.int32)
    rot_half = int(D * rot_frac) // 2
    cos = sin = None
    if rot_half:
        # A row per cache position (flash-attn's rule): the paged table's whole width.
        ro_rows = (-(-cap // P) * P if layout.startswith("page") else cap) + 4
        cos, sin = _cos_sin(rng, ro_rows, rot_half, np.float32 if interleaved else dt)
    causal = Sq > 1

    # expected: the generic NumPy code on host copies
    kc_e, vc_e, q_e, k_e = kc.copy(), vc.copy(), q, k_new
    if rot_half:
        base = lens[:, None].astype(np.int64)
        k_pos = base + np.arange(s_new)[None, :]
        q_pos = base + np.arange(Sq)[None, :] if causal else np.broadcast_to(base, (B, Sq))
        q_e = rot.apply_rotary(q, cos, sin, q_pos, interleaved)
        k_e = rot.apply_rotary(k_new, cos, sin, k_pos, interleaved)
    if paged:
        rot.append_kv_paged(kc_e, vc_e, table, k_e, v_new, lens)
    else:
        rot.append_kv_contiguous(kc_e, vc_e, k_e, v_new, lens, kw.get("cache_batch_idx"))

    g = {n: cupy.asarray(a) for n, a in kw.items()}
    kc_d, vc_d = cupy.asarray(kc), cupy.asarray(vc)
    out = cupy.full((B, Sq, H, D), np.nan, dtype=dt)
    res, lse = fa.flash_attn_with_kvcache(
        cupy.asarray(q), kc_d, vc_d, cupy.asarray(k_new), cupy.asarray(v_new),
        rotary_cos=None if cos is None else cupy.asarray(cos),
        rotary_sin=None if sin is None else cupy.asarray(sin),
        cache_seqlens=cupy.asarray(lens), causal=causal, rotary_interleaved=interleaved,
        out=out, return_softmax_lse=True, num_splits=3 if s_new == 3 else 0, **g,
    )
    np.testing.assert_array_equal(cupy.asnumpy(kc_d).view(np.uint16), kc_e.view(np.uint16))
    np.testing.assert_array_equal(cupy.asnumpy(vc_d).view(np.uint16), vc_e.view(np.uint16))

    # attention reference on the expected cache
    used = (lens + s_new).astype(np.int32)
    if paged:
        kk, vv = kc_e, vc_e
    else:
        kk, vv = kc_e.reshape(-1, Hk, D), vc_e.reshape(-1, Hk, D)
    p = AttentionProblem(
        q=q_e.reshape(B * Sq, H, D), k=kk, v=vv, out=None, softmax_lse=None, batch_size=B,
        seqlen_q=Sq, seqlen_k=(table.shape[1] * P) if paged else cap, max_seqlen_q=Sq,
        max_seqlen_k=cap, seqused_k=used, cache_batch_idx=kw.get("cache_batch_idx"),
        leftpad_k=kw.get("cache_leftpad"), block_table=kw.get("block_table"),
        page_block_size=P if paged else 0, softmax_scale=1 / np.sqrt(D),
        window_right=0 if causal else -1,
    )  # fmt: skip
    ref, ref_lse = problem_ref(p)
    naive, _ = problem_ref(p, upcast=False)
    o = cupy.asnumpy(res).reshape(B * Sq, H, D).astype(np.float64)
    assert not np.isnan(o).any()
    err = np.abs(o - ref).max()
    bound = 2 * np.abs(naive.astype(np.float64) - ref).max() + EPS[dt]
    assert err <= bound, f"max err {err:.3g} > {bound:.3g}"
    l = cupy.asnumpy(lse).transpose(1, 0, 2).reshape(H, B * Sq)
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(l[fin], ref_lse[fin], rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("paged", [False, True])
def test_append_drops_out_of_range(paged):
    """Positions past the capacity and bad page ids are dropped, nothing else is touched."""
    rng = np.random.default_rng(3)
    B, Hk, D, S_new = 3, 2, 40, 4
    k_new, v_new = _rand(rng, (B, S_new, Hk, D), F16), _rand(rng, (B, S_new, Hk, D), F16)
    lens = np.array([30, 14, -2], np.int32)
    if paged:
        table = np.array([[0, 1], [2, 99], [3, 4]], np.int32)  # 99: not a page
        kc = _rand(rng, (6, 16, Hk, D), F16)
    else:
        kc = _rand(rng, (B, 32, Hk, D), F16)
    vc = _rand(rng, kc.shape, F16)
    kd, vd = cupy.asarray(kc), cupy.asarray(vc)
    # expected: only valid slots written
    ke, ve = kc.copy(), vc.copy()
    for b in range(B):
        for i in range(S_new):
            pos = int(lens[b]) + i
            if pos < 0:
                continue
            if paged:
                col = pos // 16
                if col >= 2 or not 0 <= table[b, col] < 6:
                    continue
                ke[table[b, col], pos % 16], ve[table[b, col], pos % 16] = k_new[b, i], v_new[b, i]
            elif pos < 32:
                ke[b, pos], ve[b, pos] = k_new[b, i], v_new[b, i]
    args = (cupy.asarray(k_new), cupy.asarray(v_new), cupy.asarray(lens))
    if paged:
        rot.append_kv_paged(kd, vd, cupy.asarray(table), *args)
    else:
        rot.append_kv_contiguous(kd, vd, *args)
    np.testing.assert_array_equal(cupy.asnumpy(kd).view(np.uint16), ke.view(np.uint16))
    np.testing.assert_array_equal(cupy.asnumpy(vd).view(np.uint16), ve.view(np.uint16))


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("q_per_token", [False, True])
def test_rotate_and_append_exact(paged, q_per_token):
    rng = np.random.default_rng(11 + paged)
    B, Sq, H, Hk, D = 2, 3, 4, 2, 64
    lens = np.array([5, 60], np.int32)
    q = _rand(rng, (B, Sq, H, D), BF16)
    k_new, v_new = _rand(rng, (B, Sq, Hk, D), BF16), _rand(rng, (B, Sq, Hk, D), BF16)
    cos, sin = _cos_sin(rng, 70, 16, BF16)
    if paged:
        table = np.array([[3, 1, 0, 2], [4, 5, 6, 7]], np.int32)
        kc = _rand(rng, (8, 16, Hk, D), BF16)
    else:
        kc = _rand(rng, (B, 64, Hk, D), BF16)
    vc = _rand(rng, kc.shape, BF16)
    base = lens[:, None].astype(np.int64)
    q_pos = base + np.arange(Sq) if q_per_token else np.broadcast_to(base, (B, Sq))
    q_e = rot.apply_rotary(q, cos, sin, q_pos, False)
    k_e = rot.apply_rotary(k_new, cos, sin, base + np.arange(Sq), False)
    ke, ve = kc.copy(), vc.copy()
    if paged:
        rot.append_kv_paged(ke, ve, table, k_e, v_new, lens)
    else:
        rot.append_kv_contiguous(ke, ve, k_e, v_new, lens)
    kd, vd = cupy.asarray(kc), cupy.asarray(vc)
    qd = rot.rotate_and_append(
        cupy.asarray(q), kd, vd, cupy.asarray(k_new), cupy.asarray(v_new), cupy.asarray(lens),
        cos=cupy.asarray(cos), sin=cupy.asarray(sin), q_per_token=q_per_token,
        block_table=cupy.asarray(table) if paged else None)
    np.testing.assert_array_equal(cupy.asnumpy(qd).view(np.uint16), q_e.view(np.uint16))
    np.testing.assert_array_equal(cupy.asnumpy(kd).view(np.uint16), ke.view(np.uint16))
    np.testing.assert_array_equal(cupy.asnumpy(vd).view(np.uint16), ve.view(np.uint16))


def test_paged_kv_cache_object_decode():
    rng = np.random.default_rng(21)
    cache = fa.PagedKVCache(64, 16, 2, 64, BF16, xp=cupy)
    ids = [cache.add_sequence() for _ in range(3)]
    for n, s in zip([40, 1, 100], ids):
        cache.append(s, cupy.asarray(_rand(rng, (1, n, 2, 64), BF16)), cupy.asarray(_rand(rng, (1, n, 2, 64), BF16)))
    q = cupy.asarray(_rand(rng, (3, 1, 8, 64), BF16))
    kn, vn = cupy.asarray(_rand(rng, (3, 1, 2, 64), BF16)), cupy.asarray(_rand(rng, (3, 1, 2, 64), BF16))
    out = fa.flash_attn_with_kvcache(q, cache, None, kn, vn, causal=True)
    assert cache.seqlens(ids).get().tolist() == [41, 2, 101]
    table, lens = cache.block_table(ids).get(), cache.seqlens(ids).get()
    qn = q.get().reshape(3, 8, 64)
    p = AttentionProblem(q=qn, k=cache.k_pages.get(), v=cache.v_pages.get(), out=None, softmax_lse=None,
                         batch_size=3, seqlen_q=1, seqlen_k=table.shape[1] * 16, max_seqlen_q=1,
                         max_seqlen_k=101, seqused_k=lens, block_table=table, page_block_size=16,
                         softmax_scale=1 / 8, window_right=0)
    ref, _ = problem_ref(p)
    naive, _ = problem_ref(p, upcast=False)
    err = np.abs(out.get().reshape(3, 8, 64).astype(np.float64) - ref).max()
    assert err <= 2 * np.abs(naive.astype(np.float64) - ref).max() + EPS[BF16]


# -- merge_attention_states on the GPU -----------------------------------------------------------


@pytest.mark.parametrize("dt", [F16, BF16, np.dtype(np.float32)], ids=str)
@pytest.mark.parametrize("dense", [False, True])
def test_merge_gpu_matches_numpy(dt, dense):
    rng = np.random.default_rng(31)
    shape = (2, 5, 4, 59) if dense else (7, 4, 59)
    lshape = (2, 4, 5) if dense else (4, 7)
    oa, ob = _rand(rng, shape, dt), _rand(rng, shape, dt)
    la, lb = rng.normal(size=lshape).astype(np.float32), rng.normal(size=lshape).astype(np.float32)
    # row 0: b empty (+inf) with a NaN out; row 1: a empty; row 2: both empty; row 3: a -inf
    lb.flat[0], la.flat[1], la.flat[2], lb.flat[2], la.flat[3] = np.inf, np.inf, np.inf, np.inf, -np.inf
    ob[(0,) * (len(shape) - 1)] = np.nan  # an empty partial's out may hold anything
    o_ref, l_ref = fa.merge_attention_states(oa, la, ob, lb)
    o, l = fa.merge_attention_states(cupy.asarray(oa), cupy.asarray(la), cupy.asarray(ob), cupy.asarray(lb))
    tol = 1e-5 if dt == np.float32 else (2e-2 if dt == BF16 else 4e-3)
    np.testing.assert_allclose(cupy.asnumpy(o).astype(np.float64), o_ref.astype(np.float64), rtol=tol, atol=tol)
    np.testing.assert_allclose(cupy.asnumpy(l), l_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_fused_combine_switch(monkeypatch, dt, sinks):
    """FA_DECODE_FUSED_COMBINE (flash_decode.cu; on by default, device-verified on an H100
    2026-12-06): split-KV decode whose last split CTA per tile merges the partials -- no combine
    launch -- within the bound, equal to the combine kernel's result (the A/B baseline,
    FA_DECODE_FUSED_COMBINE=0) up to summation order, and again on the next launches (the
    combining CTA resets its counter).  Sequences with keys in only some splits and one with no
    key at all (its row: 0, LSE +inf).  Both builds are chosen here, whatever switches the
    process runs with."""
    from cupy_flashattn._cuda.decode import DecodePlan

    rng = np.random.default_rng(7 + sinks)
    problem = make_problem(rng, dt=dt, d=128, h=8, hk=2, lens_q=[1, 1, 1, 1],
                           lens_k=[3000, 40, 0, 1025], num_splits=6)
    if sinks:
        problem.sinks = cupy.asarray(rng.uniform(-1.0, 2.0, 8).astype(np.float32))
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", "FA_DECODE_FUSED_COMBINE=0")
    baseline = DecodePlan(problem)
    assert baseline.combine_launch is not None and not baseline.fused
    baseline.run(problem)
    out0, lse0 = problem.out.copy(), problem.softmax_lse.copy()
    monkeypatch.delenv("CUPY_FLASHATTN_SM90_DEFINES")  # the default build: fused
    plan = DecodePlan(problem)
    assert plan.fused and plan.combine_launch is None and plan.splits == 6
    for _ in range(3):  # the counters must be back at 0 after every launch
        problem.out[...] = cupy.full(problem.out.shape, np.nan, dtype=problem.out.dtype)
        problem.softmax_lse[...] = np.nan
        plan.run(problem)
        np.testing.assert_allclose(cupy.asnumpy(problem.out).astype(np.float32),
                                   cupy.asnumpy(out0).astype(np.float32), rtol=0, atol=2e-2)
        np.testing.assert_allclose(cupy.asnumpy(problem.softmax_lse), cupy.asnumpy(lse0),
                                   rtol=1e-5, atol=1e-5)
    ref, ref_lse = problem_ref(problem)
    naive, _ = problem_ref(problem, upcast=False)
    out = cupy.asnumpy(problem.out).astype(np.float64)
    err = np.abs(out - ref).max()
    assert err <= 2 * np.abs(naive.astype(np.float64) - ref).max() + EPS[dt]
    lse = cupy.asnumpy(problem.softmax_lse)
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse))
    assert (out[2] == 0).all()  # the sequence without keys (its LSE: +inf, or the sink's)
    assert np.isinf(lse[:, 2]).all() != sinks
