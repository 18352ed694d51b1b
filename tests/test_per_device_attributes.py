"""Per-device kernel attributes (issue 10, defect 7), without a GPU.

CuPy keeps one loaded function per device, and ``max_dynamic_shared_size_bytes`` is an attribute
of that function, so a kernel that needs more than 48 KB of dynamic shared memory must get the
attribute on EVERY device it is launched on, not only on the first one.
``cupy_flashattn._cuda.compile.load_function`` caches the module and the function per
``(cache_key, device_id)``; these tests replace ``cupy`` by a fake that records which device
was current when each module was built, each function fetched and each attribute set, and check:

* two device ids give two functions, each with the attribute set while its own device was
  current (and a module built per device: the devices may differ in architecture);
* repeated calls on a device reuse its module and function (no rebuild, no second set);
* ``device_id=None`` means the current device;
* kernels within 48 KB leave the attribute alone;
* the real entry points (prefill ``get_kernel``, decode ``_decode_kernel``) behave the same, and
  a call signature (the cache key of a whole launch plan) includes the current device.
"""

from __future__ import annotations

import sys
import types

import pytest

from cupy_flashattn._cuda import compile as cc
from cupy_flashattn._cuda import decode as dc

LIMIT = 48 * 1024


class FakeCupy:
    """Just what ``load_function`` (and ``_signature``) use of cupy, with a switchable current
    device and a log of everything built."""

    def __init__(self):
        self.current = 0
        self.modules = []  # FakeRawModule, in creation order
        fake = self

        class Runtime:
            @staticmethod
            def getDevice():
                return fake.current

        class Device:
            def __init__(self, device_id=None):
                self.id = fake.current if device_id is None else int(device_id)

            def __enter__(self):
                self._prev = fake.current
                fake.current = self.id
                return self

            def __exit__(self, *exc):
                fake.current = self._prev
                return False

        class FakeFunction:
            def __init__(self, module, name):
                self.module, self.name = module, name
                self.device = fake.current  # where CuPy would load it
                self.sets = []  # (value, device current at the time)
                self._smem = 0

            @property
            def max_dynamic_shared_size_bytes(self):
                return self._smem

            @max_dynamic_shared_size_bytes.setter
            def max_dynamic_shared_size_bytes(self, value):
                self.sets.append((int(value), fake.current))
                self._smem = int(value)

        class FakeRawModule:
            def __init__(self, code=None, options=(), **kwargs):
                self.code, self.options = code, tuple(options)
                self.device = fake.current
                self.functions = []
                fake.modules.append(self)

            def get_function(self, name):
                fn = FakeFunction(self, name)
                self.functions.append(fn)
                return fn

        self.ndarray = type("FakeNdarray", (), {})
        self.cuda = types.SimpleNamespace(runtime=Runtime, Device=Device)
        self.RawModule = FakeRawModule


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    # Fresh per-device caches: nothing loaded by another test (or a real GPU) leaks in.
    monkeypatch.setattr(cc, "_MODULES", {})
    monkeypatch.setattr(cc, "_FUNCTIONS", {})
    monkeypatch.setattr(cc, "_COMPILED", [])
    return fake


class Source:
    """make_source that counts its calls."""

    def __init__(self, text="extern \"C\" __global__ void k() {}"):
        self.text, self.calls = text, 0

    def __call__(self):
        self.calls += 1
        return self.text


def _assert_attribute_set_on_own_device(fn, smem, device):
    assert fn.device == device, f"function loaded on device {fn.device}, expected {device}"
    assert fn.module.device == device, "module built while another device was current"
    assert fn.max_dynamic_shared_size_bytes == smem
    assert fn.sets == [(smem, device)], f"attribute sets {fn.sets}, expected once on {device}"


def test_two_devices_get_two_functions_each_with_the_attribute(fake_cupy):
    smem = 100 * 1024
    src = Source()
    f0 = cc.load_function(("t", 1), src, "k", smem, device_id=0)
    f1 = cc.load_function(("t", 1), src, "k", smem, device_id=1)
    assert f0 is not f1
    _assert_attribute_set_on_own_device(f0, smem, 0)
    _assert_attribute_set_on_own_device(f1, smem, 1)
    # One module per device (the code's intent: devices may differ in architecture; CuPy's
    # disk cache serves the second build), each from the same source and NVRTC options.
    assert [m.device for m in fake_cupy.modules] == [0, 1]
    assert src.calls == 2
    assert all(m.code == src.text and m.options == tuple(cc.NVRTC_OPTIONS)
               for m in fake_cupy.modules)
    # Loading for a device restores the caller's current device.
    assert fake_cupy.current == 0


def test_repeated_calls_reuse_module_and_function_per_device(fake_cupy):
    smem = 64 * 1024
    src = Source()
    first = {d: cc.load_function("key", src, "k", smem, device_id=d) for d in (0, 1, 0, 1)}
    again = {d: cc.load_function("key", src, "k", smem, device_id=d) for d in (1, 0)}
    assert again == first
    assert len(fake_cupy.modules) == 2 and src.calls == 2
    for d, fn in first.items():
        _assert_attribute_set_on_own_device(fn, smem, d)  # still set exactly once
        assert len(fn.module.functions) == 1


def test_default_device_is_the_current_one(fake_cupy):
    smem = 80 * 1024
    fake_cupy.current = 1
    f1 = cc.load_function("key", Source(), "k", smem)
    assert fake_cupy.current == 1
    _assert_attribute_set_on_own_device(f1, smem, 1)
    fake_cupy.current = 0
    f0 = cc.load_function("key", Source(), "k", smem)
    assert f0 is not f1
    _assert_attribute_set_on_own_device(f0, smem, 0)
    # An explicit id equal to the current device hits the same cache entry.
    assert cc.load_function("key", Source(), "k", smem, device_id=0) is f0


@pytest.mark.parametrize("smem", [0, 1024, LIMIT])
def test_small_kernels_leave_the_attribute_alone(fake_cupy, smem):
    fns = [cc.load_function("small", Source(), "k", smem, device_id=d) for d in (0, 1)]
    assert fns[0] is not fns[1]
    for fn in fns:
        assert fn.sets == []


def test_distinct_cache_keys_are_distinct_modules(fake_cupy):
    a = cc.load_function("a", Source(), "k", 0, device_id=0)
    b = cc.load_function("b", Source(), "k", 0, device_id=0)
    assert a is not b and a.module is not b.module


def _big_prefill_key():
    for d in cc.HEAD_DIM_BUCKETS:
        if cc.traits(d).smem_bytes > LIMIT:
            return cc.KernelKey("bf16", d, paged=True)
    pytest.skip("no prefill bucket needs more than 48 KB of shared memory")


def test_prefill_get_kernel_on_a_second_device(fake_cupy):
    key = _big_prefill_key()
    smem = cc.traits(key.head_dim).smem_bytes
    f0 = cc.get_kernel(key)
    fake_cupy.current = 1
    f1 = cc.get_kernel(key)
    assert f0 is not f1 and f0.name == f1.name == key.name
    _assert_attribute_set_on_own_device(f0, smem, 0)
    _assert_attribute_set_on_own_device(f1, smem, 1)
    assert key.name in fake_cupy.modules[0].code  # the generated entry point is in the source
    assert cc.get_kernel(key) is f1  # cached on device 1
    fake_cupy.current = 0
    assert cc.get_kernel(key) is f0
    assert len(fake_cupy.modules) == 2
    assert cc.compiled_kernels() == [key]


def test_decode_kernel_on_a_second_device(fake_cupy):
    key = dc.DecodeKey("bf16", 128)
    smem = dc.smem_bytes(128)
    assert smem > LIMIT, "the D = 128 decode kernel is expected to need > 48 KB"
    f0 = dc._decode_kernel(key)
    fake_cupy.current = 1
    f1 = dc._decode_kernel(key)
    assert f0 is not f1
    _assert_attribute_set_on_own_device(f0, smem, 0)
    _assert_attribute_set_on_own_device(f1, smem, 1)
    # The combine and rotary/append kernels use static shared memory only.
    for fn in (dc._combine_kernel(), dc._rope_kernel()):
        assert fn.device == 1 and fn.sets == []


def test_call_signature_includes_the_current_device(fake_cupy, monkeypatch):
    """A cached call holds kernels of the device current when it was made, so its cache key must
    change with the device (else a plan made on GPU 0 would launch GPU 0's function on GPU 1)."""
    from cupy_flashattn import _signature

    monkeypatch.setattr(_signature, "_CUPY_NDARRAY", None)
    monkeypatch.setattr(_signature, "_GET_DEVICE", None)
    arr = fake_cupy.ndarray()
    arr.shape, arr.strides, arr.dtype = (2, 3), (12, 4), "float32"
    arr.data = types.SimpleNamespace(device_id=0, ptr=4096)
    sig0 = _signature.signature((arr, None), (1.0, (-1, -1)))
    fake_cupy.current = 1
    sig1 = _signature.signature((arr, None), (1.0, (-1, -1)))
    assert sig0 is not None and sig1 is not None
    assert sig0 != sig1
    fake_cupy.current = 0
    assert _signature.signature((arr, None), (1.0, (-1, -1))) == sig0
