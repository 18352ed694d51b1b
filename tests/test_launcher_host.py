"""The host side of a replayed launch (``_cuda/launcher.py``) without a GPU: the driver call is
replaced by a recorder, so what a call writes into the struct and hands to cuLaunchKernel is
checked on the CPU -- pointer rebinding for every kernel, plus the per-call TMA maps of the
sm90 ones (``TmaLaunch``)."""

import ctypes

import pytest

from cupy_flashattn._cuda import launcher
from cupy_flashattn._cuda.compile import FWD_ARGS, SM90_ARGS


class _Arr:
    def __init__(self, ptr):
        self.data = type("Mem", (), {"ptr": ptr})()


class _Kernel:
    kernel = type("Fn", (), {"ptr": 0xF00D})()


@pytest.fixture
def recorder(monkeypatch):
    calls = []

    def launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        words_addr = ctypes.c_uint64.from_address(params).value  # kernelParams[0]
        calls.append(dict(fn=fn, dims=(gx, gy, gz, bx, by, bz), smem=smem, stream=stream,
                          words=words_addr))

    monkeypatch.setattr(launcher, "_LAUNCH_KERNEL", launch)
    monkeypatch.setattr(launcher, "_CURRENT_STREAM", lambda: type("S", (), {"ptr": 7})())
    return calls


def _values(pack):
    return {n: (None if n in FWD_ARGS.pointer_words else 0) for n in FWD_ARGS.names} | {"head_dim": 64}


def test_launch_rebinds_pointers_per_call(recorder):
    template = FWD_ARGS.new(_values(FWD_ARGS))
    run = launcher.Launch(_Kernel(), (3, 2), (128,), 4096, FWD_ARGS, template)
    run({"q": _Arr(0x1000), "k": _Arr(0x2000)})
    run({"q": _Arr(0x3000), "k": None})
    words = run._buffers()[0]
    assert words[FWD_ARGS.pointer_words["q"]] == 0x3000 and words[FWD_ARGS.pointer_words["k"]] == 0
    assert [c["dims"] for c in recorder] == [(3, 2, 1, 128, 1, 1)] * 2
    assert recorder[0]["fn"] == 0xF00D and recorder[0]["smem"] == 4096 and recorder[0]["stream"] == 7
    assert recorder[0]["words"] == words.ctypes.data  # the buffer the driver copies from


def test_tma_launch_writes_the_maps_of_each_calls_arrays(recorder):
    encoded = []

    class Geo:  # stands in for tma.TmaGeometry (the driver call needs a GPU)
        def __init__(self, tag):
            self.tag = tag

        def encode(self, out, addr):
            encoded.append((self.tag, out, addr))

    template = SM90_ARGS.new(_values(SM90_ARGS))
    geos = (Geo("q"), Geo("kv"), Geo("kv"))
    run = launcher.TmaLaunch(_Kernel(), (1,), (384,), 1 << 17, SM90_ARGS, template, geos)
    run({"q": _Arr(0x10), "k": _Arr(0x20), "v": _Arr(0x30)})
    words = run._buffers()[0]
    base = words.ctypes.data
    assert encoded == [("q", base, 0x10), ("kv", base + 128, 0x20), ("kv", base + 256, 0x30)]
    assert words[SM90_ARGS.pointer_words["v"]] == 0x30
    encoded.clear()
    launcher.TmaLaunch(_Kernel(), (1,), (384,), 0, SM90_ARGS, template, None)(
        {"q": _Arr(1), "k": _Arr(2), "v": _Arr(3)})
    assert encoded == [] and len(recorder) == 2  # paged kernels that gather: no maps


def test_tma_launch_encodes_only_the_maps_whose_array_moved(recorder):
    """A paged pool or a K/V cache keeps its address from call to call: its map's bytes stay in
    the thread's struct and the driver is not asked again; a new q is re-encoded."""
    encoded = []

    class Geo:
        def encode(self, out, addr):
            encoded.append((out, addr))

    template = SM90_ARGS.new(_values(SM90_ARGS))
    run = launcher.TmaLaunch(_Kernel(), (1,), (384,), 0, SM90_ARGS, template, (Geo(), Geo(), None))
    run({"q": _Arr(0x10), "k": _Arr(0x20), "v": _Arr(0x30)})
    base = run._buffers()[0].ctypes.data
    assert encoded == [(base, 0x10), (base + 128, 0x20)]  # v: a map the kernel does not read
    encoded.clear()
    run({"q": _Arr(0x10), "k": _Arr(0x20), "v": _Arr(0x30)})
    assert encoded == []  # nothing moved
    run({"q": _Arr(0x40), "k": _Arr(0x20), "v": _Arr(0x50)})
    assert encoded == [(base, 0x40)]  # only q moved (v has no map)
    assert len(recorder) == 3


def test_cluster_launch_hands_cuLaunchKernelEx_a_cluster_dimension(recorder, monkeypatch):
    """ClusterLaunch (the sm90 split kernels' cluster merge): the config carries the grid, the
    block, the shared memory, the current stream and one attribute, the cluster dimension
    (id 4, {cluster, 1, 1}); kernelParams is the thread's struct, as for cuLaunchKernel.  A
    cluster that does not tile the grid is refused before any launch; above the portable 8
    CTAs the kernel is given the non-portable attribute (id 14)."""
    seen, attributes = [], []

    def launch_ex(config_ptr, fn, params, extra):
        c = config_ptr._obj
        a = c.attrs.contents
        seen.append(dict(grid=tuple(c.grid), block=tuple(c.block), smem=c.shared_mem_bytes,
                         stream=c.stream, num_attrs=c.num_attrs, attr=(a.id, tuple(a.cluster_dim)),
                         fn=fn, words=ctypes.c_uint64.from_address(params).value))
        return 0

    monkeypatch.setitem(launcher._DRIVER, "cuLaunchKernelEx", launch_ex)
    from cupy_backends.cuda.api import driver

    monkeypatch.setattr(driver, "funcSetAttribute", lambda fn, attr, value: attributes.append((fn, attr, value)))
    template = SM90_ARGS.new(_values(SM90_ARGS))
    run = launcher.ClusterLaunch(_Kernel(), (16,), (384,), 1 << 17, SM90_ARGS, template, None, 8)
    run({"q": _Arr(0x10), "k": _Arr(0x20), "v": _Arr(0x30)})
    words = run._buffers()[0]
    assert seen == [dict(grid=(16, 1, 1), block=(384, 1, 1), smem=1 << 17, stream=7, num_attrs=1,
                         attr=(4, (8, 1, 1)), fn=0xF00D, words=words.ctypes.data)]
    assert words[SM90_ARGS.pointer_words["v"]] == 0x30 and recorder == []  # not cuLaunchKernel
    assert attributes == []  # 8: portable
    launcher.ClusterLaunch(_Kernel(), (32,), (384,), 0, SM90_ARGS, template, None, 16)
    assert attributes == [(0xF00D, 14, 1)]
    for grid, cluster in (((12,), 8), ((16,), 1), ((34,), 17)):
        with pytest.raises(ValueError, match="does not tile"):
            launcher.ClusterLaunch(_Kernel(), grid, (384,), 0, SM90_ARGS, template, None, cluster)
