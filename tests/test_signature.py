"""The call cache's key (cupy_flashattn/_signature.py) and the per-execution problem of a cached
call (_calls.py, problem.AttentionProblem.from_fields), without a GPU: a stand-in array type
plays CuPy's ndarray.

A key must tell apart every pair of calls that validation or the kernels treat differently --
True and 1, (True, -1) and (1, -1), 1.0 and 1 are equal in Python -- and must be None for a
value the cache does not know (such calls are validated every time)."""

import types

import numpy as np
import pytest

from cupy_flashattn import _calls, _signature
from cupy_flashattn.problem import AttentionProblem


class _Arr:
    def __init__(self, shape=(2, 3), ptr=4096):
        self.shape, self.dtype = shape, np.dtype(np.float32)
        self.strides = (4 * shape[1], 4)
        self.data = types.SimpleNamespace(device_id=0, ptr=ptr)


@pytest.fixture
def cupy_like(monkeypatch):
    monkeypatch.setattr(_signature, "_CUPY_NDARRAY", _Arr)
    monkeypatch.setattr(_signature, "_GET_DEVICE", lambda: 0)
    return _Arr


def _key(arrays, scalars):
    key = _signature.signature(arrays, scalars)
    assert key is None or hash(key) is not None
    return key


@pytest.mark.parametrize("a, b", [
    ((True,), (1,)),
    ((1.0,), (1,)),
    ((np.float32(0.5),), (0.5,)),
    (((True, -1),), ((1, -1),)),
    (((1.0, -1),), ((1, -1),)),
    (((-1, -1), 0.0), ((-1, -1), False)),
    ((None, (-1, -1)), ((-1, -1), None)),
])
def test_values_equal_in_python_get_distinct_keys(cupy_like, a, b):
    arrays = (cupy_like(), None)
    ka, kb = _key(arrays, a), _key(arrays, b)
    assert ka is not None and kb is not None and ka != kb


def test_same_call_same_key_and_layout_changes_the_key(cupy_like):
    scalars = (0.0, None, False, (-1, -1), 0.0)
    k1 = _key((cupy_like(), None), scalars)
    assert k1 == _key((cupy_like(ptr=8192), None), scalars)  # another aligned address
    assert k1 != _key((cupy_like(ptr=8194), None), scalars)  # not 16-byte aligned
    assert k1 != _key((cupy_like(shape=(3, 3)), None), scalars)
    assert k1 != _key((None, cupy_like()), scalars)


def test_device_arrays_in_scalar_places_count_by_layout(cupy_like):
    """The float8 scales may be device arrays read per call: their layout is the key, not the
    object (a new array of the same layout hits the cache)."""
    k1 = _key((cupy_like(),), (1.0, cupy_like(shape=(4, 1))))
    assert k1 is not None
    assert k1 == _key((cupy_like(),), (1.0, cupy_like(shape=(4, 1), ptr=1 << 20)))
    assert k1 != _key((cupy_like(),), (1.0, cupy_like(shape=(8, 1))))
    assert k1 != _key((cupy_like(),), (1.0, 1.0))


@pytest.mark.parametrize("scalars", [
    ([1, 2],), ((1, [2]),), (object(),), ((1, object()),), (np.array(1.0),),
])
def test_unknown_values_are_not_cached(cupy_like, scalars):
    assert _key((cupy_like(),), scalars) is None


def test_non_cupy_arrays_are_not_cached(cupy_like):
    assert _key((np.zeros((2, 3), np.float32),), (1.0,)) is None


def _fields():
    return dict(batch_size=2, seqlen_q=3, seqlen_k=5, max_seqlen_q=3, max_seqlen_k=5,
                softmax_scale=0.25, window_left=-1, window_right=0)


def test_from_fields_equals_the_constructor():
    arrays = dict(q=object(), k=object(), v=object(), out=object(), softmax_lse=object())
    built = AttentionProblem(**arrays, **_fields())
    fixed = {k: v for k, v in built.__dict__.items() if k not in arrays}
    again = AttentionProblem.from_fields(fixed, arrays)
    assert again == built and type(again) is AttentionProblem
    assert again.is_causal and again.paged is False


def test_a_cached_call_does_not_keep_its_first_arrays():
    """The call keeps the fixed fields of its first execution, not that execution's arrays (a
    cached call would otherwise hold the first output alive)."""
    call = _calls._Call(np, _fields(), num_heads=1, head_dim=4, return_lse=False, query_rows=6,
                        key_rows=10)
    first = dict(q=object(), k=object(), v=object(), out=object(), softmax_lse=object())
    p1 = call._problem(first)
    assert all(p1.__dict__[name] is a for name, a in first.items())
    assert not set(first) & set(call._problem_fields)
    second = {name: object() for name in first}
    p2 = call._problem(second)
    assert all(p2.__dict__[name] is a for name, a in second.items())
    assert p2.softmax_scale == 0.25 and p2.lse_unread is True
