"""Validated calls: what a public function decided once, and how it runs on the arrays it is
given (allocate outputs, append, launch, shape the result).

``api.py`` validates a call's arguments and lowers it to one of these objects; ``execute`` then
does all the device work -- nothing in it raises on bad input, so a call that fails validation
writes nothing (no append, no output).  Because an object depends only on the signature of its
arguments (``_signature.py``), ``api.py`` keeps it in a cache and a repeated call goes straight
to ``execute``.  The backend's launch plan (kernel, grid, packed arguments; ``_cuda.plan_attention``)
is made on the first execution and kept here too.

Empty work never reaches a backend (no kernel is planned or launched, on either backend): a
call with no query row (B, Sq or total_q = 0) returns its zero-size outputs, and a call whose
k/v hold no row at all (Sk = 0, total_k = 0, a pool of 0 pages, a cache of 0 rows) -- so that no
query can see a key -- writes out = 0 and LSE = +inf, the "no key" convention.  Both are decided
from shapes alone, so a cached call decides them once (``no_queries`` / ``no_keys``).
"""

from __future__ import annotations

import numpy as np

from . import rotary as rotary_ops
from .errors import UnsupportedError, explain
from .fp8 import storage_format
from .problem import AttentionProblem

__all__ = ["DenseCall", "VarlenCall", "KVCacheCall"]

#: The GPU kernels take row counts (total query rows, k/v storage rows) as 32-bit ints; their
#: element offsets are 64-bit, so arrays past 2**31 elements work (tests/gpu/
#: test_gpu_large_offsets.py) but not past 2**31 rows.
MAX_GPU_ROWS = 2**31 - 1

#: Largest LSE kept as a per-stream scratch buffer when the caller does not ask for the LSE
#: (bytes).  A decode step's LSE is a few KB: allocating it per call cost ~4.6 µs of host time
#: (cupy.empty, H200 machine), a tenth of the call.  Prefill LSEs are large and their kernels
#: long, so they are allocated per call and not kept alive by the call cache.
LSE_SCRATCH_MAX_BYTES = 1 << 20


_CURRENT_STREAM = None  # cupy.cuda.get_current_stream, bound on the first GPU call


def _stream_key() -> int:
    global _CURRENT_STREAM
    if _CURRENT_STREAM is None:
        import cupy

        _CURRENT_STREAM = cupy.cuda.get_current_stream
    return _CURRENT_STREAM().ptr


_CUDA_BACKEND = None  # the _cuda package, imported on the first GPU call


def _backend_run(xp, problem, plan):
    """Run ``problem`` on the backend of ``xp``; returns the backend plan to keep (CUDA)."""
    global _CUDA_BACKEND
    if xp is np:
        from . import _backend_cpu

        _backend_cpu.run_attention(problem)
        return None
    if _CUDA_BACKEND is None:
        from . import _cuda

        _CUDA_BACKEND = _cuda
    return _CUDA_BACKEND.run_attention(problem, plan)


def lse_dtype(q_dtype) -> np.dtype:
    """The dtype of ``softmax_lse``: float32 (flash-attn's) for every input dtype but float64,
    whose LSE is float64 -- a float32 LSE would limit what ``merge_attention_states`` can do
    with float64 partial outputs to ~1e-7, and the float64 kernels hold it in float64 anyway."""
    return np.dtype(np.float64) if np.dtype(q_dtype) == np.float64 else np.dtype(np.float32)


class _Call:
    """Fields common to every entry point.

    ``fields``: the AttentionProblem's non-array fields (geometry, logits, masks);
    ``H, D``: query heads and head dim; ``alibi_shape``: the slopes broadcast to (B, H) (a
    stride-0 view: the kernels take strides, no copy is made); ``query_rows`` / ``key_rows``:
    the rows of the flat q and of the k/v storage (a paged pool: num_blocks * P), which decide
    the empty cases (module docstring)."""

    def __init__(self, xp, fields: dict, num_heads: int, head_dim: int, return_lse: bool,
                 query_rows: int, key_rows: int, attn_probs: bool = False):
        if xp is not np:
            counted = [("q", query_rows)]
            if not fields.get("page_block_size"):  # a paged pool's rows are indexed per page
                counted.append(("k", key_rows))
            for name, rows in counted:
                if rows > MAX_GPU_ROWS:
                    raise explain(
                        UnsupportedError, name,
                        "has more token rows than the GPU kernels index (32-bit row counts)",
                        f"at most {MAX_GPU_ROWS} rows", f"{rows} rows",
                        "split the batch into several calls, each with fewer rows",
                    )
        self.xp = xp
        # A float8 call's scales (fp8.ScaleBinding: fixed arrays, or the caller's per call);
        # None for 16/32/64-bit K/V.
        self.kv_scales = fields.pop("kv_scales", None)
        # Calls whose LSE nobody reads (not returned) let a backend write it in its own order.
        self.fields = {**fields, "lse_unread": not (return_lse or attn_probs)}
        self.H = num_heads
        self.D = head_dim
        self.return_lse = return_lse
        self.attn_probs = attn_probs
        self.plan = None
        self.no_queries = query_rows == 0
        self.no_keys = key_rows == 0
        # True once the backend plan rebinds pointers only (every launch reads the caller's
        # arrays directly): then the arrays need not be reshaped into the problem's token-row
        # views before a launch -- a view has the same address, and the plan's strides were
        # fixed from the views when it was made (same signature, same strides).
        self.pointers_only = False
        self._lse_scratch: dict = {}  # stream -> LSE buffer nobody reads (see _lse_buffer)
        self._lse_dtype = None  # lse_dtype of q's dtype (fixed by the signature), on first use
        # The AttentionProblem fields that are the same in every execution (the dataclass
        # defaults overridden by ``fields``): an execution adds its arrays (see _problem).
        self._problem_fields = None

    def _lse_buffer(self, rows: int, keep: bool, q_dtype):
        """Where the kernels write the LSE (:func:`lse_dtype` of q's dtype): a fresh array when
        the caller gets it (``keep``); otherwise, when small, one scratch buffer per CUDA stream
        and dtype reused by every call (the kernels write it and nothing reads it, so calls on
        one stream may share it)."""
        xp = self.xp
        dtype = self._lse_dtype
        if dtype is None:
            dtype = self._lse_dtype = lse_dtype(q_dtype)
        if keep or xp is np or self.H * rows * dtype.itemsize > LSE_SCRATCH_MAX_BYTES:
            return xp.empty((self.H, rows), dtype=dtype)
        key = (_stream_key(), dtype)
        buf = self._lse_scratch.get(key)
        if buf is None:
            buf = self._lse_scratch[key] = xp.empty((self.H, rows), dtype=dtype)
        return buf

    def _run_token_rows(self, q, k, v, out, lse, k_rows, **arrays):
        """(DenseCall, KVCacheCall.)  Run with q and out of shape ``q_shape`` (B, Sq, H, D) as
        (B * Sq, H, D) token rows,
        and k/v reshaped to ``k_rows`` (None: as given); returns the output in ``q_shape``
        (``out`` itself when given).  Once the plan reads the caller's arrays directly
        (``pointers_only``) no view is made: the kernels only take their addresses."""
        xp = self.xp
        if self.pointers_only:
            result = xp.empty(self.q_shape, dtype=q.dtype) if out is None else out
            self._run(q=q, k=k, v=v, out=result, softmax_lse=lse, **arrays)
            return result
        out_rows = (xp.empty(self.q_rows, dtype=q.dtype) if out is None
                    else out.reshape(self.q_rows))
        rows = self._token_rows(q, k, v, out_rows, k_rows)
        self._run(**rows, softmax_lse=lse, **arrays)
        return out if out is not None else out_rows.reshape(self.q_shape)

    def _token_rows(self, q, k, v, out, k_rows) -> dict:
        """q and out as (B * Sq, H, D) token rows, k/v reshaped to ``k_rows`` (None: as given)."""
        if k_rows is not None:
            k, v = k.reshape(k_rows), v.reshape(k_rows)
        return dict(q=q.reshape(self.q_rows), k=k, v=v, out=out.reshape(self.q_rows))

    def _lse_per_batch(self, lse):
        """The kernels' (H, B * Sq) LSE as flash-attn's (B, H, Sq)."""
        B, Sq = self.q_shape[0], self.q_shape[1]
        return self.xp.ascontiguousarray(lse.reshape(self.H, B, Sq).transpose(1, 0, 2))

    def _scales(self, k_scale, v_scale) -> dict:
        """The AttentionProblem's k_scale / v_scale of this execution ({} unless float8)."""
        return {} if self.kv_scales is None else self.kv_scales.arrays(k_scale, v_scale)

    def _alibi(self, slopes):
        if slopes is None:
            return None
        shape = (self.fields["batch_size"], self.H)
        if slopes.shape == shape:
            return slopes
        return self.xp.broadcast_to(slopes, shape)

    def _run(self, **arrays) -> None:
        if self.no_queries:
            return  # out and softmax_lse have no element to write
        if self.no_keys:
            # No key exists for any query: every row outputs 0 with LSE +inf (what the backends
            # compute for a row that sees no key; with sinks, the whole softmax is on the sink:
            # LSE = sinks[h]), without planning or launching a kernel.
            arrays["out"][...] = 0
            sinks = arrays.get("sinks")
            arrays["softmax_lse"][...] = np.inf if sinks is None else sinks[:, None]
            return
        problem = self._problem(arrays)
        first = self.plan is None
        self.plan = _backend_run(self.xp, problem, self.plan)
        if first and self.plan is not None:
            self.pointers_only = all(getattr(launch, "direct", False) for launch in self.plan)

    def _problem(self, arrays: dict) -> AttentionProblem:
        """The AttentionProblem of this execution: ``AttentionProblem(**arrays, **self.fields)``,
        built from the field values kept since the first execution (problem.from_fields: a
        dataclass __init__ of ~35 keyword arguments was a tenth of a cached call's host time)."""
        if self._problem_fields is None:
            first = AttentionProblem(**arrays, **self.fields).__dict__
            # Without the arrays: every execution passes the same array names, and keeping
            # this one's would keep its output alive as long as the call is cached.
            self._problem_fields = {k: v for k, v in first.items() if k not in arrays}
        return AttentionProblem.from_fields(self._problem_fields, arrays)


class DenseCall(_Call):
    """flash_attn_func: q (B, Sq, H, D), k/v (B, Sk, Hk, D) viewed as token rows."""

    def __init__(self, xp, fields, num_heads, head_dim, return_lse, attn_probs, q_shape, k_shape):
        B, Sq = q_shape[0], q_shape[1]
        super().__init__(xp, fields, num_heads, head_dim, return_lse, query_rows=B * Sq,
                         key_rows=k_shape[0] * k_shape[1], attn_probs=attn_probs)
        self.q_shape = q_shape
        self.q_rows = (B * Sq,) + tuple(q_shape[2:])
        self.k_rows = (k_shape[0] * k_shape[1],) + tuple(k_shape[2:])

    def execute(self, q, k, v, alibi_slopes, sinks, mm_prefix_ranges, out, k_scale=None,
                v_scale=None):
        keep_lse = self.return_lse or self.attn_probs
        lse = self._lse_buffer(self.q_rows[0], keep_lse, q.dtype)
        result = self._run_token_rows(q, k, v, out, lse, self.k_rows,
                                      alibi_slopes=self._alibi(alibi_slopes), sinks=sinks,
                                      mm_prefix_ranges=mm_prefix_ranges,
                                      **self._scales(k_scale, v_scale))
        if not keep_lse:
            return result
        lse = self._lse_per_batch(lse)
        return (result, lse, None) if self.attn_probs else (result, lse)


class VarlenCall(_Call):
    """flash_attn_varlen_func: packed q (total_q, H, D) with contiguous or paged k/v."""

    def __init__(self, xp, fields, num_heads, head_dim, return_lse, attn_probs, *, query_rows,
                 key_rows):
        super().__init__(xp, fields, num_heads, head_dim, return_lse, query_rows=query_rows,
                         key_rows=key_rows, attn_probs=attn_probs)

    def execute(self, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
                sinks, mm_prefix_ranges, out, k_scale=None, v_scale=None):
        xp = self.xp
        out_rows = xp.empty(q.shape, dtype=q.dtype) if out is None else out
        lse = self._lse_buffer(q.shape[0], self.return_lse or self.attn_probs, q.dtype)
        self._run(q=q, k=k, v=v, out=out_rows, softmax_lse=lse, cu_seqlens_q=cu_seqlens_q,
                  cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, block_table=block_table,
                  alibi_slopes=self._alibi(alibi_slopes), sinks=sinks,
                  mm_prefix_ranges=mm_prefix_ranges, **self._scales(k_scale, v_scale))
        if self.attn_probs:
            return out_rows, lse, None
        return (out_rows, lse) if self.return_lse else out_rows


class KVCacheCall(_Call):
    """flash_attn_with_kvcache: rotate q and the new k, append k/v into the cache in place, then
    attend with ``seqused_k = cache_seqlens`` and ``seqused_k_add = S_new`` (the lengths after
    the append, without a device op computing them).

    ``seqlens``: the device array of a ``cache_seqlens`` given as an int (or None), made once;
    ``q_per_token``: rotary positions of the queries (see flash_attn_with_kvcache);
    ``key_rows``: the cache's rows (B_cache * S_cache, or num_blocks * P).  A cache of 0 rows has
    no slot a new token could be written to, so nothing is appended (the CUDA append would drop
    every write; on NumPy the validation has already refused such an append)."""

    def __init__(self, xp, fields, num_heads, head_dim, return_lse, *, q_shape, k_cache_rows,
                 key_rows, paged, seqlens, rotary_interleaved, q_per_token):
        super().__init__(xp, fields, num_heads, head_dim, return_lse,
                         query_rows=q_shape[0] * q_shape[1], key_rows=key_rows)
        self.q_shape = q_shape
        self.q_rows = (q_shape[0] * q_shape[1],) + tuple(q_shape[2:])
        self.k_cache_rows = k_cache_rows  # None when paged
        self.paged = paged
        self.seqlens = seqlens
        self.rotary_interleaved = rotary_interleaved
        self.q_per_token = q_per_token
        self.rope_plans: dict = {}  # the rotary/append kernel's launch plans (CuPy)

    def execute(self, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sinks,
                mm_prefix_ranges, out, k_scale=None, v_scale=None):
        seqlens = self.seqlens if self.seqlens is not None else cache_seqlens
        scales = self._scales(k_scale, v_scale)
        arrays = dict(seqused_k=seqlens, cache_batch_idx=cache_batch_idx,
                      leftpad_k=cache_leftpad, block_table=block_table,
                      alibi_slopes=self._alibi(alibi_slopes), sinks=sinks,
                      mm_prefix_ranges=mm_prefix_ranges, **scales)
        if k is not None and not self.no_keys:
            if self.plan is None and self.xp is not np and not self.no_queries:
                # The first call of this signature: a kernel this GPU cannot run (too much
                # shared memory, _cuda/device_limits.py) must be refused before the append
                # writes the cache.  The kernels depend on shapes and dtypes only, so the
                # problem of the unrotated q names the same ones (q stands in for out: the
                # check writes nothing).
                from ._cuda.device_limits import check_fits

                check_fits(AttentionProblem(
                    **self._token_rows(q, k_cache, v_cache, q if out is None else out,
                                       self.k_cache_rows),
                    softmax_lse=self._lse_buffer(self.q_rows[0], False, q.dtype),
                    **arrays, **self.fields))
            q = rotary_ops.rotate_and_append(
                q, k_cache, v_cache, k, v, seqlens, cos=rotary_cos, sin=rotary_sin,
                interleaved=self.rotary_interleaved, q_per_token=self.q_per_token,
                cache_batch_idx=cache_batch_idx, block_table=block_table if self.paged else None,
                plans=self.rope_plans,
                # A float8 cache (its dtype, or the format of its uint8 bytes): the new k / v
                # are quantized on append (fp8.py).
                fp8=(storage_format(k_cache.dtype, self.fields.get("kv_dtype")),
                     scales["k_scale"], scales["v_scale"]) if scales else None,
            )
        lse = self._lse_buffer(self.q_rows[0], self.return_lse, q.dtype)
        result = self._run_token_rows(q, k_cache, v_cache, out, lse, self.k_cache_rows, **arrays)
        return (result, self._lse_per_batch(lse)) if self.return_lse else result
