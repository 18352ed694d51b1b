"""Device buffers a launch plan keeps per CUDA stream (split partials, tile counters, planes).

A plan is replayed by every call of its signature (the front end's call cache), and its
kernels need scratch memory: split-KV partials, a dynamic schedule's tile counter, the float32
kernel's planes.  Allocating them per call cost ~9 us of a ~60 us decode call on the H200
machine (two cupy.empty calls), so a plan makes them once per CUDA stream and reuses them:
calls on one stream run in order, so a call's kernels are done with the buffers before the
next call's kernels on that stream touch them; another stream gets its own set.  A CUDA graph
captured with them keeps valid addresses for as long as the plan lives (the call cache holds
it), unlike pool memory freed after the capture.  Counters the kernels leave zeroed for the
next launch (sm90/tile_scheduler.cuh, the fused combine's) are zeroed once, by ``make``."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

__all__ = ["PerStream"]

T = TypeVar("T")


class PerStream(Generic[T]):
    """``get()``: the current CUDA stream's value, made by ``make()`` on that stream's first
    ``get`` (so outside a graph capture when the first call runs eagerly) and kept."""

    __slots__ = ("_make", "_by_stream")

    def __init__(self, make: Callable[[], T]):
        self._make = make
        self._by_stream: dict = {}

    def get(self) -> T:
        import cupy

        key = cupy.cuda.get_current_stream().ptr
        value = self._by_stream.get(key)
        if value is None:
            value = self._by_stream[key] = self._make()
        return value
