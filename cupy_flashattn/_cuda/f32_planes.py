"""The float32 prefill on Hopper: float32 q, k, v as float16 hi / lo planes for the sm90 kernel.

``cuda_src/f32_split.cu`` (the pre-pass: scales, planes) and ``cuda_src/sm90/flash_fwd.cu``
("Float32 as two float16 planes") say why: three float16 wgmma products per matrix product keep
float32's accuracy at twice the rate TF32 would run, with every tile, TMA map and pipeline of the
16-bit kernel.  A call runs four operations on its stream, none of which waits for the device:
a memset of the per-head maxima, ``fa_f32_amax`` (K and V), ``fa_f32_split`` (Q, K and V) and
the attention kernel.  The planes (two float16 values per float32 input element: as many
bytes again as the inputs) are a workspace kept per plan and stream, like the split-KV partials of decode, so
a plan replays -- CUDA graphs included -- without allocating.
"""

from __future__ import annotations

import numpy as np

from .launcher import Launch
from .packing import ArgPack
from .per_stream import PerStream

__all__ = ["F32_SPLIT_ARGS", "F32Planes", "split_source", "plane_values"]

F32_SPLIT_ARGS = ArgPack("fa_f32_split_args", (
    ("const float*", "q"), ("const float*", "k"), ("const float*", "v"),
    ("fa::u16*", "q_planes"), ("fa::u16*", "k_planes"), ("fa::u16*", "v_planes"),
    ("float*", "q_rscale"), ("float*", "kv_rscale"), ("int*", "kv_amax"),
    ("long long", "q_row_stride"), ("long long", "q_head_stride"),
    ("long long", "kv_row_stride"), ("long long", "kv_head_stride"),
    ("int", "q_rows"), ("int", "kv_rows"), ("int", "num_heads"), ("int", "num_heads_k"),
    ("int", "head_dim"),
))  # fmt: skip
AMAX_NAME, SPLIT_NAME = "fa_f32_amax", "fa_f32_split"
_THREADS = 256  # 8 warps: 8 rows per block (f32_split.cu)
#: Blocks per kv head of the max pass: enough to fill the GPU, few enough atomics.
_AMAX_BLOCKS = 512


def split_source() -> str:
    from .source import build_source

    wrappers = (F32_SPLIT_ARGS.entry_point(AMAX_NAME, "F32SplitParams", "f32_amax", _THREADS)
                + F32_SPLIT_ARGS.entry_point(SPLIT_NAME, "F32SplitParams", "f32_split", _THREADS))
    return (build_source("f32_split.cu") + '#line 1 "<generated f32 split entry points>"\n'
            + F32_SPLIT_ARGS.c_struct() + wrappers)


def _kernel(name: str):
    from .compile import load_function

    return load_function(("f32_split", name), split_source, name, 0)


class _Workspace:
    """The planes and scales of one plan on one stream."""

    def __init__(self, q_shape, kv_shape):
        import cupy

        (rows_q, h, d), (rows_k, hk, _) = q_shape, kv_shape
        self.q_planes = cupy.empty((rows_q, h, 2, d), np.float16)
        self.k_planes = cupy.empty((rows_k, hk, 2, d), np.float16)
        self.v_planes = cupy.empty((rows_k, hk, 2, d), np.float16)
        self.q_rscale = cupy.empty((rows_q, h), np.float32)
        self.kv_rscale = cupy.empty((2, hk), np.float32)
        self.kv_amax = cupy.empty((2, hk), np.int32)

    def pointers(self) -> dict:
        return dict(q_planes=self.q_planes, k_planes=self.k_planes, v_planes=self.v_planes,
                    q_rscale=self.q_rscale, kv_rscale=self.kv_rscale, kv_amax=self.kv_amax)


class F32Planes:
    """The pre-pass of one float32 sm90 launch: ``q`` (rows, H, D), ``k`` / ``v`` (rows, Hk, D)
    float32 with a contiguous last dim, D a multiple of 8, k and v of the same strides (what
    ``args.Operands`` hands the kernels)."""

    def __init__(self, q, k, v):
        from .args import elem_stride

        self.q_shape, self.kv_shape = tuple(q.shape), tuple(k.shape)
        rows_q, h, d = self.q_shape
        rows_k, hk, _ = self.kv_shape
        template = F32_SPLIT_ARGS.new(dict(
            q_row_stride=elem_stride(q, 0), q_head_stride=elem_stride(q, 1),
            kv_row_stride=elem_stride(k, 0), kv_head_stride=elem_stride(k, 1),
            q_rows=rows_q, kv_rows=rows_k, num_heads=h, num_heads_k=hk, head_dim=d,
        ))  # fmt: skip
        amax_grid = (max(1, min(-(-rows_k // 8), _AMAX_BLOCKS)), hk, 2)
        split_grid = (max(1, -(-max(rows_q, rows_k) // 8)), max(h, hk), 3)
        self.amax = Launch(_kernel(AMAX_NAME), amax_grid, (_THREADS,), 0, F32_SPLIT_ARGS, template)
        self.split = Launch(_kernel(SPLIT_NAME), split_grid, (_THREADS,), 0, F32_SPLIT_ARGS,
                            template)
        self._workspace = PerStream(lambda: _Workspace(self.q_shape, self.kv_shape))

    def workspace(self) -> _Workspace:
        """The current stream's planes (made on its first use: outside a graph capture)."""
        return self._workspace.get()

    def run(self, q, k, v) -> _Workspace:
        """Fill the current stream's planes from q, k, v; returns them."""
        import cupy

        ws = self.workspace()
        stream = cupy.cuda.get_current_stream()
        cupy.cuda.runtime.memsetAsync(ws.kv_amax.data.ptr, 0, ws.kv_amax.nbytes, stream.ptr)
        pointers = dict(q=q, k=k, v=v, **ws.pointers())
        self.amax(pointers)
        self.split(pointers)
        return ws


def plane_values(values: dict, ws: _Workspace) -> tuple:
    """(kernel values, TMA map values): the FwdParams ``values`` of a float32 launch rebound to
    the planes -- q / k / v pointers and their row / head strides in float16 elements, the
    scales -- and the same with 2 heads per head and plane-sized head strides for the TMA maps
    (the kernel's head coordinate is 2 h + plane)."""
    rows_q, h, _, d = ws.q_planes.shape
    hk = ws.k_planes.shape[1]
    kernel = dict(values, q=ws.q_planes, k=ws.k_planes, v=ws.v_planes,
                  q_row_stride=2 * h * d, q_head_stride=2 * d,
                  k_row_stride=2 * hk * d, k_head_stride=2 * d, k_page_stride=0,
                  q_rscale=ws.q_rscale, kv_rscale=ws.kv_rscale)
    maps = dict(kernel, num_heads=2 * h, q_head_stride=d, k_head_stride=d)
    return kernel, maps
