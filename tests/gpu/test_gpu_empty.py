"""Zero-size inputs on CuPy arrays (issue 10, defect 4): the checks of ``tests/test_empty.py``
(see its docstring) with every array on the GPU.

Empty work -- no query row, or k/v of no row -- must not plan or launch an attention kernel:
besides ``_calls._backend_run``, the kernel getters of the prefill, decode, combine and
rotary/append kernels are replaced with functions that fail the test (the append kernel stays
available where a test appends real tokens).  The "no key" result (out 0, LSE +inf) is then
written by CuPy's own fill, and ``merge_attention_states`` of zero-size states returns without
the combine kernel.  Tests with empty sequences inside a non-empty batch run the real kernels
and compare with the float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import test_empty as E  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def gpu():
    from cupy_flashattn import _cuda

    if not _cuda.is_available():
        pytest.skip("no sm_80+ GPU")


@pytest.fixture(autouse=True)
def fresh_calls():
    """No cached call (and launch plan) from another test serves these signatures."""
    from cupy_flashattn._signature import CALLS

    CALLS.clear()
    yield
    CALLS.clear()


def forbid_kernels(monkeypatch, rope=True):
    """Fail the test if an attention kernel (prefill, decode, combine) -- and, with ``rope``,
    the rotary/append kernel -- is fetched for launch, or the attention backend runs."""
    from cupy_flashattn._cuda import decode, launch

    def fetched(*args, **kwargs):
        raise AssertionError("a CUDA kernel was fetched for empty work")

    E.forbid_backend(monkeypatch)
    monkeypatch.setattr(launch, "get_kernel", fetched)
    monkeypatch.setattr(decode, "_decode_kernel", fetched)
    monkeypatch.setattr(decode, "_combine_kernel", fetched)
    monkeypatch.setattr(decode, "merge_states", fetched)
    if rope:
        monkeypatch.setattr(decode, "_rope_kernel", fetched)


def synced(fn, *args):
    fn(cp, *args)
    cp.cuda.get_current_stream().synchronize()  # surface an asynchronous launch error here


# -- no query row -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", E.GPU_DTYPES, ids=str)
@pytest.mark.parametrize("B,Sq,Sk", E.DENSE_NO_QUERIES)
def test_gpu_dense_no_queries(monkeypatch, dtype, B, Sq, Sk):
    forbid_kernels(monkeypatch)
    synced(E.check_dense_no_queries, dtype, B, Sq, Sk)


@pytest.mark.parametrize("dtype", E.GPU_DTYPES, ids=str)
def test_gpu_varlen_no_queries(monkeypatch, dtype):
    forbid_kernels(monkeypatch)
    synced(E.check_varlen_no_queries, dtype)


@pytest.mark.parametrize("dtype", E.GPU_DTYPES, ids=str)
def test_gpu_kvcache_no_queries(monkeypatch, dtype):
    forbid_kernels(monkeypatch)
    synced(E.check_kvcache_no_queries, dtype)


@pytest.mark.parametrize("dtype", [E.F16, E.BF16], ids=str)
def test_gpu_kvcache_sq0_still_appends(monkeypatch, dtype):
    forbid_kernels(monkeypatch, rope=False)  # the append of the new tokens is real work
    synced(E.check_kvcache_sq0_still_appends, dtype)


@pytest.mark.parametrize("dtype", E.GPU_DTYPES, ids=str)
def test_gpu_paged_cache_without_sequences(monkeypatch, dtype):
    E.forbid_backend(monkeypatch)  # the setup appends (then frees) a sequence: rope allowed
    synced(E.check_paged_cache_without_sequences, dtype)


@pytest.mark.parametrize("dtype", E.GPU_DTYPES, ids=str)
@pytest.mark.parametrize("out_shape,lse_shape", E.MERGE_SHAPES)
def test_gpu_merge_empty(monkeypatch, dtype, out_shape, lse_shape):
    forbid_kernels(monkeypatch)
    synced(E.check_merge_empty, dtype, out_shape, lse_shape)


def test_gpu_merge_empty_float64(monkeypatch):
    forbid_kernels(monkeypatch)
    synced(E.check_merge_empty, E.F64, (0, E.H, E.D), (E.H, 0))


# -- no key row ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", E.GPU_DTYPES, ids=str)
def test_gpu_dense_no_keys(monkeypatch, dtype):
    forbid_kernels(monkeypatch)
    synced(E.check_dense_no_keys, dtype)


@pytest.mark.parametrize("dtype", [E.F16, E.BF16], ids=str)
def test_gpu_varlen_no_keys(monkeypatch, dtype):
    forbid_kernels(monkeypatch)
    synced(E.check_varlen_no_keys, dtype)


@pytest.mark.parametrize("dtype", [E.F16, E.F32], ids=str)
def test_gpu_kvcache_no_keys(monkeypatch, dtype):
    forbid_kernels(monkeypatch)
    synced(E.check_kvcache_no_keys, dtype)


@pytest.mark.parametrize("dtype", [E.F16, E.BF16], ids=str)
def test_gpu_no_key_results_from_the_call_cache(monkeypatch, dtype):
    """The second identical call is served from the call cache (signature -> execute) and
    still writes 0 / +inf into a fresh poisoned out without any kernel."""
    from cupy_flashattn._signature import CALLS

    forbid_kernels(monkeypatch)
    q = cp.asarray(np.ones((2, 3, E.H, E.D), dtype))
    k = E.zeros(cp, (2, 0, E.HK, E.D), dtype)
    for i in range(2):
        out = E.poisoned(cp, q.shape, dtype)
        res, lse = E.fa.flash_attn_func(q, k, k, out=out, return_softmax_lse=True)
        assert res is out
        E.assert_no_key(res, lse)
    assert CALLS.hits >= 1


# -- empty sequences inside a batch: real kernels, against the reference -------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_gpu_varlen_empty_sequences(paged, causal):
    synced(E.check_varlen_empty_sequences, paged, causal)


@pytest.mark.parametrize("layout", ["contiguous", "paged", "cache"])
def test_gpu_kvcache_empty_cache_with_new_tokens(layout):
    synced(E.check_kvcache_empty_cache_with_new_tokens, layout)


# -- genuinely bad zero extents stay typed errors ------------------------------------------------


@pytest.mark.parametrize("layout", E.LAYOUTS)
def test_gpu_bad_zero_extents_stay_typed(monkeypatch, layout):
    forbid_kernels(monkeypatch)
    E.check_bad_zero_extents(cp, layout)


def test_gpu_bad_zero_pages_cu_seqlens_and_merge(monkeypatch):
    forbid_kernels(monkeypatch)
    E.check_bad_zero_paged_and_cu(cp)
