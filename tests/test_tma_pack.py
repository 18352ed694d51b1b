"""The sm90 kernels' argument struct (``_cuda/tma.py``): three 128-byte TMA maps at offsets
0 / 128 / 256, then ``fa_fwd_args`` at byte 384, 64-byte aligned overall -- the layout the
generated C struct asserts (``static_assert(sizeof...)``, compiled by test_nvrtc_compile.py) --
and the map geometries a dense prefill launch asks the driver for.  No GPU needed (the driver
call itself runs in the GPU suite, through every sm90 dense launch)."""

import numpy as np

from cupy_flashattn._cuda.compile import FWD_ARGS, SM90_ARGS
from cupy_flashattn._cuda.tma import MAP_BYTES, fwd_geometries


def test_layout_puts_the_maps_first_and_the_base_struct_at_384():
    assert SM90_ARGS.base_offset == 3 * MAP_BYTES == 384
    assert SM90_ARGS.size % 64 == 0 and SM90_ARGS.size >= 384 + FWD_ARGS.dtype.itemsize
    for name, word in FWD_ARGS.pointer_words.items():  # the base struct starts with PARAMS
        assert SM90_ARGS.pointer_words[name] == word + 48
    # then the sm90-only fields: the dynamic schedule's counter (sm90/tile_scheduler.cuh)
    assert SM90_ARGS.base.names == FWD_ARGS.names + ("tile_counter",)
    assert SM90_ARGS.pointer_words["tile_counter"] == SM90_ARGS.base.pointer_words["tile_counter"] + 48
    c = SM90_ARGS.c_struct()
    assert "alignas(64)" in c and f"== {SM90_ARGS.size}" in c and "fa_fwd_sm90_base base;" in c


def test_new_writes_the_base_struct_after_zero_maps():
    values = {n: (None if n in FWD_ARGS.pointer_words else 0) for n in FWD_ARGS.names}
    values.update(head_dim=80, num_heads=6, softmax_scale=0.125)
    packed = SM90_ARGS.new(values)
    assert packed.dtype.itemsize == SM90_ARGS.size
    raw = packed.view(np.uint8)
    assert not raw[:384].any()  # maps are written per launch (write_maps)
    base = SM90_ARGS.base.read(raw[384:384 + SM90_ARGS.base.dtype.itemsize].copy().view(SM90_ARGS.base.void))
    assert base["head_dim"] == 80 and base["num_heads"] == 6 and base["softmax_scale"] == np.float32(0.125)

    class Arr:  # a stand-in with a CuPy-like .data.ptr
        class data:
            ptr = 0x7F0000001000

    words = packed.view(np.uint64)
    SM90_ARGS.write_pointers(words, {"k": Arr(), "q": None})
    assert words[SM90_ARGS.pointer_words["k"]] == 0x7F0000001000
    assert words[SM90_ARGS.pointer_words["q"]] == 0


def test_dense_geometries_describe_q_and_kv_in_64_column_boxes():
    """Varlen K/V (cu_seqlens_k): one slice of all rows; dense batches: one slice per sequence
    (rows past a sequence's end are outside its slice: the copy engine reads zeros there, so
    the kernel loads the sequence-end tile by TMA too, flash_fwd.cu dense_kv_bounded)."""
    seqs = dict(cu_seqlens_k=None, seqused_k=None, leftpad_k=None, seqlen_k=1000)
    values = dict(head_dim=80, num_heads=8, h_per_kv=4, total_q=1000, k_rows=3000,
                  q_head_stride=80, q_row_stride=640, k_head_stride=128, k_row_stride=256,
                  **seqs)
    q, k, v = fwd_geometries(values, block_m=128, block_n=64)
    assert k is v
    assert list(q.dims) == [80, 8, 1000] and list(q.strides) == [160, 1280]
    assert list(q.box) == [64, 1, 128]
    assert k.rank == 4 and list(k.dims) == [80, 2, 1000, 3] and list(k.strides) == [256, 512, 512000]
    assert list(k.box) == [64, 1, 64, 1]
    for name, arr in (("cu_seqlens_k", object()), ("seqused_k", object()), ("leftpad_k", object()),
                      ("seqlen_k", 0)):
        _, k, _ = fwd_geometries(dict(values, **{name: arr}), block_m=128, block_n=64)
        assert list(k.dims) == [80, 2, 3000, 1] and list(k.strides)[:2] == [256, 512], name
    # Dims of size 1 (MQA, one query row) get a legal 16-byte stride; a zero dim becomes 1.
    values.update(h_per_kv=8, k_head_stride=3, total_q=0)
    q, k, _ = fwd_geometries(values, block_m=128, block_n=64)
    assert list(k.dims)[1] == 1 and list(k.strides)[0] == 16
    assert list(q.dims)[2] == 1


def test_paged_maps_only_with_the_switch(monkeypatch):
    """Paged K/V maps are encoded only when the kernels are built with FA_SM90_PAGED_TMA (on
    by default), and only for page sizes the kernel loads by TMA; Q comes by TMA always."""
    values = dict(head_dim=128, num_heads=8, h_per_kv=2, total_q=100, k_rows=50, page_size=16,
                  q_head_stride=128, q_row_stride=1024, k_head_stride=128, k_row_stride=512,
                  k_page_stride=8192)
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", "FA_SM90_PAGED_TMA=0")
    q, k, v = fwd_geometries(values, 128, 128, paged=True)
    assert k is None and v is None and list(q.box) == [64, 1, 128] and list(q.dims) == [128, 8, 100]
    monkeypatch.delenv("CUPY_FLASHATTN_SM90_DEFINES", raising=False)
    q, k, v = fwd_geometries(values, 128, 128, paged=True)
    assert k is v and k.rank == 4 and list(k.dims) == [128, 4, 16, 50]
    assert list(k.strides) == [256, 1024, 16384] and list(k.box) == [64, 1, 16, 1]
    for page in (1, 7, 48):  # gathered by cp.async: no K / V map
        assert fwd_geometries(dict(values, page_size=page), 128, 128, paged=True)[1:] == (None, None)
    assert list(fwd_geometries(dict(values, page_size=256), 128, 128, paged=True)[1].box) == [64, 1, 128, 1]
    assert list(fwd_geometries(dict(values, page_size=256), 128, 80, paged=True)[1].box) == [64, 1, 16, 1]


def test_paged_tma_takes_power_of_two_pages_in_boxes_that_never_cross_a_page():
    """The host's copy of the kernel's rule (flash_fwd.cu paged_tma_ok, PagedBoxes): whole
    8-row boxes, P a power of two (the producer finds a box's issuer and its row in the page
    with masks, not divides); other sizes gather.  A box is P rows, at most the largest power of
    two dividing the key tile, so it starts at a multiple of its height inside one page --
    D = 256's 80-key tiles take 16-row boxes, 5 per column block, from any such page."""
    from cupy_flashattn._cuda.tma import paged_box_rows, paged_tma_ok

    assert [p for p in range(1, 1100) if paged_tma_ok(p)] == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert [paged_box_rows(p, 128) for p in (8, 16, 64, 128, 256)] == [8, 16, 64, 128, 128]
    assert [paged_box_rows(p, 64) for p in (8, 32, 256)] == [8, 32, 64]
    assert [paged_box_rows(p, 80) for p in (8, 16, 32, 256)] == [8, 16, 16, 16]
    for block_n in (64, 80, 96, 128):  # every box of every tile lies in one page
        for p in (8, 16, 32, 64, 128, 256):
            rows = paged_box_rows(p, block_n)
            assert block_n % rows == 0 and p % rows == 0
