"""merge_attention_states: attention over A u B from the attention over A and over B."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupy_flashattn.errors import DeviceError, DTypeError, ShapeError
from cupy_flashattn.merge import merge_attention_states
from cupy_flashattn.reference import attention_ref


def _problem(rng, batch, Sq, Sk, H, Hk, D, dtype=np.float64):
    """Dense q (B, Sq, H, D), k/v (B, Sk, Hk, D), scaled so softmax is far from uniform."""
    q = (rng.standard_normal((batch, Sq, H, D)) * 2).astype(dtype)
    k = rng.standard_normal((batch, Sk, Hk, D)).astype(dtype)
    v = rng.standard_normal((batch, Sk, Hk, D)).astype(dtype)
    return q, k, v


def _split(rng, Sk):
    """A random partition of the key positions into two disjoint (possibly empty) sets."""
    in_a = rng.random(Sk) < rng.random()
    return np.flatnonzero(in_a), np.flatnonzero(~in_a)


def _parts(q, k, v, keys_a, keys_b):
    out_a, lse_a = attention_ref(q, k[:, keys_a], v[:, keys_a], return_lse=True)
    out_b, lse_b = attention_ref(q, k[:, keys_b], v[:, keys_b], return_lse=True)
    return out_a, lse_a, out_b, lse_b


@pytest.mark.parametrize("seed", range(8))
def test_dense_layout_matches_union(seed):
    rng = np.random.default_rng(seed)
    B, Sq, Sk = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(2, 40))
    Hk = int(rng.integers(1, 3))
    H, D = Hk * int(rng.integers(1, 4)), int(rng.choice([4, 16, 32]))
    q, k, v = _problem(rng, B, Sq, Sk, H, Hk, D)
    keys_a, keys_b = _split(rng, Sk)
    out_a, lse_a, out_b, lse_b = _parts(q, k, v, keys_a, keys_b)
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    ref_out, ref_lse = attention_ref(q, k, v, return_lse=True)
    assert out.shape == (B, Sq, H, D) and lse.shape == (B, H, Sq)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_varlen_layout_matches_union(seed):
    """(total, H, D) / (H, total): merge sequences packed back to back, float32 LSE as
    flash-attn returns it."""
    rng = np.random.default_rng(100 + seed)
    H, Hk, D = 4, 2, 16
    outs, lses, refs, ref_lses = [[], []], [[], []], [], []
    for _ in range(3):
        Sq, Sk = int(rng.integers(1, 6)), int(rng.integers(1, 30))
        q, k, v = (a[0] for a in _problem(rng, 1, Sq, Sk, H, Hk, D, np.float32))
        keys = _split(rng, Sk)
        for part, idx in enumerate(keys):
            o, l = attention_ref(q, k[idx], v[idx], return_lse=True)
            outs[part].append(o.astype(np.float32))
            lses[part].append(l.astype(np.float32))
        o, l = attention_ref(q, k, v, return_lse=True)
        refs.append(o)
        ref_lses.append(l)
    out, lse = merge_attention_states(
        np.concatenate(outs[0]), np.concatenate(lses[0], axis=1),
        np.concatenate(outs[1]), np.concatenate(lses[1], axis=1),
    )
    assert out.dtype == np.float32 and lse.dtype == np.float32
    np.testing.assert_allclose(out, np.concatenate(refs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, np.concatenate(ref_lses, axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_precision_inputs(dtype):
    rng = np.random.default_rng(7)
    q, k, v = _problem(rng, 2, 5, 33, 4, 4, 32)
    keys_a, keys_b = np.arange(0, 33, 2), np.arange(1, 33, 2)
    out_a, lse_a, out_b, lse_b = _parts(q, k, v, keys_a, keys_b)
    out, lse = merge_attention_states(
        out_a.astype(dtype), lse_a.astype(np.float32), out_b.astype(dtype), lse_b.astype(np.float32)
    )
    assert out.dtype == np.dtype(dtype) and lse.dtype == np.float32
    ref_out, ref_lse = attention_ref(q, k, v, return_lse=True)
    # Inputs rounded to dtype, merged in float32, rounded once: a few ulps of dtype.
    tol = 2e-3 if dtype == np.float16 else 2e-2
    np.testing.assert_allclose(out.astype(np.float64), ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("empty_lse", [np.inf, -np.inf])
@pytest.mark.parametrize("empty_side", ["a", "b"])
def test_empty_partial_contributes_nothing(empty_lse, empty_side):
    rng = np.random.default_rng(8)
    q, k, v = _problem(rng, 2, 3, 10, 2, 1, 8)
    out_full, lse_full = attention_ref(q, k, v, return_lse=True)
    garbage = np.full_like(out_full, np.nan)  # an empty part's out must not leak in
    empty_lse_arr = np.full_like(lse_full, empty_lse)
    if empty_side == "a":
        out, lse = merge_attention_states(garbage, empty_lse_arr, out_full, lse_full)
    else:
        out, lse = merge_attention_states(out_full, lse_full, garbage, empty_lse_arr)
    np.testing.assert_allclose(out, out_full, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(lse, lse_full, rtol=1e-14)


def test_empty_set_through_reference():
    """A key set of size 0 computed by the reference (+inf LSE, zero output)."""
    rng = np.random.default_rng(9)
    q, k, v = _problem(rng, 1, 4, 12, 2, 2, 8)
    out_a, lse_a, out_b, lse_b = _parts(q, k, v, np.arange(12), np.arange(0))
    assert np.all(np.isposinf(lse_b))
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_array_equal(out, out_a)
    np.testing.assert_array_equal(lse, lse_a)


def test_both_empty_gives_zero_and_plus_inf():
    out_a = np.full((3, 2, 4), np.nan, np.float32)
    lse_a = np.array([[np.inf, -np.inf, np.inf], [-np.inf, np.inf, np.inf]], np.float32)
    out, lse = merge_attention_states(out_a, lse_a, out_a.copy(), lse_a[:, ::-1].copy())
    np.testing.assert_array_equal(out, 0)
    assert np.all(np.isposinf(lse)) and lse.dtype == np.float32


def test_rows_empty_in_one_part_only():
    """Causal masks make some rows empty in one part: each row picks the part that saw keys."""
    rng = np.random.default_rng(10)
    q, k, v = _problem(rng, 1, 6, 6, 2, 2, 8)
    # Prefix keys 0..2 and suffix keys 3..5 of a causal problem (bottom-right alignment with
    # Sq == Sk, so query i sees keys <= i).  Query rows 0..2 see no suffix key.
    ref_out, ref_lse = attention_ref(q, k, v, causal=True, return_lse=True)
    out_a, lse_a = attention_ref(q, k[:, :3], v[:, :3], window_size=(-1, 3), return_lse=True)
    # Suffix part: query i sees suffix key j (absolute 3 + j) iff 3 + j <= i, which is what
    # bottom-right causal alignment gives with Sk = 3 < Sq = 6.
    out_b, lse_b = attention_ref(q, k[:, 3:], v[:, 3:], causal=True, return_lse=True)
    assert np.all(np.isposinf(lse_b[..., :3])) and np.all(np.isfinite(lse_b[..., 3:]))
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_large_lse_is_stable():
    out_a = np.ones((1, 1, 2), np.float32)
    out_b = np.full((1, 1, 2), 3.0, np.float32)
    lse_a = np.array([[1000.0]], np.float32)
    lse_b = np.array([[1000.0 + np.log(3.0)]], np.float32)  # weights 1/4 and 3/4
    # float32 stores 1000 + log 3 to 3e-5 absolute, which moves the weights by as much.
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_allclose(out, 2.5, rtol=1e-4)
    np.testing.assert_allclose(lse, 1000.0 + np.log(4.0), rtol=1e-6)
    lse_b = np.array([[-1000.0 + np.log(3.0)]], np.float32)  # exp(-1000) underflows naively
    out, lse = merge_attention_states(out_a, -lse_a, out_b, lse_b)
    np.testing.assert_allclose(out, 2.5, rtol=1e-4)
    np.testing.assert_allclose(lse, -1000.0 + np.log(4.0), rtol=1e-6)


def test_does_not_modify_inputs():
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal((4, 2, 8)), rng.standard_normal((2, 4)),
              rng.standard_normal((4, 2, 8)), rng.standard_normal((2, 4))]
    copies = [a.copy() for a in arrays]
    merge_attention_states(*arrays)
    for a, c in zip(arrays, copies):
        np.testing.assert_array_equal(a, c)


# -- errors -----------------------------------------------------------------------------------


def _ok():
    return np.zeros((5, 2, 8), np.float16), np.zeros((2, 5), np.float32)


def _assert_explained(info, *parts):
    msg = str(info.value)
    assert "expected" in msg and "got" in msg and "Fix:" in msg, msg
    for part in parts:
        assert part in msg, msg


def test_shape_errors():
    out, lse = _ok()
    with pytest.raises(ShapeError) as info:
        merge_attention_states(out, lse, out[:4], lse)
    _assert_explained(info, "out_b", "(5, 2, 8)", "(4, 2, 8)")
    with pytest.raises(ShapeError) as info:
        merge_attention_states(out, lse.T.copy(), out, lse)
    _assert_explained(info, "lse_a", "(H, total)", "lse.T")
    with pytest.raises(ShapeError) as info:
        merge_attention_states(out[None], lse, out[None], lse)
    _assert_explained(info, "lse_a", "(B, H, S)", "(1, 2, 5)")
    with pytest.raises(ShapeError) as info:
        merge_attention_states(out[0], lse, out[0], lse)
    _assert_explained(info, "out_a", "rank 3 or 4")


def test_dtype_and_type_errors():
    out, lse = _ok()
    with pytest.raises(DTypeError) as info:
        merge_attention_states(out, lse, out.astype(np.float32), lse)
    _assert_explained(info, "out_b", "float16", "float32")
    with pytest.raises(DTypeError) as info:
        merge_attention_states(out, lse.astype(np.float16), out, lse)
    _assert_explained(info, "lse_a", "float32")
    with pytest.raises(DTypeError) as info:
        merge_attention_states(out.astype(np.int32), lse, out.astype(np.int32), lse)
    _assert_explained(info, "out_a")
    with pytest.raises(DTypeError) as info:
        merge_attention_states(out, lse.tolist(), out, lse)
    _assert_explained(info, "lse_a", "list")


def test_mixed_libraries_are_refused():
    cupy = pytest.importorskip("cupy")
    try:
        on_gpu = cupy.asarray(np.zeros((2, 5), np.float32))
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no usable CUDA device")
    out, lse = _ok()
    with pytest.raises(DeviceError):
        merge_attention_states(out, lse, out, on_gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_cupy_matches_numpy(dtype):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(30)
    q, k, v = _problem(rng, 2, 7, 12, 4, 2, 16)
    out_a, lse_a = attention_ref(q, k[:, :5], v[:, :5], causal=True, return_lse=True)
    out_b, lse_b = attention_ref(q, k[:, 5:], v[:, 5:], causal=True, return_lse=True)
    lse_a, lse_b = lse_a.astype(np.float32), lse_b.astype(np.float32)
    args = [out_a.astype(dtype), lse_a, out_b.astype(dtype), lse_b]
    host_out, host_lse = merge_attention_states(*args)
    dev_out, dev_lse = merge_attention_states(*[cp.asarray(a) for a in args])
    assert isinstance(dev_out, cp.ndarray) and dev_out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(cp.asnumpy(dev_out).astype(np.float32), host_out.astype(np.float32),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(cp.asnumpy(dev_lse), host_lse, rtol=1e-6)
    assert np.array_equal(np.isposinf(cp.asnumpy(dev_lse)), np.isposinf(host_lse))
