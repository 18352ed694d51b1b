"""The GPU kernels count rows in 32 bits (their element offsets are 64-bit): a call with more
than 2**31 - 1 query rows, or contiguous k/v rows, gets a typed error when it is lowered --
before anything is appended or launched -- instead of an OverflowError while packing kernel
arguments.  CPU-only: the lowering is called directly with shapes, no array is allocated."""

import pytest

import cupy_flashattn as fa
from cupy_flashattn._calls import MAX_GPU_ROWS, DenseCall, VarlenCall

GPU_XP = object()  # anything but numpy: the GPU path
FIELDS = dict(batch_size=1, seqlen_q=1, seqlen_k=1, max_seqlen_q=1, max_seqlen_k=1)


def test_too_many_query_rows():
    with pytest.raises(fa.UnsupportedError, match="q: has more token rows"):
        DenseCall(GPU_XP, FIELDS, 1, 8, False, False, (1, MAX_GPU_ROWS + 1, 1, 8), (1, 1, 1, 8))


def test_too_many_contiguous_key_rows():
    with pytest.raises(fa.UnsupportedError, match="k: has more token rows"):
        DenseCall(GPU_XP, FIELDS, 1, 8, False, False, (1, 1, 1, 8), (2, 2**30, 1, 8))


def test_paged_pool_rows_are_not_limited():
    fields = dict(FIELDS, page_block_size=16)
    VarlenCall(GPU_XP, fields, 1, 8, False, False, query_rows=1, key_rows=2**32)


def test_limit_is_inclusive_and_cpu_unlimited():
    DenseCall(GPU_XP, FIELDS, 1, 8, False, False, (1, MAX_GPU_ROWS, 1, 8), (1, 1, 1, 8))
    import numpy as np

    DenseCall(np, FIELDS, 1, 8, False, False, (1, MAX_GPU_ROWS + 1, 1, 8), (1, 1, 1, 8))
