"""PerStream (cupy_flashattn/_cuda/per_stream.py): one value per CUDA stream, made on first use.

CPU test: a stand-in for cupy.cuda's current stream; the plans' own use of it is covered by
tests/test_decode_sm90_plan.py (CPU) and tests/gpu/test_gpu_frontend.py (back-to-back calls on
two streams)."""

import sys
import types

from cupy_flashattn._cuda.per_stream import PerStream


def _fake_cupy(monkeypatch):
    current = {"ptr": 1}
    cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=current["ptr"]))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    return current


def test_one_value_per_stream_made_once(monkeypatch):
    current = _fake_cupy(monkeypatch)
    made = []
    buffers = PerStream(lambda: made.append(object()) or made[-1])
    a = buffers.get()
    assert buffers.get() is a and len(made) == 1  # the same stream: kept, not made again
    current["ptr"] = 2
    b = buffers.get()
    assert b is not a and len(made) == 2  # another stream: its own
    current["ptr"] = 1
    assert buffers.get() is a and len(made) == 2
