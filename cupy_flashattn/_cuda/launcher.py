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

import threading

import numpy as np

__all__ = ["Launch", "TmaLaunch", "launch_packed"]


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


def launch_packed(kernel, grid, block, packed: np.ndarray, smem: int = 0) -> None:
    """A one-off launch of a packed struct (plans that rebuild their arguments every call, and
    the merge kernel): CuPy's own launch path, which reads the struct bytes itself."""
    kernel(tuple(grid), tuple(block), (packed,), shared_mem=smem)
