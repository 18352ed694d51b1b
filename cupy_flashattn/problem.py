"""The one normalized form every backend consumes.

The public functions accept flash-attn's many layouts (dense, varlen, paged, a KV cache with
batch indices and left padding).  ``api.py`` validates them and lowers each call to one
:class:`AttentionProblem`, whose fields mirror flash-attn's ``Flash_fwd_params``.  The CPU
backend (``_backend_cpu.py``) and the CUDA kernels (``cuda_src/attn/block_info.cuh``) then resolve
each sequence's rows with the *same* rules, written once here in :func:`resolve_sequence`
(a host-side twin used by tests and by the CPU backend):

Queries, sequence ``b``::

    q_start = cu_seqlens_q[b]                  if cu_seqlens_q is not None else b * seqlen_q
    len_q   = cu_seqlens_q[b+1] - cu_seqlens_q[b]  if cu_seqlens_q is not None else seqlen_q

Keys, sequence ``b`` (``k_start`` is a row of the flat ``(rows, Hk, D)`` view; paged caches
ignore it and map positions through the block table)::

    if cu_seqlens_k is not None:  k_start = cu_seqlens_k[b];  base_len = cu_seqlens_k[b+1] - cu_seqlens_k[b]
    else:                         k_start = (cache_batch_idx[b] if given else b) * seqlen_k;  base_len = seqlen_k
    len_k = seqused_k[b] + seqused_k_add if seqused_k is not None else base_len
    if leftpad_k is not None:     k_start += leftpad_k[b];  len_k -= leftpad_k[b]

Paged: logical key position ``p`` of sequence ``b`` is row ``p % P`` of page
``block_table[b, p // P]`` in ``k`` of shape ``(num_blocks, P, Hk, D)``.

Masks (bottom-right aligned): with ``shift = len_k - len_q``, query ``i`` sees key ``j`` iff
``(window_left < 0 or j >= i + shift - window_left) and (window_right < 0 or j <= i + shift + window_right)``.
Causal is ``window_right = 0``.  Logits: ``s = scale * q.k``; ``s = softcap * tanh(s / softcap)`` if
softcap > 0; ``s -= slope[b, h] * |i + shift - j|`` with ALiBi.  A row with no visible key outputs
0 and LSE +inf.  Sinks: ``sinks[h]`` (a logit, neither scaled nor capped) joins every row's softmax
denominator with no value vector; the LSE includes it, and a row with no visible key then outputs
0 with LSE ``sinks[h]``.

Guards: the kernels clamp every resolved range to the arrays they were given (``total_q``,
``k_rows``, ``max_blocks_per_seq * P``) and treat a page id outside ``[0, num_blocks)`` as
absent, so even inconsistent metadata that validation could not see without a host sync never
causes an out-of-bounds access.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np


@dataclass
class AttentionProblem:
    """A validated attention call, in flash-attn's parameter vocabulary.

    Arrays belong to one array module (NumPy for the CPU backend, CuPy for CUDA).  Index arrays
    are int32 and contiguous.  ``q``/``out`` may be strided views but their last dim has stride 1.
    """

    # -- tensors -----------------------------------------------------------------------------
    q: Any  # (total_q, H, D)
    k: Any  # contiguous: (k_rows, Hk, D); paged: (num_blocks, P, Hk, D)
    v: Any  # same layout as k
    out: Any  # (total_q, H, D), written by the backend
    softmax_lse: Any  # float32 (H, total_q), written by the backend

    # -- batch geometry ----------------------------------------------------------------------
    batch_size: int
    seqlen_q: int  # dense Sq (ignored when cu_seqlens_q is given)
    seqlen_k: int  # dense Sk / cache capacity per sequence (ignored when cu_seqlens_k is given)
    max_seqlen_q: int  # host-side upper bound on len_q, sizes the grid
    max_seqlen_k: int  # host-side upper bound on len_k
    cu_seqlens_q: Optional[Any] = None  # int32 (B+1,)
    cu_seqlens_k: Optional[Any] = None  # int32 (B+1,)
    seqused_k: Optional[Any] = None  # int32 (B,)
    seqused_k_add: int = 0  # added to every seqused_k[b] (with_kvcache: the appended tokens)
    cache_batch_idx: Optional[Any] = None  # int32 (B,)
    leftpad_k: Optional[Any] = None  # int32 (B,)

    # -- paged KV ----------------------------------------------------------------------------
    block_table: Optional[Any] = None  # int32 (B, max_blocks_per_seq)
    page_block_size: int = 0  # P; 0 when k/v are contiguous

    # -- logits and masks --------------------------------------------------------------------
    softmax_scale: float = 1.0
    window_left: int = -1  # -1 = unlimited
    window_right: int = -1  # -1 = unlimited; causal = 0
    softcap: float = 0.0
    alibi_slopes: Optional[Any] = None  # float32 (B, H) (api broadcasts (H,) to (B, H))
    # float32 (H,): per-head sink logit (natural units, not scaled), one more softmax term
    # exp(sinks[h]) with no value vector: out = sum_j p_j v_j / (sum_j p_j + exp(sinks[h] - m))
    sinks: Optional[Any] = None
    # int32 (B, max_ranges, 2): candle's mm_prefix_ranges, [start, end) key positions per
    # sequence, sorted and disjoint (unused: start >= end); a query whose diagonal i + shift lies
    # in a range also sees every key of it (bidirectional image tokens in a causal prompt).
    mm_prefix_ranges: Optional[Any] = None
    # float32 (Hk,) NumPy: dequantization scales of float8 k / v (fp8.py; None otherwise):
    # the keys are float(k) * k_scale[h], the values float(v) * v_scale[h].
    k_scale: Optional[Any] = None
    v_scale: Optional[Any] = None
    # The float8 format (ml_dtypes float8_e4m3fn / float8_e5m2) of k / v given as uint8 bytes
    # with kv_cache_dtype -- CuPy has no float8 dtype, so a GPU float8 cache is bytes -- or None
    # (k / v then carry their own dtype, float8 ones included on NumPy).  See kv_float8.
    kv_dtype: Optional[Any] = None

    # -- scheduling hints --------------------------------------------------------------------
    num_splits: int = 0  # split-KV factor for decode (0 = the backend chooses)
    # True when nobody reads softmax_lse (the caller did not ask for it): a backend may then
    # leave it in another order -- the swapped MQA decode's one-split launch writes it (B, H)
    # instead of (H, B) and so needs no combine kernel (_cuda/decode_sm90.py).
    lse_unread: bool = False

    @classmethod
    def from_fields(cls, fields: dict, updates: dict) -> "AttentionProblem":
        """A problem whose fields are ``fields`` (every field, e.g. another problem's
        ``__dict__``) with ``updates`` applied, made without running ``__init__``: the cached
        calls (``_calls.py``) build one per execution from their fixed fields and the call's
        arrays, and ``__init__``'s keyword handling was most of that cost.  Equal to
        ``AttentionProblem(**{**fields, **updates})`` (the dataclass has no __post_init__)."""
        problem = cls.__new__(cls)
        d = problem.__dict__
        d.update(fields)
        d.update(updates)
        return problem

    @property
    def paged(self) -> bool:
        return self.block_table is not None

    @property
    def kv_float8(self):
        """The float8 format k / v hold (their own float8 dtype, or ``kv_dtype`` for uint8
        bytes), or None for 16/32/64-bit K/V."""
        from .fp8 import storage_format

        return storage_format(self.k.dtype, self.kv_dtype)

    @property
    def num_heads(self) -> int:
        return int(self.q.shape[1])

    @property
    def num_heads_k(self) -> int:
        return int(self.k.shape[-2])

    @property
    def head_dim(self) -> int:
        return int(self.q.shape[2])

    @property
    def total_q(self) -> int:
        return int(self.q.shape[0])

    @property
    def is_causal(self) -> bool:
        return self.window_right == 0 and self.window_left < 0


def _host(a):
    """A host (NumPy) copy of an index array, or None."""
    if a is None:
        return None
    if isinstance(a, np.ndarray):
        return a
    return a.get()  # CuPy


def resolve_sequence(p: AttentionProblem, b: int):
    """Host-side twin of ``block_info.cuh``: ``(q_start, len_q, k_start, len_k)`` of sequence b,
    clamped exactly as the kernels clamp them."""
    cq, ck = _host(p.cu_seqlens_q), _host(p.cu_seqlens_k)
    used, bidx, lpad = _host(p.seqused_k), _host(p.cache_batch_idx), _host(p.leftpad_k)
    total_q = p.total_q
    if cq is not None:
        q_start = int(cq[b])
        len_q = int(cq[b + 1]) - q_start
    else:
        q_start, len_q = b * p.seqlen_q, p.seqlen_q
    q_start = min(max(q_start, 0), total_q)
    len_q = min(max(len_q, 0), total_q - q_start)

    if ck is not None:
        k_start = int(ck[b])
        len_k = int(ck[b + 1]) - k_start
    else:
        k_start = (int(bidx[b]) if bidx is not None else b) * p.seqlen_k
        len_k = p.seqlen_k
    if used is not None:
        len_k = int(used[b]) + p.seqused_k_add
    if lpad is not None:
        k_start += int(lpad[b])
        len_k -= int(lpad[b])
    if p.paged:
        k_start = 0
        capacity = p.block_table.shape[1] * p.page_block_size
    else:
        k_rows = p.k.shape[0]
        k_start = min(max(k_start, 0), k_rows)
        capacity = k_rows - k_start
    len_k = min(max(len_k, 0), capacity)
    return q_start, len_q, k_start, len_k
