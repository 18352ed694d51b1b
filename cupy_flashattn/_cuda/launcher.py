"""Kernel launches from a packed argument struct, at the cost of one driver call.

Every kernel of this package takes ONE struct by value (``packing.py``).  ``cupy.RawKernel``'s
``__call__`` still spends ~7 µs on the host per launch (argument conversion, per-device function
lookup, keyword handling; measured on the H200, ``tools/profile_host.py``), which a decode step of
four launches pays four times.  A :class:`Launch` calls ``cuLaunchKernel`` directly instead
(CuPy's ``driver.launchKernel``): the kernel's function pointer, grid, block and shared memory
are fixed when the plan is made, and the ``kernelParams`` array (one pointer to the struct bytes)
lives as long as the plan.  Per call only the pointer words of the struct are rewritten.

Safety:
* ``cuLaunchKernel`` copies the parameter bytes before it returns (CUDA driver API), so the
  buffer can be rewritten by the next call -- also under stream capture, where the graph node
  keeps its own copy.
* The buffer is per thread (``threading.local``): two threads replaying the same cached plan
  never write each other's pointers between the write and the launch.
* The function pointer belongs to the device that was current when the plan was made; the call
  cache keys plans by that device (``_signature.py``), and :meth:`Launch.__call__` launches on
  the current stream.
"""

from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np

__all__ = ["ClusterLaunch", "Launch", "TmaLaunch", "launch_packed"]


_LAUNCH_KERNEL = None  # cupy_backends' driver.launchKernel, imported on first use (CuPy optional)
_CURRENT_STREAM = None  # cupy.cuda.get_current_stream


def _bind_cupy() -> None:
    global _LAUNCH_KERNEL, _CURRENT_STREAM
    import cupy
    from cupy_backends.cuda.api import driver

    _LAUNCH_KERNEL, _CURRENT_STREAM = driver.launchKernel, cupy.cuda.get_current_stream


class Launch:
    """One kernel with a fixed grid, block, shared memory and argument template.

    ``kernel``: a ``cupy.RawKernel`` (from ``compile.load_function``, attributes already set for
    the current device); ``pack``: the :class:`~.packing.ArgPack` of its struct; ``template``: a
    packed struct from ``pack.new`` whose scalars are final (pointers are written per call)."""

    def __init__(self, kernel, grid, block, smem: int, pack, template: np.ndarray):
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        self.dims = grid + block
        self.smem = int(smem)
        self.function_ptr = kernel.kernel.ptr  # cupy.cuda.function.Function of this device
        self.pack = pack
        self.template_words = template.view(np.uint64)
        self._local = threading.local()
        if _LAUNCH_KERNEL is None:
            _bind_cupy()

    def _buffers(self):
        """This thread's struct words, its one-entry ``kernelParams`` array and that array's
        address, and a memoryview of the words (pointer writes through it cost less than item
        writes on the NumPy array)."""
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            words = self.template_words.copy()
            params = np.array([words.ctypes.data], dtype=np.uint64)  # void* kernelParams[1]
            view = memoryview(words).cast("B").cast("Q")
            bufs = self._local.bufs = (words, params, int(params.ctypes.data), view)
        return bufs

    def __call__(self, pointers: dict) -> None:
        """Launch on the current stream with the pointer fields in ``pointers`` (name -> CuPy
        array or None).  Name every pointer field: one left out keeps what this thread's
        previous launch wrote (the buffer is reused), which is the template's value only on
        the first launch."""
        _words, _params, params_ptr, view = self._buffers()
        self._bind(view, pointers)
        gx, gy, gz, bx, by, bz = self.dims
        _LAUNCH_KERNEL(self.function_ptr, gx, gy, gz, bx, by, bz, self.smem,
                       _CURRENT_STREAM().ptr, params_ptr, 0)

    def _bind(self, words, pointers: dict) -> None:
        """Write this call's arrays into the struct words (pointer fields; ``words``: 64-bit
        words, a memoryview or a NumPy array)."""
        self.pack.write_pointers(words, pointers)


class TmaLaunch(Launch):
    """A :class:`Launch` of an sm90 kernel whose struct (``tma.TmaArgPack``) also carries the
    TMA maps of q, k, v (``geometries``: the plan's ``tma.TmaGeometry`` triple, None entries
    for maps the kernel does not read; None for no maps).  A map holds its array's address, so
    a call re-encodes the maps whose array moved since this thread's previous launch; one whose
    address is the same (a paged pool, a K/V cache, a reused buffer) keeps the bytes already in
    this thread's struct (the geometry is the plan's, fixed), saving a driver call per map."""

    def __init__(self, kernel, grid, block, smem: int, pack, template: np.ndarray, geometries):
        super().__init__(kernel, grid, block, smem, pack, template)
        self.geometries = geometries

    def _bind(self, words, pointers: dict) -> None:
        """Pointer fields, then the maps of this call's q, k, v that changed address."""
        self.pack.write_pointers(words, pointers)
        if self.geometries is None:
            return
        encoded = getattr(self._local, "map_addresses", None)  # per thread, like `words`
        if encoded is None:
            encoded = self._local.map_addresses = [None] * len(self.geometries)
        for i, (geo, name) in enumerate(zip(self.geometries, ("q", "k", "v"))):
            if geo is None:
                continue
            address = pointers[name].data.ptr
            if encoded[i] != address:
                # The map is encoded in place by the driver: the NumPy array (its address),
                # not the memoryview of its words.
                self.pack.write_map(self._buffers()[0], i, geo, address)
                encoded[i] = address


#: cuda.h values: CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, CUfunction_attribute
#: CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED.
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
#: Thread-block clusters on sm_90: every GPU runs 8 CTAs a cluster (CUDA's portable size); up to
#: 16 with the kernel's non-portable attribute, where a GPC has that many SMs free for it
#: (:meth:`ClusterLaunch.max_active_clusters` asks the driver).
PORTABLE_CLUSTER_SIZE = 8
MAX_CLUSTER_SIZE = 16


class _LaunchAttribute(ctypes.Structure):
    """cuda.h ``CUlaunchAttribute``: the id, padding to 8 bytes, a 64-byte value union whose
    first three unsigned ints are ``clusterDim`` {x, y, z}."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("cluster_dim", ctypes.c_uint * 3),
                ("value_pad", ctypes.c_char * 52)]


class _LaunchConfig(ctypes.Structure):
    """cuda.h ``CUlaunchConfig`` (cuLaunchKernelEx's and cuOccupancyMaxActiveClusters' argument)."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_DRIVER: dict = {}


def _driver_function(name: str, argtypes):
    """A driver API function through ctypes, bound once (tma.py binds its encoder the same way:
    CuPy exposes neither cuLaunchKernelEx nor the cluster occupancy query)."""
    fn = _DRIVER.get(name)
    if fn is None:
        lib = ctypes.WinDLL("nvcuda.dll") if sys.platform == "win32" else ctypes.CDLL("libcuda.so.1")
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = argtypes
        _DRIVER[name] = fn
    return fn


class ClusterLaunch(TmaLaunch):
    """A :class:`TmaLaunch` whose CTAs run as thread-block clusters of ``cluster`` CTAs along x
    (``cuLaunchKernelEx`` with a cluster dimension; the sm90 split kernels' cluster merge,
    cuda_src/sm90/cluster_merge.cuh).  The grid's x must be a multiple of ``cluster``.  Above
    PORTABLE_CLUSTER_SIZE the kernel is given the driver's non-portable attribute; whether the
    device can run such a cluster at all is :meth:`max_active_clusters` (the plan asks once)."""

    def __init__(self, kernel, grid, block, smem: int, pack, template: np.ndarray, geometries,
                 cluster: int):
        super().__init__(kernel, grid, block, smem, pack, template, geometries)
        if not 1 < cluster <= MAX_CLUSTER_SIZE or self.dims[0] % cluster:
            raise ValueError(f"a cluster of {cluster} CTAs does not tile the grid {self.dims[:3]}")
        self.cluster = int(cluster)
        if cluster > PORTABLE_CLUSTER_SIZE:
            from cupy_backends.cuda.api import driver

            driver.funcSetAttribute(self.function_ptr,
                                    _CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        self._attr = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                                      cluster_dim=(ctypes.c_uint * 3)(self.cluster, 1, 1))

    def _config(self, stream_ptr: int) -> _LaunchConfig:
        """This thread's launch configuration (kept: it points at the plan's attribute)."""
        config = getattr(self._local, "config", None)
        if config is None:
            gx, gy, gz, bx, by, bz = self.dims
            config = self._local.config = _LaunchConfig(
                (ctypes.c_uint * 3)(gx, gy, gz), (ctypes.c_uint * 3)(bx, by, bz), self.smem, None,
                ctypes.pointer(self._attr), 1)
        config.stream = stream_ptr
        return config

    def max_active_clusters(self) -> int:
        """How many of these clusters the device can hold at once (0: it cannot launch one --
        e.g. 16 CTAs of this shared memory where no GPC has 16 SMs)."""
        try:
            fn = _driver_function("cuOccupancyMaxActiveClusters",
                                  [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                   ctypes.POINTER(_LaunchConfig)])
        except (AttributeError, OSError):  # a driver without it (before CUDA 12.0): no clusters
            return 0
        count = ctypes.c_int(0)
        err = fn(ctypes.byref(count), self.function_ptr, ctypes.byref(self._config(None)))
        return int(count.value) if err == 0 else 0

    def __call__(self, pointers: dict) -> None:
        _words, _params, params_ptr, view = self._buffers()
        self._bind(view, pointers)
        fn = _driver_function("cuLaunchKernelEx", [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                                   ctypes.c_void_p, ctypes.c_void_p])
        err = fn(ctypes.byref(self._config(_CURRENT_STREAM().ptr)), self.function_ptr, params_ptr, None)
        if err != 0:
            raise RuntimeError(f"cuLaunchKernelEx (a cluster of {self.cluster} CTAs) failed: CUresult "
                               f"{err}")


def launch_packed(kernel, grid, block, packed: np.ndarray, smem: int = 0) -> None:
    """A one-off launch of a packed struct (plans that rebuild their arguments every call, and
    the merge kernel): CuPy's own launch path, which reads the struct bytes itself."""
    kernel(tuple(grid), tuple(block), (packed,), shared_mem=smem)
