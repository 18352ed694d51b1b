"""``PagedKVCache``: a page pool for K and V, a free-page allocator and per-sequence block tables.

The bookkeeping (which pages a sequence owns, how many tokens it holds) is plain host-side
Python: it changes once per ``append``/``free`` call, is tiny, and keeping it on the host means
the cache never has to read a device array to decide where tokens go.  Only the token data lives
on the device, and each ``append`` writes it with one vectorized scatter per pool.
"""

from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass, field

import numpy as np

from ._arrays import BFLOAT16, array_module, dtype_name
from ._rules import page_and_row
from .errors import (
    ArgumentError,
    CacheExhaustedError,
    DeviceError,
    DTypeError,
    SeqlenError,
    ShapeError,
    UnsupportedError,
    explain,
)
from .fp8 import FP8_DTYPES, FP8_NAMES, device_scale, gpu_rules, is_fp8, quantize, refuse_scales
from .validate import MAX_HEAD_DIM, gpu_head_dim, writable

__all__ = ["PagedKVCache", "DecodeSteps"]

#: Float dtypes a cache can hold (each attended at its own precision, on either backend); an FP8
#: cache takes new tokens in any of them and quantizes them.
_FLOAT_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))
#: Every cache dtype: the float ones and the float8 formats (FP8 caches with scales, fp8.py,
#: on the CPU backend so far).
_DTYPES = _FLOAT_DTYPES + FP8_DTYPES


@dataclass
class _Sequence:
    """Host-side state of one sequence: the pages it owns, in logical order, and its length."""

    pages: list[int] = field(default_factory=list)
    length: int = 0


def _fill_table(table: np.ndarray, seqs) -> None:
    """Row b of a zeroed host ``table`` (at least as wide as the longest sequence) gets the
    pages of ``seqs[b]`` in logical order; the rest stays 0 (a valid page id)."""
    for row, seq in zip(table, seqs):
        row[: len(seq.pages)] = seq.pages


def _shape(a) -> str:
    return "(" + ", ".join(str(int(s)) for s in a.shape) + ")"


# -- constructor checks ---------------------------------------------------------------------


def _positive_int(name: str, value) -> int:
    # bool is an Integral too, but PagedKVCache(True, ...) is certainly a mistake.
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise explain(
            DTypeError, name, "must be an int", "an int >= 1", repr(value),
            f"pass {name} as a Python int, e.g. {name}=int(...)",
        )
    if value < 1:
        raise explain(
            ArgumentError, name, "must be at least 1", ">= 1", int(value), f"pass {name} >= 1",
        )
    return int(value)


def _head_dim(value) -> int:
    head_dim = _positive_int("head_dim", value)
    if head_dim > MAX_HEAD_DIM:
        # Refused here rather than at the first attention call, after the pools were allocated
        # and filled.
        raise explain(
            UnsupportedError, "head_dim",
            f"head dims above {MAX_HEAD_DIM} are not supported (candle's paged limit)",
            f"1 <= head_dim <= {MAX_HEAD_DIM}", head_dim,
            "split each head into several heads of at most "
            f"{MAX_HEAD_DIM} dims (e.g. num_heads_k * 2 heads of head_dim // 2), or project to a "
            "smaller head dim",
        )
    return head_dim


def _cache_dtype(dtype) -> np.dtype:
    # The string "bfloat16" only resolves through ml_dtypes, so map it explicitly.  None is
    # refused before np.dtype, which would read it as float64 (and np.dtype(x) == None is True
    # for float64, so a `None in _DTYPES` test cannot be trusted either).
    names = {"bfloat16": BFLOAT16, **FP8_NAMES}
    try:
        dt = names[dtype] if isinstance(dtype, str) and dtype in names else np.dtype(dtype)
    except TypeError:
        dt = None
    if dtype is None or dt is None or dt not in _DTYPES:
        raise explain(
            DTypeError, "dtype", "unsupported cache dtype",
            "one of float16, bfloat16 (ml_dtypes.bfloat16), float32, float64, float8_e4m3fn / "
            "float8_e5m2 ('fp8', 'fp8_e5m2')", repr(dtype),
            "pass dtype=numpy.float16, ml_dtypes.bfloat16, numpy.float32, numpy.float64 or 'fp8'",
        )
    return dt


def _array_library(xp):
    if xp is None:
        return np
    if getattr(xp, "__name__", None) not in ("numpy", "cupy"):
        raise explain(
            DeviceError, "xp", "must be the numpy or the cupy module", "numpy or cupy", repr(xp),
            "pass xp=numpy (CPU pool) or xp=cupy (GPU pool on the current device)",
        )
    return xp


class PagedKVCache:
    """A paged K/V cache (vLLM / FlashInfer / flash-attn ``block_table`` layout)::

        block_table (B, max_blocks_per_seq) int32     k_pages, v_pages
        seq b: [ 7, 2, 5, 0, 0 ...]     // [num_blocks, page_block_size, num_heads_k, head_dim]
                 |  |  |  '-- unused (0)
                 |  |  '----- positions 2P..3P-1  -> page 5, rows 0..P-1
                 |  '-------- positions  P..2P-1  -> page 2, rows 0..P-1
                 '----------- positions  0..P-1   -> page 7, rows 0..P-1 (each (Hk, D))
        token p of sequence b is k_pages[block_table[b, p // P], p % P]  (P = page_block_size)

    Pages are handed out from a free list as sequences grow and return to it on :meth:`free`, so
    the pool is shared by all sequences without fragmentation.  Unused block-table entries are 0,
    a valid page id, so a kernel that reads one by mistake never sees garbage.

    The page size cannot drift from the kernel's: the attention functions read it from
    ``k_pages.shape[1]`` (pass ``cache.k_pages``/``cache.v_pages`` with ``cache.block_table(...)``
    and ``cache.seqlens(...)`` and leave ``page_block_size`` unset), so there is no second constant
    to keep in sync.

    Args:
        num_blocks: number of pages in the pool (int >= 1).
        page_block_size: tokens per page, P (int >= 1; any size works, flash-attn uses 256,
            vLLM 8/16/32).
        num_heads_k: key/value heads, Hk.
        head_dim: head dimension, D (1 .. 512; float64 on the GPU 1 .. 128).
        dtype: float16, bfloat16 (``ml_dtypes.bfloat16`` or ``"bfloat16"``), float32, float64,
            or an FP8 cache: ``ml_dtypes.float8_e4m3fn`` (``"fp8"``, ``"fp8_e4m3"``) or
            ``float8_e5m2`` (``"fp8_e5m2"``), vLLM's ``kv_cache_dtype``; on the GPU with a head
            dim that is a multiple of 16 up to 256 and float16 / bfloat16 queries.
        k_scale, v_scale: an FP8 cache's scales, a float or float32 ``(Hk,)`` per kv head
            (default 1.0): :meth:`append` stores ``fp8(clip(k / k_scale))`` (saturating at the
            format's largest value) and attention through the cache reads
            ``float(k8) * k_scale`` -- the cache hands its scales to every call, so they
            cannot disagree.  Only for FP8 dtypes.
        max_blocks_per_seq: pages one sequence may own, i.e. the width of :meth:`block_table`;
            defaults to ``num_blocks``.
        xp: ``numpy`` (default) or ``cupy``; the pools are allocated, zero-filled, with it (on the
            current CUDA device for CuPy).

    Attributes:
        k_pages, v_pages: the pools, ``(num_blocks, page_block_size, num_heads_k, head_dim)``.
    """

    def __init__(
        self,
        num_blocks,
        page_block_size,
        num_heads_k,
        head_dim,
        dtype,
        *,
        max_blocks_per_seq=None,
        xp=None,
        k_scale=None,
        v_scale=None,
    ):
        self._num_blocks = _positive_int("num_blocks", num_blocks)
        self._page_block_size = _positive_int("page_block_size", page_block_size)
        num_heads_k = _positive_int("num_heads_k", num_heads_k)
        head_dim = _head_dim(head_dim)
        self._max_blocks_per_seq = (
            self._num_blocks
            if max_blocks_per_seq is None
            else _positive_int("max_blocks_per_seq", max_blocks_per_seq)
        )
        self._dtype = _cache_dtype(dtype)
        self._xp = _array_library(xp)
        self._k_scale = self._v_scale = None
        if is_fp8(self._dtype):
            if self._xp is not np:  # refused now, not at the first call after filling the pools
                gpu_rules("head_dim", head_dim)
            self._k_scale = device_scale("k_scale", k_scale, int(num_heads_k), self._xp)
            self._v_scale = device_scale("v_scale", v_scale, int(num_heads_k), self._xp)
        else:
            refuse_scales(k_scale, v_scale, "scales belong to FP8 caches only",
                          f"None with dtype {dtype_name(self._dtype)}",
                          "drop {name}, or make the cache with dtype='fp8'")
        # Refused here rather than at the first attention call, after the pools were filled.
        gpu_head_dim(head_dim, self._xp is not np, "head_dim", self._dtype)
        shape = (self._num_blocks, self._page_block_size, num_heads_k, head_dim)
        # A float8 cache's format, handed to every call as kv_cache_dtype (None otherwise).
        # CuPy has no float8 dtype: on the GPU the pools hold the float8 values' uint8 bytes.
        self._kv_cache_dtype = self._dtype if is_fp8(self._dtype) else None
        storage = np.uint8 if self._kv_cache_dtype is not None and self._xp is not np else self._dtype
        self.k_pages = self._xp.zeros(shape, dtype=storage)
        self.v_pages = self._xp.zeros(shape, dtype=storage)
        # A stack: pop() hands out pages 0, 1, 2... of a fresh pool in order, and the pages
        # freed last are reused first.
        self._free: list[int] = list(range(self._num_blocks - 1, -1, -1))
        self._seqs: dict[int, _Sequence] = {}  # insertion order = creation order
        self._next_id = 0  # ids are never reused, so a stale id cannot alias a new sequence

    # -- properties: read-only facts of the pool --------------------------------------------

    num_blocks = property(lambda self: self._num_blocks, doc="Pages in the pool (int).")
    page_block_size = property(lambda self: self._page_block_size, doc="Token rows per page (int).")
    num_heads_k = property(lambda self: int(self.k_pages.shape[2]), doc="KV heads (int).")
    head_dim = property(lambda self: int(self.k_pages.shape[3]), doc="Head dimension (int).")
    dtype = property(lambda self: self._dtype,
                     doc="Element type of the pools (numpy dtype; a float8 format for an FP8 "
                         "cache, whose GPU pools hold its uint8 bytes).")
    k_scale = property(lambda self: self._k_scale,
                       doc="FP8 caches: the keys' float32 (Hk,) scales, an array of the "
                           "cache's library (None otherwise).")
    v_scale = property(lambda self: self._v_scale,
                       doc="FP8 caches: the values' float32 (Hk,) scales (None otherwise).")
    max_blocks_per_seq = property(lambda self: self._max_blocks_per_seq,
                                  doc="Pages one sequence may hold (int).")
    num_free_blocks = property(lambda self: len(self._free),
                               doc="Pages that no sequence holds (int).")

    @property
    def xp(self):
        """The array module of the pools (numpy or cupy)."""
        return self._xp

    @property
    def seq_ids(self) -> list[int]:
        """Active sequence ids, in creation order."""
        return list(self._seqs)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_blocks={self._num_blocks}, page_block_size={self._page_block_size}, "
            f"num_heads_k={self.num_heads_k}, head_dim={self.head_dim}, "
            f"dtype={dtype_name(self._dtype)}, xp={self._xp.__name__}, "
            f"sequences={len(self._seqs)}, free_blocks={len(self._free)})"
        )

    # -- sequences -------------------------------------------------------------------------

    def add_sequence(self) -> int:
        """Register an empty sequence and return its id (pages are allocated on append)."""
        seq_id = self._next_id
        self._next_id += 1
        self._seqs[seq_id] = _Sequence()
        return seq_id

    def free(self, seq_id) -> None:
        """Forget sequence ``seq_id`` and return its pages to the free list."""
        seq = self._lookup("seq_id", seq_id)
        # Reversed so that the next pop() hands the sequence's first page out first again.
        self._free.extend(reversed(seq.pages))
        del self._seqs[int(seq_id)]

    def _lookup(self, name: str, seq_id) -> _Sequence:
        if (
            not isinstance(seq_id, numbers.Integral)
            or isinstance(seq_id, bool)
            or int(seq_id) not in self._seqs
        ):
            raise explain(
                ArgumentError, name, "unknown sequence id",
                f"an active id ({self._describe_ids()})", repr(seq_id),
                "call cache.add_sequence() to create a sequence "
                "(ids of freed sequences are not reused)",
            )
        return self._seqs[int(seq_id)]

    def _describe_ids(self) -> str:
        ids = list(self._seqs)
        if not ids:
            return "none are active"
        shown = ", ".join(str(i) for i in ids[:8])
        return f"one of {shown}" + (", ..." if len(ids) > 8 else "")

    def _sequences(self, seq_ids) -> list[_Sequence]:
        """The states of ``seq_ids`` (an int, or a sequence of distinct active ids)."""
        ids = [seq_ids] if isinstance(seq_ids, numbers.Integral) else list(seq_ids)
        seqs = [self._lookup(f"seq_ids[{i}]", s) for i, s in enumerate(ids)]
        if len({int(s) for s in ids}) != len(ids):
            # Duplicates would make two block-table rows alias one sequence and, on append,
            # write two tokens into one slot.
            raise explain(
                ArgumentError, "seq_ids", "lists a sequence more than once", "distinct ids",
                [int(s) for s in ids], "pass each sequence id once per call",
            )
        return seqs

    # -- device views of the bookkeeping ---------------------------------------------------

    def block_table(self, seq_ids=None):
        """int32 ``(B, max_blocks_per_seq)`` block table of ``seq_ids`` (default: all active
        sequences in creation order), on the cache's device.  Unused entries are 0.

        Built fresh on each call (one host-to-device copy), so it can never be stale; call it
        again after ``append``/``free``."""
        seqs = self._sequences(self.seq_ids if seq_ids is None else seq_ids)
        table = np.zeros((len(seqs), self._max_blocks_per_seq), dtype=np.int32)
        _fill_table(table, seqs)
        return self._xp.asarray(table)

    def seqlens(self, seq_ids=None):
        """int32 ``(B,)`` token counts of ``seq_ids`` (default: all active sequences), on the
        cache's device; use as ``cache_seqlens``/``seqused_k``."""
        seqs = self._sequences(self.seq_ids if seq_ids is None else seq_ids)
        return self._xp.asarray(np.array([s.length for s in seqs], dtype=np.int32))

    def _table_width(self, seqs) -> int:
        """Block-table width for a call over ``seqs``: as wide as the longest sequence needs,
        rounded up to a power of two (capped at ``max_blocks_per_seq``): a call over short
        sequences does not upload ``max_blocks_per_seq`` entries per row, and the width -- part
        of the call signature that selects a cached launch plan -- changes only when a sequence
        doubles."""
        used = max((len(s.pages) for s in seqs), default=0)
        return min(self._max_blocks_per_seq, 1 << max(0, used - 1).bit_length())

    def _upload_tables(self, seqs, tail):
        """Device ``(block_table, tail)`` from ONE host-to-device copy of the table of ``seqs``
        followed by the int32 values ``tail`` (a call pays one transfer, not one per array)."""
        batch, width = len(seqs), self._table_width(seqs)
        host = np.zeros(batch * width + len(tail), dtype=np.int32)
        _fill_table(host[: batch * width].reshape(batch, width), seqs)
        host[batch * width :] = tail
        dev = self._xp.asarray(host)
        return dev[: batch * width].reshape(batch, width), dev[batch * width :]

    def _step_tables(self, seqs):
        """Device ``(block_table, seqlens)`` of ``seqs`` for one decode step (one upload)."""
        return self._upload_tables(seqs, [s.length for s in seqs])

    def _varlen_tables(self, seqs):
        """Device ``(block_table, cu_seqlens_k)`` of ``seqs`` for a varlen call (one upload;
        the cumulative lengths are summed on the host, where the lengths live)."""
        cu = np.zeros(len(seqs) + 1, dtype=np.int64)
        cu[1:] = np.cumsum([s.length for s in seqs])
        if cu[-1] > np.iinfo(np.int32).max:
            raise explain(
                SeqlenError, "seq_ids", "hold more cached tokens than int32 cu_seqlens_k can count",
                f"at most {np.iinfo(np.int32).max} tokens in one call", f"{int(cu[-1])} tokens",
                "attend over fewer sequences per call",
            )
        return self._upload_tables(seqs, cu)

    def plan_decode_steps(self, seq_ids=None, new_tokens: int = 1) -> "DecodeSteps":
        """Fixed device buffers for a decode loop that appends ``new_tokens`` per step to
        ``seq_ids`` (default: all active sequences) -- what a CUDA-graph loop captures.  See
        :class:`DecodeSteps`."""
        return DecodeSteps(self, self.seq_ids if seq_ids is None else seq_ids, new_tokens)

    @contextlib.contextmanager
    def _growing(self, seqs, counts):
        """The one transaction by which sequences grow: pages for ``counts`` more tokens are
        reserved (``CacheExhaustedError`` before anything changes), the body writes the tokens
        (or launches what writes them), and only when it returns do the lengths move.  If it
        raises, the pages go back and the cache is as it was; whatever was written landed in
        free pages or past a sequence's length, where nothing reads it.  Yields the pages each
        sequence received."""
        added = self._reserve(seqs, counts)
        try:
            yield added
        except BaseException:
            self._release(seqs, added)
            raise
        for seq, n in zip(seqs, counts):
            seq.length += int(n)

    def _release(self, seqs, added) -> None:
        """Undo :meth:`_reserve` (``added``: what it returned)."""
        for seq, pages in zip(seqs, added):
            del seq.pages[len(seq.pages) - len(pages) :]
            self._free.extend(reversed(pages))

    # -- append ----------------------------------------------------------------------------

    def append(self, seq_ids, k_new, v_new, cu_seqlens=None) -> None:
        """Append new tokens' keys and values to sequences, allocating pages as they grow.

        Args:
            seq_ids: B distinct active sequence ids (an int means ``[id]``).
            k_new, v_new: ``(B, S_new, Hk, D)`` (S_new tokens for every sequence) or, with
                ``cu_seqlens``, packed ``(total_new, Hk, D)``; same dtype and array library as
                the cache.
            cu_seqlens: int ``(B + 1,)`` cumulative token counts into the packed rows: sequence
                ``seq_ids[b]`` gets rows ``cu_seqlens[b]:cu_seqlens[b+1]``.  A list or NumPy
                array; a CuPy array is accepted too but is copied to the host (a sync).

        Raises:
            CacheExhaustedError: the free pages cannot hold the new tokens, or a sequence would
                need more than ``max_blocks_per_seq`` pages.  The cache is then left exactly as
                it was (nothing allocated, nothing written).
        """
        seqs = self._sequences(seq_ids)
        counts = self._new_token_counts(k_new, v_new, cu_seqlens, len(seqs))
        for name, pool in (("cache.k_pages", self.k_pages), ("cache.v_pages", self.v_pages)):
            writable(name, pool, f"make the pool writeable again ({name}.flags.writeable = True, "
                                 "or copy it) before appending")
        with self._growing(seqs, counts):
            self._scatter(seqs, counts, k_new, v_new)

    def _new_token_counts(self, k_new, v_new, cu_seqlens, batch: int) -> np.ndarray:
        """Validate k_new/v_new (and cu_seqlens); return the int64 ``(B,)`` new-token counts."""
        self._check_new("k_new", k_new)
        self._check_new("v_new", v_new)
        if tuple(k_new.shape) != tuple(v_new.shape):
            raise explain(
                ShapeError, "v_new", "must have the same shape as k_new", _shape(k_new),
                _shape(v_new), "append one value row per key row",
            )
        hk_d = (self.num_heads_k, self.head_dim)
        dense = cu_seqlens is None  # (B, S_new, Hk, D), else packed (total_new, Hk, D)
        rank, mode, expected, fix = (
            (4, "a dense append (no cu_seqlens)", f"(B={batch}, S_new, {hk_d[0]}, {hk_d[1]})",
             "pass (B, S_new, num_heads_k, head_dim), or packed (total_new, num_heads_k, "
             "head_dim) together with cu_seqlens") if dense else
            (3, "a varlen append (with cu_seqlens)", f"(total_new, {hk_d[0]}, {hk_d[1]})",
             "pack the new tokens as (total_new, num_heads_k, head_dim), or drop cu_seqlens "
             "and pass (B, S_new, num_heads_k, head_dim)"))
        if k_new.ndim != rank or tuple(k_new.shape[rank - 2:]) != hk_d:
            raise explain(ShapeError, "k_new", f"has the wrong shape for {mode}", expected,
                          _shape(k_new), fix)
        if dense:
            if k_new.shape[0] != batch:
                raise explain(
                    ShapeError, "k_new", "batch size must match len(seq_ids)",
                    f"shape[0] == {batch}", _shape(k_new),
                    "give k_new one row of new tokens per sequence id",
                )
            return np.full(batch, k_new.shape[1], dtype=np.int64)
        return _counts_from_cu_seqlens(cu_seqlens, batch, int(k_new.shape[0]))

    def _check_new(self, name: str, a) -> None:
        xp = array_module(a)
        if xp is None:
            raise explain(
                DTypeError, name, "must be an array", f"a {self._xp.__name__} array",
                type(a).__name__, f"convert with {self._xp.__name__}.asarray({name})",
            )
        if xp is not self._xp:
            given = f"a {xp.__name__} array"
            raise explain(
                DeviceError, name, "is not in the cache's array library",
                f"a {self._xp.__name__} array", given,
                f"convert with {self._xp.__name__}.asarray({name})",
            )
        device = None if xp is np else self.k_pages.device.id
        if device is not None and a.device.id != device:
            raise explain(
                DeviceError, name, "is on another GPU than the cache", f"device {device}",
                f"device {a.device.id}", f"copy it under `with cupy.cuda.Device({device}):`",
            )
        if is_fp8(self._dtype):  # new tokens in a float dtype, quantized by _scatter
            if np.dtype(a.dtype) not in _FLOAT_DTYPES + (self._dtype, self.k_pages.dtype):
                raise explain(
                    DTypeError, name, "an FP8 cache takes new tokens as floats (quantized on "
                    "append) or already in its float8 format",
                    f"float16, bfloat16, float32, float64 or {dtype_name(self._dtype)}",
                    dtype_name(a.dtype), f"cast with {name}.astype(numpy.float32)",
                )
        elif np.dtype(a.dtype) != self._dtype:
            raise explain(
                DTypeError, name, "must have the cache's dtype", dtype_name(self._dtype),
                dtype_name(a.dtype), f"cast with {name}.astype(cache.dtype)",
            )

    def _new_pages(self, seqs, counts) -> list[int]:
        """Pages each sequence needs beyond the ones it owns to hold ``counts`` more tokens."""
        P = self._page_block_size
        return [max(0, -(-(s.length + int(n)) // P) - len(s.pages)) for s, n in zip(seqs, counts)]

    def _reserve(self, seqs, counts) -> list[list[int]]:
        """Check capacity, then move the needed pages from the free list to the sequences;
        returns the pages each sequence received."""
        needed = self._new_pages(seqs, counts)
        for b, (seq, n) in enumerate(zip(seqs, needed)):
            if len(seq.pages) + n > self._max_blocks_per_seq:
                tokens = seq.length + int(counts[b])
                raise explain(
                    CacheExhaustedError, f"seq_ids[{b}]",
                    f"{tokens} tokens need {len(seq.pages) + n} pages of {self._page_block_size}, "
                    "more than one sequence may own",
                    f"at most max_blocks_per_seq={self._max_blocks_per_seq} pages",
                    f"{len(seq.pages) + n} pages",
                    "create the cache with a larger max_blocks_per_seq (or page_block_size), or "
                    "append fewer tokens to this sequence",
                )
        total = sum(needed)
        if total > len(self._free):
            raise explain(
                CacheExhaustedError, "k_new",
                "the page pool has too few free pages for this append",
                f"<= {len(self._free)} new pages (the free ones, of {self._num_blocks})",
                f"{total} new pages needed",
                f"free() finished sequences, or create the cache with num_blocks >= "
                f"{self._num_blocks - len(self._free) + total}",
            )
        added = []
        for seq, n in zip(seqs, needed):
            added.append([self._free.pop() for _ in range(n)])
            seq.pages.extend(added[-1])
        return added

    def _scatter(self, seqs, counts, k_new, v_new) -> None:
        """Write the new tokens into their slots.  CuPy with ``(B, S_new, Hk, D)`` tokens: the
        fused append kernel (``cuda_src/kv_cache.cu``, one launch for k and v, like vLLM's
        reshape_and_cache) reads the block table and the old lengths on the device; otherwise
        one fancy-index assignment per pool at host-computed (page, slot) destinations."""
        total = int(counts.sum())
        if total == 0:
            return
        if self._xp is not np and k_new.ndim == 4:
            from .rotary import append_kv_paged

            width = max(len(s.pages) for s in seqs)
            table = np.zeros((len(seqs), width), dtype=np.int32)
            _fill_table(table, seqs)
            lengths = np.array([s.length for s in seqs], dtype=np.int32)
            append_kv_paged(self.k_pages, self.v_pages, self._xp.asarray(table), k_new, v_new,
                            self._xp.asarray(lengths), k_scale=self._k_scale,
                            v_scale=self._v_scale, kv_cache_dtype=self._kv_cache_dtype)
            return
        pages, slots = self._destinations(seqs, counts)
        # Dense (B, S_new, Hk, D) rows are already in (b, i) order: flatten to (total, Hk, D).
        k_rows = k_new.reshape(total, *k_new.shape[-2:])
        v_rows = v_new.reshape(total, *v_new.shape[-2:])
        if self._xp is not np and is_fp8(self._dtype) and np.dtype(k_rows.dtype) in _FLOAT_DTYPES:
            # Packed float rows into a float8 pool on the GPU: the quantizing append kernel, with
            # each token as a sequence of one new row whose one-page table row is its page and
            # whose length so far is its slot (position = slot < page_block_size).
            from .rotary import append_kv_paged

            xp = self._xp
            append_kv_paged(self.k_pages, self.v_pages,
                            xp.asarray(pages.astype(np.int32)[:, None]),
                            k_rows[:, None], v_rows[:, None], xp.asarray(slots.astype(np.int32)),
                            k_scale=self._k_scale, v_scale=self._v_scale,
                            kv_cache_dtype=self._kv_cache_dtype)
            return
        if is_fp8(self._dtype):
            if np.dtype(k_rows.dtype) in _FLOAT_DTYPES:
                k_rows = quantize(k_rows, self._k_scale, self._dtype)
            if np.dtype(v_rows.dtype) in _FLOAT_DTYPES:
                v_rows = quantize(v_rows, self._v_scale, self._dtype)
        pages, slots = self._xp.asarray(pages), self._xp.asarray(slots)
        self.k_pages[pages, slots] = k_rows
        self.v_pages[pages, slots] = v_rows

    def _destinations(self, seqs, counts):
        """Host int64 ``(page, slot)`` of every new token, sequence-major (the order of k_new)."""
        P = self._page_block_size
        batch = len(seqs)
        lengths = np.array([s.length for s in seqs], dtype=np.int64)
        width = max(len(s.pages) for s in seqs)
        table = np.zeros((batch, width), dtype=np.int64)
        _fill_table(table, seqs)
        seq_of_token = np.repeat(np.arange(batch), counts)
        starts = np.cumsum(counts) - counts  # first packed row of each sequence
        pos = lengths[seq_of_token] + (np.arange(seq_of_token.size) - starts[seq_of_token])
        column, row = page_and_row(pos, P)
        return table[seq_of_token, column], row


def _counts_from_cu_seqlens(cu_seqlens, batch: int, total: int) -> np.ndarray:
    """Host int64 ``(B,)`` lengths from a validated cu_seqlens ``(B+1,)`` ending at ``total``."""
    if hasattr(cu_seqlens, "get") and not isinstance(cu_seqlens, np.ndarray):
        cu_seqlens = cu_seqlens.get()  # CuPy: documented host sync (the allocator runs on the host)
    cu = np.asarray(cu_seqlens)
    if cu.dtype.kind not in "iu":
        raise explain(
            DTypeError, "cu_seqlens", "must hold integers", "an int32 array or a list of ints",
            f"dtype {cu.dtype}", "build it with numpy.cumsum over int lengths (int32)",
        )
    if cu.ndim != 1 or cu.shape[0] != batch + 1:
        raise explain(
            SeqlenError, "cu_seqlens", "must hold len(seq_ids) + 1 cumulative offsets",
            f"shape ({batch + 1},)", f"shape {tuple(cu.shape)}",
            "build it as [0, n_0, n_0 + n_1, ...] with one count per sequence id",
        )
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise explain(
            SeqlenError, "cu_seqlens", "must start at 0", "0", int(cu[0]),
            "prepend 0: cu_seqlens = concatenate([[0], cumsum(counts)])",
        )
    steps = np.diff(cu)
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise explain(
            SeqlenError, "cu_seqlens", f"must be non-decreasing (entry {b + 1} is below entry {b})",
            f">= {int(cu[b])}", int(cu[b + 1]), "build it with a cumulative sum of counts >= 0",
        )
    if cu[-1] != total:
        raise explain(
            SeqlenError, "cu_seqlens", "must end at the number of packed rows of k_new",
            total, int(cu[-1]), "the last entry is k_new.shape[0]",
        )
    return steps


class DecodeSteps:
    """A decode loop's block table and lengths in FIXED device buffers (FlashInfer's plan/run
    split), so that the attention call of a step can be captured once in a CUDA graph and
    replayed every step::

        steps = cache.plan_decode_steps(seq_ids, new_tokens=1)      # once per batch
        for token in ...:
            steps.advance()          # host: pages for this step's tokens; the table and the
                                     # lengths before the step into the fixed buffers
            out = flash_attn_with_kvcache(q, cache.k_pages, cache.v_pages, k=k_new, v=v_new,
                                          cache_seqlens=steps.cache_seqlens,
                                          block_table=steps.block_table, causal=True)

    The attention call reads only ``steps.block_table`` (B, max_blocks_per_seq) and
    ``steps.cache_seqlens`` (B,), whose addresses never change, and appends ``k_new`` into the
    pages :meth:`advance` reserved; so a graph captured around it (after a first eager call of
    the same signature, which compiles and plans) replays correctly after each ``advance()``.
    ``advance()`` is host work plus one host-to-device copy on the current stream: call it
    outside the capture, on the stream the graph is launched on.

    Bookkeeping: ``advance()`` moves the lengths on the host as if the step's call had run (the
    cache's ``seqlens()`` include the new tokens).  It raises ``CacheExhaustedError`` before
    changing anything when the pool cannot hold the step; if the attention call that follows
    fails, call :meth:`undo` to give the step's pages and tokens back.
    """

    def __init__(self, cache: PagedKVCache, seq_ids, new_tokens: int):
        self.cache = cache
        ids = [seq_ids] if isinstance(seq_ids, numbers.Integral) else list(seq_ids)
        cache._sequences(ids)  # unknown or repeated ids raise here
        self.seq_ids = [int(s) for s in ids]
        self.new_tokens = _positive_int("new_tokens", new_tokens)
        batch, width = len(self.seq_ids), cache.max_blocks_per_seq
        self._host = np.zeros(batch * width + batch, dtype=np.int32)
        self._device = cache.xp.zeros(batch * width + batch, dtype=np.int32)
        #: int32 (B, max_blocks_per_seq) block table on the cache's device (fixed address)
        self.block_table = self._device[: batch * width].reshape(batch, width)
        #: int32 (B,) lengths before the current step (fixed address): ``cache_seqlens``
        self.cache_seqlens = self._device[batch * width :]
        self._last = None  # (seqs, pages added) of the last advance(), for undo()

    def advance(self) -> "DecodeSteps":
        """Reserve pages for the next step and write the table and lengths (one copy)."""
        cache = self.cache
        seqs = cache._sequences(self.seq_ids)  # a freed sequence raises here
        batch, width = len(seqs), cache.max_blocks_per_seq
        with cache._growing(seqs, np.full(batch, self.new_tokens, dtype=np.int64)) as added:
            host = self._host
            host[:] = 0
            _fill_table(host[: batch * width].reshape(batch, width), seqs)
            host[batch * width :] = [seq.length for seq in seqs]  # before the step
            if cache.xp is np:
                self._device[...] = host
            else:
                # Pageable host memory: the driver stages the bytes before set() returns, so
                # the host buffer may be rewritten by the next advance() at once.
                self._device.set(host)
        self._last = (seqs, added)
        return self

    def undo(self) -> None:
        """Give back the pages and tokens of the last :meth:`advance` (its attention call
        failed or was not made).  The device buffers keep the step's table, which stays valid."""
        if self._last is None:
            return
        seqs, added = self._last
        for seq in seqs:
            seq.length -= self.new_tokens
        self.cache._release(seqs, added)
        self._last = None
