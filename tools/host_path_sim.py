"""The Python work of a cached public call, measured without a GPU (stop 46).

The device machine's host is shared and noisy (torch's own host time per call moved 63-83 us
between two runs of one call, stop 46), too noisy to resolve a change of a few microseconds in
our front end.  This stands a fake ``cupy`` in for the real one -- arrays that only carry
shape, strides, dtype and an address; ``cupy.empty``, the current stream and
``cuLaunchKernel`` as cheap stand-ins -- and times ``flash_attn_func`` on a dense bf16
prefill problem (B = 8, S = 2048, H = 16, D = 128) whose call is already cached, down to the
launch: the signature, the call cache, the output and LSE buffers, the problem, the plan's
pointer binding.  A real sm90 launch plan is built around a stand-in kernel.  Compare two
checkouts on one machine, run after run:

    python3 tools/host_path_sim.py [--checkout DIR] [--parts] [--profile]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

import numpy as np


class _Mem:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


class FakeArray:
    """What the front end reads of a CuPy array: shape, strides, dtype, size, data.ptr."""

    def __init__(self, shape, dtype, ptr=1 << 20, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.itemsize, self.ndim = self.dtype.itemsize, len(self.shape)
        if strides is None:
            acc, st = self.itemsize, []
            for s in reversed(self.shape):
                st.append(acc)
                acc *= s
            strides = tuple(reversed(st))
        self.strides, self.data = strides, _Mem(ptr)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return FakeArray(shape, self.dtype, self.data.ptr)


def install_fake_cupy():
    """Modules ``cupy`` (ndarray, empty, cuda.get_current_stream, cuda.runtime.getDevice) and
    ``cupy_backends.cuda.api.driver`` (launchKernel) in sys.modules."""
    stream = types.SimpleNamespace(ptr=0)
    cupy = types.ModuleType("cupy")
    cupy.ndarray = FakeArray
    cupy.empty = lambda shape, dtype=np.float32: FakeArray(shape, dtype)
    cuda = cupy.cuda = types.ModuleType("cupy.cuda")
    cuda.get_current_stream = lambda: stream
    cuda.runtime = types.ModuleType("cupy.cuda.runtime")
    cuda.runtime.getDevice = lambda: 0
    driver = types.ModuleType("cupy_backends.cuda.api.driver")
    driver.launchKernel = lambda *args: None
    api = types.ModuleType("cupy_backends.cuda.api")
    api.driver = driver
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.runtime", cuda.runtime),
                      ("cupy_backends", types.ModuleType("cupy_backends")),
                      ("cupy_backends.cuda", types.ModuleType("cupy_backends.cuda")),
                      ("cupy_backends.cuda.api", api), ("cupy_backends.cuda.api.driver", driver)):
        sys.modules[name] = mod
    return cupy


def cached_dense_call():
    """A flash_attn_func call (q, k, v) whose validated call and sm90 plan are in the cache."""
    import ml_dtypes

    import cupy_flashattn as fa
    from cupy_flashattn import _calls, _signature, api
    from cupy_flashattn._cuda import launch, launcher
    from cupy_flashattn._cuda.per_stream import PerStream

    cupy = sys.modules["cupy"]
    bf16 = np.dtype(ml_dtypes.bfloat16)
    B, S, H, D = 8, 2048, 16, 128
    q, k, v = (FakeArray((B, S, H, D), bf16, (i + 1) << 30) for i in range(3))
    fields = dict(batch_size=B, seqlen_q=S, seqlen_k=S, max_seqlen_q=S, max_seqlen_k=S,
                  softmax_scale=D ** -0.5, window_left=-1, window_right=-1, softcap=0.0)
    call = _calls.DenseCall(cupy, fields, H, D, False, False, q.shape, k.shape)
    kernel = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=1))
    plan = object.__new__(launch.PrefillPlan)  # the state PrefillPlan.run reads, direct sm90
    plan.planes, plan.direct, plan.dynamic = None, True, True
    plan.launch = launcher.TmaLaunch(kernel, (132,), (384,), 200000, launch.SM90_ARGS,
                                     launch.SM90_ARGS.new({}), None)
    plan._counter = PerStream(lambda: FakeArray((1,), np.int32, 77))
    call.plan, call.pointers_only = (plan,), True
    _calls._CUDA_BACKEND = types.SimpleNamespace(
        run_attention=lambda p, pl: [launch_.run(p) for launch_ in pl] and pl)
    key = _signature.signature(
        (q, k, v, None, None, None, None),
        (0.0, None, False, (-1, -1), 0.0, False, False, None, api._default_check(), None, None,
         None))
    assert key is not None, "the fake arrays must be cacheable"
    _signature.CALLS.put(key, call)
    return lambda: fa.flash_attn_func(q, k, v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    install_fake_cupy()
    sys.path.insert(0, args.checkout)
    call = cached_dense_call()
    for _ in range(2000):
        call()
    t = time.perf_counter()
    for _ in range(args.n):
        call()
    print(f"{(time.perf_counter() - t) / args.n * 1e6:.1f} us per cached call "
          f"({sys.modules['cupy_flashattn'].__file__})")
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5000):
            call()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
