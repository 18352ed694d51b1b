"""Validated calls: what a public function decided once, and how it runs on the arrays it is
given (allocate outputs, append, launch, shape the result).

``api.py`` validates a call's arguments and lowers it to one of these objects; ``execute`` then
does all the device work -- nothing in it raises on bad input, so a call that fails validation
writes nothing (no append, no output).  Because an object depends only on the signature of its
arguments (``_signature.py``), ``api.py`` keeps it in a cache and a repeated call goes straight
to ``execute``.  The backend's launch plan (kernel, grid, packed arguments; ``_cuda.plan_attention``)
is made on the first execution and kept here too.
"""

from __future__ import annotations

import numpy as np

from .problem import AttentionProblem

__all__ = ["DenseCall", "VarlenCall", "KVCacheCall"]


def _backend_run(xp, problem, plan):
    """Run ``problem`` on the backend of ``xp``; returns the backend plan to keep (CUDA)."""
    if xp is np:
        from . import _backend_cpu

        _backend_cpu.run_attention(problem)
        return None
    from . import _cuda

    return _cuda.run_attention(problem, plan)


class _Call:
    """Fields common to every entry point.

    ``fields``: the AttentionProblem's non-array fields (geometry, logits, masks);
    ``H, D``: query heads and head dim; ``alibi_shape``: the slopes broadcast to (B, H) (a
    stride-0 view: the kernels take strides, no copy is made)."""

    def __init__(self, xp, fields: dict, num_heads: int, head_dim: int, return_lse: bool):
        self.xp = xp
        self.fields = fields
        self.H = num_heads
        self.D = head_dim
        self.return_lse = return_lse
        self.plan = None

    def _alibi(self, slopes):
        if slopes is None:
            return None
        shape = (self.fields["batch_size"], self.H)
        if slopes.shape == shape:
            return slopes
        return self.xp.broadcast_to(slopes, shape)

    def _run(self, **arrays) -> AttentionProblem:
        problem = AttentionProblem(**arrays, **self.fields)
        self.plan = _backend_run(self.xp, problem, self.plan)
        return problem


class DenseCall(_Call):
    """flash_attn_func: q (B, Sq, H, D), k/v (B, Sk, Hk, D) viewed as token rows."""

    def __init__(self, xp, fields, num_heads, head_dim, return_lse, attn_probs, q_shape, k_shape):
        super().__init__(xp, fields, num_heads, head_dim, return_lse)
        self.attn_probs = attn_probs
        B, Sq = q_shape[0], q_shape[1]
        self.q_shape = q_shape
        self.q_rows = (B * Sq,) + tuple(q_shape[2:])
        self.k_rows = (k_shape[0] * k_shape[1],) + tuple(k_shape[2:])

    def execute(self, q, k, v, alibi_slopes, out):
        xp = self.xp
        q_rows = q.reshape(self.q_rows)
        out_rows = xp.empty(self.q_rows, dtype=q.dtype) if out is None else out.reshape(self.q_rows)
        lse = xp.empty((self.H, self.q_rows[0]), dtype=np.float32)
        self._run(q=q_rows, k=k.reshape(self.k_rows), v=v.reshape(self.k_rows), out=out_rows,
                  softmax_lse=lse, alibi_slopes=self._alibi(alibi_slopes))
        result = out if out is not None else out_rows.reshape(self.q_shape)
        if not (self.return_lse or self.attn_probs):
            return result
        B, Sq = self.q_shape[0], self.q_shape[1]
        lse = xp.ascontiguousarray(lse.reshape(self.H, B, Sq).transpose(1, 0, 2))
        return (result, lse, None) if self.attn_probs else (result, lse)


class VarlenCall(_Call):
    """flash_attn_varlen_func: packed q (total_q, H, D) with contiguous or paged k/v."""

    def __init__(self, xp, fields, num_heads, head_dim, return_lse, attn_probs):
        super().__init__(xp, fields, num_heads, head_dim, return_lse)
        self.attn_probs = attn_probs

    def execute(self, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
                out):
        xp = self.xp
        out_rows = xp.empty(q.shape, dtype=q.dtype) if out is None else out
        lse = xp.empty((self.H, q.shape[0]), dtype=np.float32)
        self._run(q=q, k=k, v=v, out=out_rows, softmax_lse=lse, cu_seqlens_q=cu_seqlens_q,
                  cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, block_table=block_table,
                  alibi_slopes=self._alibi(alibi_slopes))
        if self.attn_probs:
            return out_rows, lse, None
        return (out_rows, lse) if self.return_lse else out_rows


class KVCacheCall(_Call):
    """flash_attn_with_kvcache: rotate q and the new k, append k/v into the cache in place, then
    attend with ``seqused_k = cache_seqlens`` and ``seqused_k_add = S_new`` (the lengths after
    the append, without a device op computing them).

    ``seqlens``: the device array of a ``cache_seqlens`` given as an int (or None), made once;
    ``q_per_token``: rotary positions of the queries (see flash_attn_with_kvcache)."""

    def __init__(self, xp, fields, num_heads, head_dim, return_lse, *, q_shape, k_cache_rows,
                 paged, seqlens, rotary_interleaved, q_per_token):
        super().__init__(xp, fields, num_heads, head_dim, return_lse)
        self.q_shape = q_shape
        self.q_rows = (q_shape[0] * q_shape[1],) + tuple(q_shape[2:])
        self.k_cache_rows = k_cache_rows  # None when paged
        self.paged = paged
        self.seqlens = seqlens
        self.rotary_interleaved = rotary_interleaved
        self.q_per_token = q_per_token
        self.rope_plans: dict = {}  # the rotary/append kernel's launch plans (CuPy)

    def execute(self, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                cache_batch_idx, cache_leftpad, block_table, alibi_slopes, out):
        from . import rotary as rotary_ops

        xp = self.xp
        seqlens = self.seqlens if self.seqlens is not None else cache_seqlens
        if k is not None:
            q = rotary_ops.rotate_and_append(
                q, k_cache, v_cache, k, v, seqlens, cos=rotary_cos, sin=rotary_sin,
                interleaved=self.rotary_interleaved, q_per_token=self.q_per_token,
                cache_batch_idx=cache_batch_idx, block_table=block_table if self.paged else None,
                plans=self.rope_plans,
            )
        q_rows = q.reshape(self.q_rows)
        out_rows = xp.empty(self.q_rows, dtype=q.dtype) if out is None else out.reshape(self.q_rows)
        lse = xp.empty((self.H, self.q_rows[0]), dtype=np.float32)
        if self.paged:
            kc, vc = k_cache, v_cache
        else:
            kc, vc = k_cache.reshape(self.k_cache_rows), v_cache.reshape(self.k_cache_rows)
        self._run(q=q_rows, k=kc, v=vc, out=out_rows, softmax_lse=lse, seqused_k=seqlens,
                  cache_batch_idx=cache_batch_idx, leftpad_k=cache_leftpad,
                  block_table=block_table, alibi_slopes=self._alibi(alibi_slopes))
        result = out if out is not None else out_rows.reshape(self.q_shape)
        if not self.return_lse:
            return result
        B, Sq = self.q_shape[0], self.q_shape[1]
        return result, xp.ascontiguousarray(lse.reshape(self.H, B, Sq).transpose(1, 0, 2))
