"""The Hopper float32 path's host side without a GPU (cupy_flashattn/_cuda/f32_planes.py): the
kernel arguments point at the planes with float16 strides, and the TMA maps see 2 "heads" per
head (the kernel's head coordinate is 2 h + plane) -- the layout cuda_src/f32_split.cu writes:
(rows, heads, 2, D)."""

from types import SimpleNamespace

import numpy as np

from cupy_flashattn._cuda.f32_planes import F32_SPLIT_ARGS, plane_values
from cupy_flashattn._cuda.tma import fwd_geometries


def _workspace(rows_q, h, rows_k, hk, d):
    z = np.zeros
    return SimpleNamespace(q_planes=z((rows_q, h, 2, d), np.float16),
                           k_planes=z((rows_k, hk, 2, d), np.float16),
                           v_planes=z((rows_k, hk, 2, d), np.float16),
                           q_rscale=z((rows_q, h), np.float32), kv_rscale=z((2, hk), np.float32))


def _values(rows_q, h, rows_k, hk, d, seqlen_k, batch):
    # What Operands.fwd_values gives for float32 inputs (strides of the float32 arrays).
    return dict(q=None, k=None, v=None, head_dim=d, num_heads=h, h_per_kv=h // hk,
                total_q=rows_q, k_rows=rows_k, q_row_stride=h * d, q_head_stride=d,
                k_row_stride=hk * d, k_head_stride=d, k_page_stride=0, seqlen_k=seqlen_k,
                batch=batch, cu_seqlens_k=None, seqused_k=None, leftpad_k=None)


def test_kernel_values_point_at_the_planes_with_float16_strides():
    ws = _workspace(96, 6, 200, 2, 80)
    kernel, maps = plane_values(_values(96, 6, 200, 2, 80, 100, 2), ws)
    assert kernel["q"] is ws.q_planes and kernel["k"] is ws.k_planes and kernel["v"] is ws.v_planes
    assert (kernel["q_row_stride"], kernel["q_head_stride"]) == (6 * 2 * 80, 2 * 80)
    assert (kernel["k_row_stride"], kernel["k_head_stride"]) == (2 * 2 * 80, 2 * 80)
    assert kernel["q_rscale"] is ws.q_rscale and kernel["kv_rscale"] is ws.kv_rscale
    assert kernel["num_heads"] == 6 and maps["num_heads"] == 12  # the kernel's heads stay H
    # Element (row r, head h, plane p, column c) of the planes sits at r*row + h*head + p*D + c.
    r, h, p, c = 7, 4, 1, 33
    flat = r * kernel["q_row_stride"] + h * kernel["q_head_stride"] + p * 80 + c
    assert np.ravel_multi_index((r, h, p, c), ws.q_planes.shape) == flat


def test_tma_maps_see_a_plane_as_a_head():
    ws = _workspace(96, 6, 200, 2, 80)
    _, maps = plane_values(_values(96, 6, 200, 2, 80, 100, 2), ws)
    q, k, v = fwd_geometries(maps, 128, 64)
    assert list(q.dims) == [80, 12, 96] and list(q.strides) == [2 * 80, 2 * 12 * 80]
    # Dense, every sequence Sk = 100 rows: (D, 2 Hk, Sk, B), boxes end at each sequence's end.
    assert list(k.dims) == [80, 4, 100, 2] and list(k.strides) == [2 * 80, 2 * 4 * 80, 2 * 4 * 80 * 100]
    assert k is v and list(k.box) == [64, 1, 64, 1]


def test_pre_pass_argument_struct_matches_its_c_definition():
    text = F32_SPLIT_ARGS.c_struct()
    for name in ("q_planes", "kv_rscale", "kv_amax", "kv_head_stride", "head_dim"):
        assert name in text
    assert F32_SPLIT_ARGS.dtype.itemsize % 8 == 0 and len(F32_SPLIT_ARGS.pointer_words) == 9
