"""Tensor maps for the Hopper kernels' TMA loads, and the argument struct that carries them.

A TMA copy (``cp.async.bulk.tensor``, ``cuda_src/sm90/pipeline.cuh``) reads a box of a global
tensor described by a *tensor map*: the driver's opaque 128-byte ``CUtensorMap``, built on the
host by ``cuTensorMapEncodeTiled`` and passed to the kernel by value (``__grid_constant__``).
We call the driver library through ``ctypes`` -- the function is part of the CUDA driver API
that every CuPy installation already loads (``libcuda.so.1`` / ``nvcuda.dll``), so this needs no
extra dependency -- and never pack the map ourselves.

A map holds the tensor's address, so it is re-encoded per call (a plan replayed on new arrays):
three driver calls of ~1 µs each on the host, no device work, safe under stream capture.  The
sm90 entry points take ``fa_fwd_sm90_args`` = three maps (q, k, v) + ``fa_fwd_args``
(:class:`TmaArgPack`).
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

from .packing import ArgPack

__all__ = ["TmaArgPack", "TmaGeometry", "encode_tiled"]

MAP_BYTES = 128
MAP_NAMES = ("tma_q", "tma_k", "tma_v")

# cuda.h enums (CUtensorMapDataType, ...Interleave, ...Swizzle, ...L2promotion, ...FloatOOBfill).
_UINT16 = 1  # the copy moves bits: one map type serves float16 and bfloat16
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3  # the SW128 layout of cuda_src/sm90/wgmma.cuh
_L2_PROMOTION_256B = 3
_OOB_ZERO = 0  # coordinates outside the tensor read zeros

_ENCODE = None


def _encoder():
    """``cuTensorMapEncodeTiled`` of the driver library, bound once."""
    global _ENCODE
    if _ENCODE is None:
        lib = ctypes.WinDLL("nvcuda.dll") if sys.platform == "win32" else ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _ENCODE = fn
    return _ENCODE


class TmaGeometry:
    """The shape, strides and box of one tensor map of 16-bit elements (rank 3: q;
    rank 4: dense k / v, a paged pool), as ctypes arrays made once per plan (only the address changes per
    call).

    dims, strides: innermost first, in elements (strides of dims 1 .. rank-1; multiples of 8,
    i.e. 16 bytes, as TMA requires); box: the box in elements (box[0] * 2 bytes <= 128 with
    the 128-byte swizzle).  A zero dim is encoded as 1: no box of it is ever loaded."""

    def __init__(self, dims, strides, box):
        rank = len(dims)
        assert len(strides) == rank - 1 and len(box) == rank
        self.rank = rank
        self.dims = (ctypes.c_uint64 * rank)(*(max(1, int(d)) for d in dims))
        self.strides = (ctypes.c_uint64 * (rank - 1))(*(2 * int(s) for s in strides))
        self.box = (ctypes.c_uint32 * rank)(*(int(b) for b in box))
        self.elem_strides = (ctypes.c_uint32 * rank)(*([1] * rank))

    def encode(self, out_address: int, global_address: int) -> None:
        """Write the map of the tensor at ``global_address`` to the 128 bytes at ``out_address``."""
        err = _encoder()(out_address, _UINT16, self.rank, global_address, self.dims, self.strides,
                         self.box, self.elem_strides, _INTERLEAVE_NONE, _SWIZZLE_128B,
                         _L2_PROMOTION_256B, _OOB_ZERO)
        if err != 0:
            raise RuntimeError(
                f"cuTensorMapEncodeTiled failed (CUresult {err}) for dims "
                f"{list(self.dims)}, byte strides {list(self.strides)}, box {list(self.box)}, "
                f"address {global_address:#x}")


def encode_tiled(dims, strides, box, global_address: int) -> bytes:
    """One map as bytes (tests and debugging)."""
    buf = np.zeros(MAP_BYTES // 8, np.uint64)
    TmaGeometry(dims, strides, box).encode(buf.ctypes.data, global_address)
    return buf.tobytes()


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class TmaArgPack:
    """``fa_fwd_sm90_args``: the maps of q, k, v (64-byte aligned, at offsets 0 / 128 / 256)
    then the ``base`` struct at byte 384, the size rounded up to 64 (the struct's alignment).
    Same interface as :class:`~.packing.ArgPack` for the launcher (``pointer_words``, ``new``,
    ``write_pointers``); the maps are written by :meth:`write_maps`."""

    def __init__(self, struct_name: str, base: ArgPack):
        self.struct_name = struct_name
        self.base = base
        self.base_offset = len(MAP_NAMES) * MAP_BYTES
        self.size = _round_up(self.base_offset + base.dtype.itemsize, 64)
        self.pointer_words = {n: w + self.base_offset // 8 for n, w in base.pointer_words.items()}
        self.void = np.dtype((np.void, self.size))

    def c_struct(self) -> str:
        maps = " ".join(f"fa::pipe::TmaDesc {n};" for n in MAP_NAMES)
        return (f"struct alignas(64) {self.struct_name} {{\n  {maps}\n  {self.base.struct_name} base;\n}};\n"
                f"static_assert(sizeof({self.struct_name}) == {self.size}, "
                f"\"{self.struct_name}: size differs from the host's layout\");\n")

    def new(self, values: dict) -> np.ndarray:
        """A launchable (1,)-array: ``values`` in the base struct, the maps left zero."""
        words = np.zeros(self.size // 8, np.uint64)
        base = self.base.new(values).view(np.uint64)
        words[self.base_offset // 8: self.base_offset // 8 + base.size] = base
        return words.view(self.void)

    def write_pointers(self, words: np.ndarray, pointers: dict) -> None:
        pw = self.pointer_words
        for name, value in pointers.items():
            words[pw[name]] = 0 if value is None else value.data.ptr

    @staticmethod
    def write_map(words: np.ndarray, i: int, geometry, address: int) -> None:
        """Encode map i (0 q, 1 k, 2 v) of the array at ``address`` into ``words``."""
        geometry.encode(words.ctypes.data + i * MAP_BYTES, address)

    @classmethod
    def write_maps(cls, words: np.ndarray, geometries, addresses) -> None:
        """Encode map i (q, k, v) of ``addresses[i]`` with ``geometries[i]`` into ``words``
        (a None geometry: a map the kernel does not read, left zero)."""
        for i, (geo, addr) in enumerate(zip(geometries, addresses)):
            if geo is not None:
                cls.write_map(words, i, geo, addr)


def paged_tma_enabled() -> bool:
    """Whether the sm90 kernels are built with paged K/V by TMA (the FA_SM90_PAGED_TMA switch of
    cuda_src/sm90/kernel_traits.cuh: on unless a device A/B run turns it off)."""
    from .compile import _tuning_defines

    return "-DFA_SM90_PAGED_TMA=0" not in _tuning_defines()


def paged_tma_ok(page_size: int) -> bool:
    """The kernel's rule (flash_fwd.cu paged_tma_ok): pages of whole 8-row boxes, P a power of
    two (the boxes, :func:`paged_box_rows` high, then never cross a page)."""
    P = int(page_size)
    return paged_tma_enabled() and P % 8 == 0 and P & (P - 1) == 0


def paged_box_rows(page_size: int, block_n: int) -> int:
    """Rows of a paged TMA box (flash_fwd.cu PagedBoxes::rows): P, at most the largest power of
    two dividing the key tile (block_n itself, but 16 for D = 256's 80-key tiles)."""
    return min(int(page_size), block_n & -block_n)


def paged_geometry(values: dict, block_n: int) -> TmaGeometry:
    """k / v of a paged pool (head_dim, Hk, P, num_pages), box (64, 1, paged_box_rows, 1);
    page ids outside the pool are out of bounds (zeros)."""
    d, h = int(values["head_dim"]), int(values["num_heads"])
    hk, P = h // int(values["h_per_kv"]), int(values["page_size"])
    return TmaGeometry((d, hk, P, values["k_rows"]),
                       (values["k_head_stride"] if hk > 1 else 8,
                        values["k_row_stride"] if P > 1 else 8, values["k_page_stride"]),
                       (64, 1, paged_box_rows(P, block_n), 1))


def dense_kv_bounded(values: dict) -> bool:
    """The kernel's rule (flash_fwd.cu dense_kv_bounded): every sequence is ``seqlen_k`` rows at
    ``slot * seqlen_k`` (no cu_seqlens_k, seqused_k or leftpad_k), so the dense K/V maps can
    hold each sequence as its own slice and a box past its end reads zeros."""
    return (values["cu_seqlens_k"] is None and values["seqused_k"] is None
            and values["leftpad_k"] is None and int(values["seqlen_k"]) > 0)


def fwd_geometries(values: dict, block_m: int, block_n: int, paged: bool = False):
    """The q, k, v map geometries of a prefill launch from its FwdParams ``values``:
    q (head_dim, H, total_q) box (64, 1, block_m); dense k, v (head_dim, Hk, Sk, k_rows / Sk)
    where :func:`dense_kv_bounded`, else (head_dim, Hk, k_rows, 1), box (64, 1, block_n, 1);
    paged k, v: :func:`paged_geometry`, or None when the kernel gathers them (then it reads only
    q's map).  (The kernels load head_dim in 64-column boxes; columns past head_dim read zeros.)"""
    d, h = int(values["head_dim"]), int(values["num_heads"])
    hk = h // int(values["h_per_kv"])

    def stride(s, n):  # the stride of a dim of size 1 is never used; TMA still wants 16 bytes
        return int(s) if n > 1 else 8

    q_rows, k_rows = int(values["total_q"]), int(values["k_rows"])
    q = TmaGeometry((d, h, q_rows), (stride(values["q_head_stride"], h),
                                     stride(values["q_row_stride"], q_rows)), (64, 1, block_m))
    if paged:
        kv = paged_geometry(values, block_n) if paged_tma_ok(values["page_size"]) else None
    else:
        row_stride = int(values["k_row_stride"])
        if dense_kv_bounded(values):
            sk = int(values["seqlen_k"])
            rows, slots = sk, k_rows // sk
        else:
            rows, slots = k_rows, 1
        kv = TmaGeometry((d, hk, rows, slots),
                         (stride(values["k_head_stride"], hk), stride(row_stride, rows),
                          stride(row_stride * rows, slots)), (64, 1, block_n, 1))
    return (q, kv, kv)
