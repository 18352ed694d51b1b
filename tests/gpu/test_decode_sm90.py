"""GPU tests of MQA decode on the sm90 split-KV kernel with swapped rows (_cuda/decode_sm90.py,
sm90/flash_fwd.cu Is_split) against the float64 NumPy reference, with flash-attn's bound
(test_gpu_decode.check: outputs NaN-poisoned before the launch, LSE compared too).  Every case
first asserts which kernel serves it, so a routing change cannot turn these into tests of the
mma.sync decode kernel."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
pytest.importorskip("ml_dtypes")

from test_gpu_decode import BF16, F16, check, make_problem  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def hopper():
    from cupy_flashattn import _cuda

    if not _cuda.is_available() or int(cupy.cuda.Device().compute_capability) != 90:
        pytest.skip("the swapped decode path runs on compute capability 9.0 only")


def _launch(problem) -> dict:
    """describe_launches' one entry for the problem."""
    from cupy_flashattn import _cuda

    (launch,) = _cuda.describe_launches(problem)
    return launch


def _kind(problem) -> str:
    return _launch(problem)["kind"]


def run(problem, kind="decode_sm90"):
    from cupy_flashattn._cuda import decode_applies

    assert _kind(problem) == kind
    check(problem, expect_decode=decode_applies(problem))  # (the mma.sync decode kernel's rule)


@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
@pytest.mark.parametrize("d", [40, 64, 80, 128, 136, 192, 200, 256])
@pytest.mark.parametrize("page", [0, 16])
def test_head_dims(dt, d, page):
    """Every head-dim bucket (40 -> 64, 80 -> 128, 136 -> 192, 200 -> 256: columns past D are
    the TMA box's zeros), dense and paged K/V, lengths 1 / 97 / 1025 (a partial last tile and
    page)."""
    rng = np.random.default_rng(d * 10 + page)
    run(make_problem(rng, dt=dt, d=d, h=32, hk=1, lens_q=[1, 1, 1], lens_k=[1, 97, 1025],
                     page=page))


@pytest.mark.parametrize("page", [1, 7, 16, 48, 64, 256])
@pytest.mark.parametrize("splits", [0, 1, 3, 70])
def test_pages_and_splits(page, splits):
    """Page sizes that the TMA producer loads by box (16, 64, 256) and that it gathers (1, 7,
    48), scattered pages, and forced split counts: 1 (one partial, the combine writes the
    LSE), 3, and 70 (more than the longest sequence's key tiles: clamped, no empty run)."""
    rng = np.random.default_rng(page + 1000 * splits)
    run(make_problem(rng, d=128, h=32, hk=1, lens_q=[1] * 4, lens_k=[5, 1000, 257, 16],
                     page=page, num_splits=splits))


@pytest.mark.parametrize("h", [16, 48, 64, 128, 160])
def test_head_counts(h):
    """16 query heads (the fewest swapped), 48 (a partial 64-row warpgroup), 128 (both
    warpgroups full) and 160 (two query tiles per sequence)."""
    rng = np.random.default_rng(h)
    run(make_problem(rng, d=64, h=h, hk=1, lens_q=[1, 1], lens_k=[700, 33], page=16))


@pytest.mark.parametrize("sk", [1, 128, 129, 4097, 131072])
def test_context_lengths(sk):
    """One sequence: a single key, one whole tile, one key past it, and a long context whose
    heuristic splits reach SWAP_MAX_SPLITS."""
    rng = np.random.default_rng(sk)
    run(make_problem(rng, dt=F16, d=128, h=32, hk=1, lens_q=[1], lens_k=[sk],
                     page=16 if sk > 9 else 0))


@pytest.mark.parametrize("softcap,causal,sinks", [(30.0, False, False), (0.0, True, False),
                                                  (0.0, False, True), (20.0, True, True)])
@pytest.mark.parametrize("page", [0, 16])
def test_logit_variants(softcap, causal, sinks, page):
    """Softcap (the transform kernel); causal (one query per sequence: a no-op the swap drops);
    attention sinks, which the kernel's partials leave to the combine kernel."""
    rng = np.random.default_rng(int(softcap) + 2 * causal + 4 * sinks + page)
    p = make_problem(rng, d=128, h=32, hk=1, lens_q=[1, 1, 1],
                     lens_k=[300, 1, 2049], page=page, softcap=softcap, causal=causal,
                     num_splits=0 if sinks else 4)
    if sinks:
        p.sinks = cupy.asarray(rng.uniform(-2.0, 4.0, 32).astype(np.float32))
    run(p)


def test_routing_stays_on_mma_sync_decode(monkeypatch):
    """What the swap cannot serve keeps the mma.sync decode kernel, correct: a left window,
    ALiBi, two query tokens, two kv heads, a head dim that is not a multiple of 8, and the
    switch CUPY_FLASHATTN_DECODE_SM90=0."""
    rng = np.random.default_rng(5)
    common = dict(d=64, h=32, lens_q=[1, 1], lens_k=[300, 77], page=16)
    run(make_problem(rng, hk=1, window=(40, -1), **common), "decode")
    run(make_problem(rng, hk=1, alibi=True, **common), "decode")
    run(make_problem(rng, hk=2, **common), "decode")
    run(make_problem(rng, **{**common, "lens_q": [2, 2], "h": 16}, hk=1, causal=True), "decode")
    run(make_problem(rng, **{**common, "d": 59}, hk=1), "decode")
    monkeypatch.setenv("CUPY_FLASHATTN_DECODE_SM90", "0")
    run(make_problem(rng, hk=1, **common), "decode")


@pytest.mark.parametrize("d", [64, 128, 192])
@pytest.mark.parametrize("page", [0, 16])
def test_direct_output_of_one_sequence(d, page):
    """One sequence in one split (forced, and a short context): the split kernel stores O and
    the LSE itself and no combine runs -- its (B, H) LSE order is the caller's (H, B) at B = 1."""
    rng = np.random.default_rng(d + page)
    for lens_k, splits in (([1025], 1), ([97], 0)):
        p = make_problem(rng, d=d, h=32, hk=1, lens_q=[1], lens_k=lens_k, page=page,
                         num_splits=splits)
        assert _launch(p)["combine"] is False and _launch(p)["splits"] == 1
        run(p)


@pytest.mark.parametrize("page", [16, 256])
def test_direct_output_of_a_large_batch_whose_lse_nobody_reads(page):
    """A batch that fills SWAP_DIRECT_MIN_FILL of the SMs, LSE unread: one split a sequence
    stored straight into out (checked against the reference; the LSE buffer is fully written,
    in the kernel's order); the same batch with its LSE read takes the partials and the
    combine and is checked whole (out and LSE)."""
    from cupy_flashattn import _cuda
    from cupy_flashattn._cuda import decode_sm90 as ds
    from test_gpu_decode import EPS, problem_ref

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    B = int(np.ceil(ds.SWAP_DIRECT_MIN_FILL * sms)) + 3
    rng = np.random.default_rng(page)
    lens_k = [int(x) for x in rng.integers(1, 700, B)]
    p = make_problem(rng, d=128, h=32, hk=1, lens_q=[1] * B, lens_k=lens_k, page=page)
    p.lse_unread = True
    assert _launch(p)["combine"] is False and _launch(p)["splits"] == 1
    _cuda.run_attention(p)
    out = cupy.asnumpy(p.out).astype(np.float64)
    ref, _ = problem_ref(p)
    naive, _ = problem_ref(p, upcast=False)
    assert not np.isnan(out).any() and not np.isnan(cupy.asnumpy(p.softmax_lse)).any()
    bound = 2 * np.abs(naive.astype(np.float64) - ref).max() + EPS[np.dtype(p.q.dtype)]
    assert np.abs(out - ref).max() <= bound
    p.lse_unread = False
    p.out[...] = np.nan
    p.softmax_lse[...] = np.nan
    assert _launch(p)["combine"] is True
    run(p)


def test_front_end_direct_output_without_lse_and_combine_with_it(monkeypatch):
    """flash_attn_with_kvcache on a large MQA batch: without return_softmax_lse the plan stores
    directly (no combine), with it the plan combines; both outputs match the reference and
    the returned LSE does too."""
    import cupy_flashattn as fa
    from cupy_flashattn._cuda import decode_sm90 as ds
    from cupy_flashattn.reference import attention_ref

    made = []
    init = ds.Sm90DecodePlan.__init__

    def record(self, *a, **kw):
        init(self, *a, **kw)
        made.append(self.direct_out)

    monkeypatch.setattr(ds.Sm90DecodePlan, "__init__", record)
    rng = np.random.default_rng(5)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    B, H, D, P = int(np.ceil(ds.SWAP_DIRECT_MIN_FILL * sms)) + 1, 32, 128, 16
    lens = rng.integers(1, 300, B).astype(np.int32)
    pages = B * 19 + 5
    k_cache, v_cache = _bf16(rng, (pages, P, 1, D)), _bf16(rng, (pages, P, 1, D))
    table = cupy.asarray(rng.permutation(pages)[: B * 19].reshape(B, 19).astype(np.int32))
    q = _bf16(rng, (B, 1, H, D))
    seqlens = cupy.asarray(lens)
    out_direct = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                            block_table=table)
    out_comb, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               block_table=table, return_softmax_lse=True)
    assert made == [True, False]
    kc, vc, qh, tb = (cupy.asnumpy(a) for a in (k_cache, v_cache, q, table))
    lse = cupy.asnumpy(lse)
    for b in range(B):
        pos = np.arange(int(lens[b]))
        kb, vb = kc[tb[b, pos // P], pos % P], vc[tb[b, pos // P], pos % P]
        ref, ref_lse = attention_ref(qh[b], kb, vb, softmax_scale=D ** -0.5, return_lse=True)
        naive = attention_ref(qh[b], kb, vb, softmax_scale=D ** -0.5, upcast=False)
        bound = 2 * np.abs(naive.astype(np.float64) - ref).max() + 1.6e-2
        for out in (out_direct, out_comb):
            got = cupy.asnumpy(out[b]).astype(np.float64)
            assert not np.isnan(got).any() and np.abs(got - ref).max() <= bound
        np.testing.assert_allclose(lse[b], ref_lse.reshape(lse[b].shape), rtol=1e-3, atol=2e-3)


def _bf16(rng, shape):
    return cupy.asarray(rng.standard_normal(shape).astype(np.float32).astype(BF16))


def test_through_with_kvcache_and_graph_replay():
    """flash_attn_with_kvcache over a scattered page pool with one new token appended per step
    (the append kernel, then the swapped decode), checked against the reference for two steps
    (the second replays the call cache's plan on new arrays); then a step captured in a CUDA
    graph and replayed with new queries equals the eager call."""
    import cupy_flashattn as fa
    from cupy_flashattn.reference import attention_ref

    rng = np.random.default_rng(11)
    B, H, D, P, pages = 3, 32, 128, 16, 70
    lens = np.array([17, 300, 64], np.int32)  # + 3 appended tokens: at most 20 pages a sequence
    k_cache, v_cache = _bf16(rng, (pages, P, 1, D)), _bf16(rng, (pages, P, 1, D))
    table = cupy.asarray(rng.permutation(pages)[: B * 20].reshape(B, 20).astype(np.int32))
    tb = cupy.asnumpy(table)
    for step in range(2):
        q = _bf16(rng, (B, 1, H, D))
        k_new, v_new = _bf16(rng, (B, 1, 1, D)), _bf16(rng, (B, 1, 1, D))
        out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                         cache_seqlens=cupy.asarray(lens + step),
                                         block_table=table)
        kc, vc, qh = cupy.asnumpy(k_cache), cupy.asnumpy(v_cache), cupy.asnumpy(q)
        for b in range(B):
            pos = np.arange(int(lens[b]) + step + 1)
            kb, vb = kc[tb[b, pos // P], pos % P], vc[tb[b, pos // P], pos % P]
            ref = attention_ref(qh[b], kb, vb, softmax_scale=D ** -0.5)
            naive = attention_ref(qh[b], kb, vb, softmax_scale=D ** -0.5, upcast=False)
            got = cupy.asnumpy(out[b]).astype(np.float64)
            assert not np.isnan(got).any()
            bound = 2 * np.abs(naive.astype(np.float64) - ref).max() + 1.6e-2
            assert np.abs(got - ref).max() <= bound
    seqlens = cupy.asarray(lens + 2)
    q = _bf16(rng, (B, 1, H, D))

    def call():
        return fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                          block_table=table)

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        call()  # warm-up on this stream: plan, workspace, memory pool
        stream.synchronize()
        stream.begin_capture()
        out_graph = call()
        graph = stream.end_capture()
        for _ in range(2):
            q[...] = _bf16(rng, q.shape)
            graph.launch(stream)
            expected = call()
            stream.synchronize()
            assert cupy.array_equal(out_graph.view(np.uint16), expected.view(np.uint16))


# -- the cluster merge (FA_SM90_CLUSTER_MERGE, sm90/cluster_merge.cuh) --------------------------

CLUSTER_CASES = {
    # name: make_problem arguments (beyond d); the plan must pick a cluster of `cluster` CTAs
    # (at D = 128; other head dims have other key tiles: a cluster of the plan's split count)
    "ctx4096": (dict(h=32, lens_q=[1], lens_k=[4096], page=16), 16),
    "ctx2048_dense": (dict(h=32, lens_q=[1], lens_k=[2048], page=0), 8),
    "ctx1025_page48": (dict(h=32, lens_q=[1], lens_k=[1025], page=48, num_splits=5), 5),
    "ctx300_split3": (dict(h=48, lens_q=[1], lens_k=[300], page=7, num_splits=3), 3),
    "h160_two_tiles": (dict(h=160, lens_q=[1], lens_k=[1500], page=16), None),
}


@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
@pytest.mark.parametrize("d", [64, 128, 192])
@pytest.mark.parametrize("case", list(CLUSTER_CASES))
def test_cluster_merge(monkeypatch, dt, d, case):
    """Split runs merged inside their thread-block cluster (no partials, no combine launch):
    one sequence, page sizes loaded by box (16) and gathered (7, 48), forced split counts, a
    partial last tile, 48 heads (a partial warpgroup) and 160 (two query tiles, a cluster
    each); out and the LSE against the float64 reference, poisoned with NaN before."""
    kwargs, cluster = CLUSTER_CASES[case]
    rng = np.random.default_rng(d + len(case))
    p = make_problem(rng, dt=dt, d=d, hk=1, **kwargs)
    launch = _launch(p)
    assert launch["combine"] is False and launch["cluster"] == launch["splits"] > 1
    if cluster is not None and (d == 128 or "num_splits" in kwargs):
        assert launch["cluster"] == cluster
    run(p)
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", "FA_SM90_CLUSTER_MERGE=0")  # the A/B baseline
    assert _launch(p)["cluster"] == 1


def test_cluster_merge_of_a_batch_whose_lse_nobody_reads(monkeypatch):
    """Four sequences of different lengths (one shorter than a split's run: its cluster has
    runs without keys), LSE unread: a cluster per sequence, out checked against the reference."""
    from cupy_flashattn import _cuda
    from test_gpu_decode import EPS, problem_ref

    rng = np.random.default_rng(3)
    p = make_problem(rng, d=128, h=32, hk=1, lens_q=[1] * 4, lens_k=[4096, 1, 700, 2049], page=16)
    p.lse_unread = True
    launch = _launch(p)
    assert launch["combine"] is False and launch["cluster"] == launch["splits"] > 1
    _cuda.run_attention(p)
    out = cupy.asnumpy(p.out).astype(np.float64)
    ref, _ = problem_ref(p)
    naive, _ = problem_ref(p, upcast=False)
    assert not np.isnan(out).any()
    bound = 2 * np.abs(naive.astype(np.float64) - ref).max() + EPS[np.dtype(p.q.dtype)]
    assert np.abs(out - ref).max() <= bound
