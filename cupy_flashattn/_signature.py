"""The per-signature cache of validated calls: what makes a repeated call cost microseconds.

Everything a call decides on the host -- validation of shapes, dtypes, strides and flags, the
normalized problem, the kernel, its grid, split count and packed arguments -- depends only on
the *signature* of its arguments: for each CuPy array its shape, strides, dtype, device and
whether its address is 16-byte aligned; for every other argument its value; and the current
device; a CuPy array passed where a scalar could be (the float8 scales) counts by its layout,
as an array does.  ``api.py`` keys a
small LRU cache by that signature; a hit skips straight to execution (allocate the outputs,
rebind pointers, launch), a miss runs the full validation and stores the result.

Only calls whose arrays are all CuPy arrays (or None) and that ask for no value checks
(``check=False``, the default) are cached: value checks read index arrays on the host, and
NumPy calls run the CPU backend, whose cost is the computation itself.  Invalid calls raise
during validation and are never stored.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

__all__ = ["signature", "CallCache", "CALLS"]

_CUPY_NDARRAY = None
_GET_DEVICE = None  # cupy.cuda.runtime.getDevice
_SCALARS = frozenset((int, float, bool, str, type(None), np.int32, np.int64, np.float32,
                      np.float64, np.bool_))
_SCALARS_OR_TUPLE = _SCALARS | {tuple}


def _ndarray_type():
    global _CUPY_NDARRAY, _GET_DEVICE
    if _CUPY_NDARRAY is None:
        try:
            import cupy

            _CUPY_NDARRAY, _GET_DEVICE = cupy.ndarray, cupy.cuda.runtime.getDevice
        except Exception:  # no CuPy: nothing is ever cached
            _CUPY_NDARRAY = type("_NoCupy", (), {})
    return _CUPY_NDARRAY


#: What else picks the kernel a plan holds, so part of every key: the prefill family a caller
#: forced (``_cuda.launch.force_prefill_arch``; None: auto) and the float32 mode
#: (``precision.set_float32_precision``).
PLAN_VARIANT = [None, "highest"]


def signature(arrays, scalars):
    """A hashable signature of one call, or None when the call must not be cached (an array
    argument that is not a CuPy array or None, or a scalar of an unexpected type)."""
    nd = _ndarray_type()
    sig = []
    for a in arrays:
        if a is None:
            sig.append(None)
        elif type(a) is nd:
            mem = a.data
            sig.append((a.shape, a.strides, a.dtype, mem.device_id, mem.ptr & 15 == 0))
        else:
            return None
    scalar_key = _scalar_key(scalars, nd)
    if scalar_key is None:
        return None
    sig.append(scalar_key)
    # The current device is part of the key: a plan holds kernel functions (and launch
    # parameters) loaded on the device that was current when it was made.  Asked only once
    # an array was seen to be a CuPy array (without a GPU the call would raise).
    if _GET_DEVICE is None:
        return None
    sig.append(_GET_DEVICE())
    sig.append(tuple(PLAN_VARIANT))
    return tuple(sig)


def _scalar_key(scalars, nd):
    """The scalars and their types, or None when the call must not be cached (a value of
    another type).  Types are kept so that True and 1 (equal in Python) stay distinct:
    validation treats them differently (a bool window is an error).  Tuples (window_size) keep
    their elements' types; a CuPy array in a scalar's place (the float8 scales, read on the
    device per call) counts by its layout, as an array does.  The common case -- plain values
    and one tuple -- costs a few C-level passes over the tuple, no per-value Python loop."""
    types = tuple(map(type, scalars))
    if _SCALARS.issuperset(types):
        return scalars, types
    if _SCALARS_OR_TUPLE.issuperset(types):
        # The tuples' element types, in order (the values say how many each tuple has).
        inner = [tuple(map(type, s)) for s in scalars if type(s) is tuple]
        for t in inner:
            if not _SCALARS.issuperset(t):
                return None
        return scalars, types, tuple(inner)
    values = []
    for s, t in zip(scalars, types):
        if t is nd:
            s = (nd, s.shape, s.strides, s.dtype, s.data.device_id)
        elif t is tuple:
            if not _SCALARS.issuperset(map(type, s)):
                return None
            t = tuple(map(type, s))
        elif t not in _SCALARS:
            return None
        values.append((t, s))
    return tuple(values)


class CallCache:
    """A bounded LRU map signature -> prepared call (one per distinct call site shape; a decode
    loop over growing caches keeps a handful)."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._items: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key):
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return item

    def put(self, key, value) -> None:
        self._items[key] = value
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


#: The process-wide cache used by the public functions.
CALLS = CallCache()
