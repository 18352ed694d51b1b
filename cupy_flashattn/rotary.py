"""What ``flash_attn_with_kvcache`` does to ``q``/``k``/``v`` before attending, on both backends:
rotary position embedding and appending the new keys/values into the cache.

Every function takes NumPy or CuPy arrays and never reads device data on the host.  Index
values that would write or read out of bounds are handled per backend:

* NumPy: they are checked up front and raise a typed error (``SeqlenError`` /
  ``BlockTableError`` / ``ShapeError``) before anything is written.
* CuPy: checking would cost a host sync per call, so such writes are masked out on the device
  (dropped, never written out of bounds) and rotary rows outside the tables rotate by angle 0,
  as flash-attn's Triton rotary kernel does.  ``api.py``'s ``check=True`` mode validates the
  values up front for CuPy too.
"""

from __future__ import annotations

import functools

import numpy as np

from ._arrays import BFLOAT16, array_module, dtype_name
from ._rules import page_and_row
from .errors import BlockTableError, DTypeError, SeqlenError, ShapeError, explain
from .fp8 import device_scale, is_fp8, kv_cache_format, quantize, refuse_scales, storage_format
from .validate import same_library

__all__ = ["append_kv_contiguous", "append_kv_paged", "apply_rotary", "rotate_and_append"]

# dtypes the fused CUDA kernel (cuda_src/kv_cache.cu) handles; others take the generic xp path.
_KERNEL_DATA = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))

_FLOAT_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))


def _shape(a) -> str:
    return "(" + ", ".join(str(int(s)) for s in a.shape) + ")"


# -- rotary -------------------------------------------------------------------------------------


def apply_rotary(x, cos, sin, positions, interleaved=False):
    """Rotary embedding of the first ``rotary_dim`` dims of every head, as flash-attn's
    ``apply_rotary_emb`` (out = x * cos + rotate(x) * sin, per rotated pair).

    Args:
        x: ``(B, S, H, D)`` float16/bfloat16/float32/float64.
        cos, sin: ``(seqlen_ro, rotary_dim / 2)`` tables; ``rotary_dim <= D``.
        positions: int ``(B, S)``, the absolute position of each token, i.e. the row of
            cos/sin to use (flash_attn_with_kvcache passes ``cache_seqlens[b] + i``).
        interleaved: True rotates pairs ``(0, 1), (2, 3), ...`` (GPT-J style); False rotates
            ``(i, i + rotary_dim / 2)`` (GPT-NeoX style, flash-attn's default).

    Returns:
        A new array in x's shape and dtype.  The rotation is computed in float32 (float64 for
        float64 x) and rounded once; dims ``>= rotary_dim`` are copied unchanged.
        Positions outside ``[0, seqlen_ro)`` raise ``SeqlenError`` on NumPy and are left
        unrotated on CuPy (see the module docstring).
    """
    xp = same_library(x=x, cos=cos, sin=sin, positions=positions)
    half = _check_rotary(x, cos, sin, positions)
    if xp is not np and np.dtype(x.dtype) in _KERNEL_DATA:
        # One fused kernel (kv_cache.cu), bit-identical to the code below.
        from ._cuda.decode import rope_append

        src = x if x.strides[-1] == x.itemsize else xp.ascontiguousarray(x)
        out = xp.empty(x.shape, dtype=x.dtype)
        rope_append(src, out, mode=0, cos=cos, sin=sin, interleaved=interleaved, positions=positions)
        return out
    ct = np.float64 if np.dtype(x.dtype) == np.float64 else np.float32
    c, s = _rotary_rows(xp, cos, sin, positions, ct)  # (B, S, 1, half)

    rot = x[..., : 2 * half].astype(ct)
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
    o1 = (x1 * c - x2 * s).astype(x.dtype)
    o2 = (x2 * c + x1 * s).astype(x.dtype)

    out = x.copy()  # the dims past rotary_dim stay bit-exact
    if interleaved:
        out[..., 0 : 2 * half : 2] = o1
        out[..., 1 : 2 * half : 2] = o2
    else:
        out[..., :half] = o1
        out[..., half : 2 * half] = o2
    return out


def _check_rotary(x, cos, sin, positions) -> int:
    """Validate apply_rotary's arguments; return ``rotary_dim / 2``."""
    _rank("x", x, 4, "(B, S, H, D)")
    _rank("cos", cos, 2, "(seqlen_ro, rotary_dim / 2)")
    if tuple(sin.shape) != tuple(cos.shape):
        raise explain(
            ShapeError, "sin", "must have the same shape as cos", _shape(cos), _shape(sin),
            "build both tables from the same positions and frequencies",
        )
    if cos.shape[0] < 1:
        raise explain(
            ShapeError, "cos", "has no rows (positions)", "seqlen_ro >= 1", f"shape {_shape(cos)}",
            "build cos/sin for every position up to the cache capacity",
        )
    half, D = int(cos.shape[1]), int(x.shape[3])
    if not 1 <= half <= D // 2:
        raise explain(
            ShapeError, "cos", "rotary_dim (= 2 * cos.shape[1]) must be in [2, head_dim]",
            f"1 <= cos.shape[1] <= {D // 2}", f"shape {_shape(cos)}",
            "give one column per rotated pair, rotary_dim / 2 columns",
        )
    for name, a in (("x", x), ("cos", cos), ("sin", sin)):
        _dtype_in(name, a, _FLOAT_DTYPES, "float16, bfloat16, float32 or float64")
    _index("positions", positions, tuple(x.shape[:2]), "(B, S) like x.shape[:2]")
    return half


def _rotary_rows(xp, cos, sin, positions, ct):
    """cos/sin rows of every token, ``(B, S, 1, half)`` in the compute dtype."""
    seqlen_ro = int(cos.shape[0])
    pos = positions.astype(np.int64)
    valid = (pos >= 0) & (pos < seqlen_ro)
    if xp is np:
        _require(valid, lambda: _position_error(pos, seqlen_ro))
        c, s = cos[pos].astype(ct), sin[pos].astype(ct)
    else:
        # Clamp to a real row, then turn invalid rows into the identity rotation (cos 1, sin 0).
        safe = xp.clip(pos, 0, seqlen_ro - 1)
        keep = valid[..., None]
        c = xp.where(keep, cos[safe].astype(ct), ct(1))
        s = xp.where(keep, sin[safe].astype(ct), ct(0))
    return c[:, :, None, :], s[:, :, None, :]


def _position_error(pos, seqlen_ro):
    b, i = (int(t) for t in np.argwhere((pos < 0) | (pos >= seqlen_ro))[0])
    return explain(
        SeqlenError, "positions", f"token [{b}, {i}] has no row in the rotary tables",
        f"0 <= position < seqlen_ro = cos.shape[0] = {seqlen_ro}", int(pos[b, i]),
        "build cos/sin for every position up to the cache capacity (seqlen_ro >= max position + 1)",
    )


# -- appending new keys/values ------------------------------------------------------------------


def append_kv_contiguous(k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx=None,
                         *, k_scale=None, v_scale=None, kv_cache_dtype=None):
    """Write ``k_new[b, i]`` into ``k_cache[batch_idx[b], cache_seqlens[b] + i]`` (and the same for
    v), in place, with one vectorized scatter per cache.

    Args:
        k_cache, v_cache: ``(B_cache, S_cache, Hk, D)`` (v's head dim may differ from k's).
        k_new, v_new: ``(B, S_new, Hk, D)``, the caches' dtypes -- or, for a float8 cache, a
            float dtype, quantized on the way in as ``fp8(clip(k_new / k_scale))`` (fp8.py).
        cache_seqlens: int ``(B,)`` tokens already cached per sequence (not updated here).
        cache_batch_idx: optional int ``(B,)``, the cache row of each sequence (default ``b``).
        k_scale, v_scale: a float8 cache's scales (a float or float32 ``(Hk,)``; default 1).
        kv_cache_dtype: the float8 format of a cache held as uint8 bytes ("fp8", "fp8_e5m2";
            CuPy has no float8 dtype), as in the attention functions.

    Positions ``>= S_cache`` (or a batch index outside ``[0, B_cache)``) raise on NumPy and are
    dropped on CuPy.  Two sequences writing the same cache row and position is undefined.
    """
    xp, fmt = _check_append(k_cache, v_cache, k_new, v_new, cache_seqlens, "k_cache", "v_cache",
                            k_scale, v_scale, kv_cache_dtype)
    fp8 = _append_fp8(xp, fmt, k_cache, k_new, k_scale, v_scale)
    B, S_new = int(k_new.shape[0]), int(k_new.shape[1])
    B_cache, S_cache = int(k_cache.shape[0]), int(k_cache.shape[1])
    if xp is not np and cache_batch_idx is not None:
        same_library(k_cache=k_cache, cache_batch_idx=cache_batch_idx)
        _index("cache_batch_idx", cache_batch_idx, (B,), f"(B,) = ({B},), one row per sequence")
    if xp is not np and _kernel_append(xp, k_cache, v_cache, k_new, v_new, cache_seqlens, 1,
                                       batch_idx=cache_batch_idx, fp8=fp8):
        return
    k_new, v_new = _quantized(k_cache, k_new, v_new, fp8)
    if cache_batch_idx is None:
        rows = xp.arange(B, dtype=np.int64)
    else:
        same_library(k_cache=k_cache, cache_batch_idx=cache_batch_idx)
        _index("cache_batch_idx", cache_batch_idx, (B,), f"(B,) = ({B},), one row per sequence")
        rows = cache_batch_idx.astype(np.int64)
    pos = cache_seqlens.astype(np.int64)[:, None] + xp.arange(S_new, dtype=np.int64)[None, :]
    rows = xp.broadcast_to(rows[:, None], pos.shape)
    row_ok = (rows >= 0) & (rows < B_cache)
    pos_ok = (pos >= 0) & (pos < S_cache)
    if xp is np:
        _require(row_ok, lambda: _batch_idx_error(rows, B_cache))
        _require(pos_ok, lambda: _capacity_error(
            pos, S_cache, "S_cache = k_cache.shape[1]",
            "allocate a longer cache (S_cache) or append fewer tokens"))
    _scatter(xp, k_cache, rows, pos, row_ok & pos_ok, k_new)
    _scatter(xp, v_cache, rows, pos, row_ok & pos_ok, v_new)


def append_kv_paged(k_pages, v_pages, block_table, k_new, v_new, cache_seqlens, *, k_scale=None,
                    v_scale=None, kv_cache_dtype=None):
    """Write ``k_new[b, i]`` to position ``p = cache_seqlens[b] + i`` of sequence ``b`` of a paged
    cache, i.e. row ``p % P`` of page ``block_table[b, p // P]`` (and the same for v), in place,
    with one vectorized scatter per pool.

    Args:
        k_pages, v_pages: ``(num_blocks, P, Hk, D)`` page pools (P = page_block_size, read from
            here; v's head dim may differ from k's).
        block_table: int ``(B, max_blocks_per_seq)`` page ids; only the entries the new tokens
            land in are read.
        k_new, v_new: ``(B, S_new, Hk, D)``, the pools' dtypes -- or, for float8 pools, a float
            dtype, quantized on the way in (as :func:`append_kv_contiguous`).
        cache_seqlens: int ``(B,)`` tokens already cached per sequence (not updated here).
        k_scale, v_scale, kv_cache_dtype: float8 pools' scales and format (as
            :func:`append_kv_contiguous`).

    Positions ``>= max_blocks_per_seq * P`` and page ids outside ``[0, num_blocks)`` raise on
    NumPy (``SeqlenError`` / ``BlockTableError``) and are dropped on CuPy.
    """
    xp, fmt = _check_append(k_pages, v_pages, k_new, v_new, cache_seqlens, "k_pages", "v_pages",
                            k_scale, v_scale, kv_cache_dtype)
    fp8 = _append_fp8(xp, fmt, k_pages, k_new, k_scale, v_scale)
    B, S_new = int(k_new.shape[0]), int(k_new.shape[1])
    num_blocks, P = int(k_pages.shape[0]), int(k_pages.shape[1])
    same_library(k_pages=k_pages, block_table=block_table)
    _index("block_table", block_table, None, f"(B, max_blocks_per_seq) with B = {B}", ndim=2)
    if block_table.shape[0] != B or block_table.shape[1] < 1:
        raise explain(
            BlockTableError, "block_table",
            "must have one row per sequence and at least one column",
            f"shape ({B}, >= 1)", f"shape {_shape(block_table)}",
            "pass the block table of the sequences being appended (PagedKVCache.block_table(ids))",
        )
    width = int(block_table.shape[1])
    if xp is not np and _kernel_append(xp, k_pages, v_pages, k_new, v_new, cache_seqlens, 2,
                                       table=block_table, page_size=P, fp8=fp8):
        return
    k_new, v_new = _quantized(k_pages, k_new, v_new, fp8)
    pos = cache_seqlens.astype(np.int64)[:, None] + xp.arange(S_new, dtype=np.int64)[None, :]
    col, slots = page_and_row(pos, P)  # floor division: a negative position, a negative column
    pos_ok = (pos >= 0) & (col < width)
    pages = xp.take_along_axis(block_table, xp.clip(col, 0, width - 1), axis=1).astype(np.int64)
    page_ok = (pages >= 0) & (pages < num_blocks)
    if xp is np:
        _require(pos_ok, lambda: _capacity_error(
            pos, width * P, f"max_blocks_per_seq * page_block_size = {width} * {P}",
            "widen the block table (more pages per sequence) or append fewer tokens"))
        _require(page_ok, lambda: _page_error(pages, col, num_blocks))
    _scatter(xp, k_pages, pages, slots, pos_ok & page_ok, k_new)
    _scatter(xp, v_pages, pages, slots, pos_ok & page_ok, v_new)


def _int32(xp, a):
    return a if a is None or (np.dtype(a.dtype) == np.int32 and a.strides[-1] == 4) else xp.ascontiguousarray(a.astype(np.int32))


def _kernel_append(xp, k_cache, v_cache, k_new, v_new, seqlens, mode, *, batch_idx=None,
                   table=None, page_size=0, cos=None, sin=None, interleaved=False,
                   plans=None, fp8=None) -> bool:
    """Append (and rotate k) with the fused CUDA kernel (kv_cache.cu); False when it does not
    apply (dtype, layouts), so the caller falls back to the generic scatter.  ``fp8``:
    (format, k_scale, v_scale) -- float32 (Hk,) device scales -- when float new tokens go into
    a float8 cache (its uint8 bytes): the kernel is the GPU's only quantizing path, so it
    always applies then (new tokens made contiguous, and k and v appended by one launch each
    when the caches' layouts differ)."""
    if int(k_new.shape[1]) == 0 or int(k_new.shape[0]) == 0:
        return True
    from ._cuda.decode import rope_append

    if fp8 is None:
        if np.dtype(k_cache.dtype) not in _KERNEL_DATA or np.dtype(v_cache.dtype) != np.dtype(k_cache.dtype):
            return False
        if k_cache.shape != v_cache.shape or k_cache.strides != v_cache.strides:
            return False
        if any(a.strides[-1] != a.itemsize for a in (k_cache, v_cache, k_new, v_new)):
            return False
    index = dict(mode=mode, seqlens=_int32(xp, seqlens), batch_idx=_int32(xp, batch_idx),
                 table=_int32(xp, table), page_size=page_size, pos_per_token=True, plans=plans)
    if fp8 is not None:
        fmt, k_scale, v_scale = fp8
        k_new, v_new = (_kernel_source(xp, a) for a in (k_new, v_new))
        if k_cache.shape == v_cache.shape and k_cache.strides == v_cache.strides:
            rope_append(k_new, k_cache, src2=v_new, dst2=v_cache, cos=cos, sin=sin,
                        interleaved=interleaved, slot="kv", dst_format=fmt, dst_scale=k_scale,
                        dst2_scale=v_scale, **index)
        else:
            rope_append(k_new, k_cache, cos=cos, sin=sin, interleaved=interleaved, slot="k",
                        dst_format=fmt, dst_scale=k_scale, **index)
            rope_append(v_new, v_cache, slot="v", dst_format=fmt, dst_scale=v_scale, **index)
        return True
    rope_append(k_new, k_cache, src2=v_new, dst2=v_cache, cos=cos, sin=sin,
                interleaved=interleaved, slot="kv", **index)
    return True


def _kernel_source(xp, a):
    """New tokens as the quantizing append reads them: a contiguous last dim, float64 as
    float32 (fp8.quantize divides in float32 too, so the bits are the same)."""
    if np.dtype(a.dtype) not in _KERNEL_DATA:
        a = a.astype(np.float32)
    return a if a.strides[-1] == a.itemsize else xp.ascontiguousarray(a)


def _append_fp8(xp, fmt, cache, new, k_scale, v_scale):
    """(format, k_scale, v_scale) -- the scales as float32 (Hk,) arrays of ``xp`` -- when
    float tokens go into a float8 cache of format ``fmt``; None otherwise (a plain copy)."""
    if fmt is None or is_fp8(new.dtype) or np.dtype(new.dtype) == np.uint8:
        return None
    hk = int(cache.shape[2])
    return (fmt, device_scale("k_scale", k_scale, hk, xp), device_scale("v_scale", v_scale, hk, xp))


def _quantized(cache, k_new, v_new, fp8):
    """The generic (NumPy) path's new tokens as the cache stores them: quantized to the
    float8 format (``fp8`` given), as bytes for a uint8 cache."""
    if fp8 is None:
        return k_new, v_new
    fmt, k_scale, v_scale = fp8
    k_new, v_new = quantize(k_new, k_scale, fmt), quantize(v_new, v_scale, fmt)
    if np.dtype(cache.dtype) == np.uint8:
        k_new, v_new = k_new.view(np.uint8), v_new.view(np.uint8)
    return k_new, v_new


def rotate_and_append(q, k_cache, v_cache, k_new, v_new, cache_seqlens, *, cos=None, sin=None,
                      interleaved=False, q_per_token=True, cache_batch_idx=None, block_table=None,
                      plans=None, fp8=None):
    """flash_attn_with_kvcache's pre-attention step on CuPy in two kernel launches, no host sync:
    rotate q (positions ``cache_seqlens[b] + i`` when ``q_per_token``, else ``cache_seqlens[b]``)
    and, in one pass, rotate the new k at ``cache_seqlens[b] + i`` while writing it and v into the
    contiguous (``cache_batch_idx``) or paged (``block_table``) cache.  Returns the rotated q (q
    itself without tables).  Same values, bit for bit, as apply_rotary + append_kv_*; falls back
    to them where the kernel does not apply.  ``plans``: a dict in which a caller of fixed
    signature keeps the kernels' launch plans between calls (``_calls.KVCacheCall``).
    ``fp8``: (format, k_scale, v_scale) of a float8 cache (its dtype or, as uint8 bytes, the
    format; float32 (Hk,) scales of q's library): the rotated new k and v are quantized into it
    (fp8.quantize, saturating; on CuPy inside the append kernel, bit for bit)."""
    xp = array_module(q)
    paged = block_table is not None
    fused = (
        xp is not np
        and np.dtype(q.dtype) in _KERNEL_DATA
        and (cos is None or np.dtype(cos.dtype) in _KERNEL_DATA + (np.dtype(np.float64),))
    )
    if not fused:
        if cos is not None:
            base = cache_seqlens.astype(np.int32)[:, None]
            k_pos = base + xp.arange(int(k_new.shape[1]), dtype=np.int32)[None, :]
            q_pos = base + xp.arange(int(q.shape[1]), dtype=np.int32)[None, :] if q_per_token else \
                xp.broadcast_to(base, tuple(q.shape[:2]))
            q, k_new = apply_rotary(q, cos, sin, q_pos, interleaved), apply_rotary(k_new, cos, sin, k_pos, interleaved)
        k_new, v_new = _quantized(k_cache, k_new, v_new, fp8)
        if paged:
            append_kv_paged(k_cache, v_cache, block_table, k_new, v_new, cache_seqlens)
        else:
            append_kv_contiguous(k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx)
        return q
    from ._cuda.decode import rope_append

    seqlens = _int32(xp, cache_seqlens)
    if cos is not None:
        src = q if q.strides[-1] == q.itemsize else xp.ascontiguousarray(q)
        q_rot = xp.empty(q.shape, dtype=q.dtype)
        rope_append(src, q_rot, mode=0, seqlens=seqlens, cos=cos, sin=sin, interleaved=interleaved,
                    pos_per_token=q_per_token, plans=plans, slot="q")
        q = q_rot
    P = int(k_cache.shape[1]) if paged else 0
    if not _kernel_append(xp, k_cache, v_cache, k_new, v_new, seqlens, 2 if paged else 1,
                          batch_idx=cache_batch_idx, table=block_table, page_size=P,
                          cos=cos, sin=sin, interleaved=interleaved, plans=plans, fp8=fp8):
        if cos is not None:
            base = seqlens[:, None]
            k_pos = base + xp.arange(int(k_new.shape[1]), dtype=np.int32)[None, :]
            k_new = apply_rotary(k_new, cos, sin, k_pos, interleaved)
        if paged:
            append_kv_paged(k_cache, v_cache, block_table, k_new, v_new, seqlens)
        else:
            append_kv_contiguous(k_cache, v_cache, k_new, v_new, seqlens, cache_batch_idx)
    return q


def _check_append(k_cache, v_cache, k_new, v_new, cache_seqlens, k_name, v_name, k_scale=None,
                  v_scale=None, kv_cache_dtype=None):
    """Shapes, dtypes and library of an append; returns (the array module, the cache's float8
    format or None).  New tokens have the cache's dtype, or a float dtype when the cache is
    float8 -- its own dtype, or uint8 bytes of the format ``kv_cache_dtype`` names -- and are
    then quantized with the scales, which only a float8 cache takes."""
    xp = same_library(**{k_name: k_cache, v_name: v_cache, "k_new": k_new, "v_new": v_new,
                         "cache_seqlens": cache_seqlens})
    for name, a in ((k_name, k_cache), (v_name, v_cache)):
        _rank(name, a, 4, "(rows, S_cache or page_block_size, Hk, D)")
    for name, a in (("k_new", k_new), ("v_new", v_new)):
        _rank(name, a, 4, "(B, S_new, Hk, D)")
    _same_dims(v_name, v_cache, k_name, k_cache, slice(0, 3), "rows, positions and kv heads")
    _same_dims("v_new", v_new, "k_new", k_new, slice(0, 3), "batch, new tokens and kv heads")
    pairs = (("k_new", k_new, k_name, k_cache), ("v_new", v_new, v_name, v_cache))
    fmt = storage_format(k_cache.dtype, kv_cache_format(kv_cache_dtype))
    for new_name, new, cache_name, cache in pairs:
        _same_dims(new_name, new, cache_name, cache, slice(2, 4), "kv heads and head dim")
        if fmt is not None and np.dtype(new.dtype) in _FLOAT_DTYPES:
            continue  # quantized on the way in
        if np.dtype(new.dtype) != np.dtype(cache.dtype):
            raise explain(
                DTypeError, new_name, f"must have {cache_name}'s dtype", dtype_name(cache.dtype),
                dtype_name(new.dtype), f"cast with {new_name}.astype({cache_name}.dtype)",
            )
    if fmt is None:
        refuse_scales(k_scale, v_scale, "scales apply to float8 caches only",
                      f"None with {k_name} of dtype {dtype_name(k_cache.dtype)}", "drop {name}")
    elif np.dtype(k_new.dtype) != np.dtype(v_new.dtype):
        raise explain(
            DTypeError, "v_new", "must have k_new's dtype (both quantized, or both float8)",
            dtype_name(k_new.dtype), dtype_name(v_new.dtype), "cast with v_new.astype(k_new.dtype)",
        )
    B = int(k_new.shape[0])
    _index("cache_seqlens", cache_seqlens, (B,), f"(B,) = ({B},), one length per sequence")
    return xp, fmt


def _scatter(xp, dst, idx0, idx1, valid, src):
    """``dst[idx0[b, i], idx1[b, i]] = src[b, i]`` for every ``valid[b, i]``, as one scatter.

    NumPy callers have already checked that every entry is valid.  On CuPy, invalid entries are
    skipped on the device by a tiny elementwise kernel: a fancy-index assignment cannot skip
    entries without a host sync (boolean masks need their count), and redirecting them to some
    real slot could race with a valid write to that slot.
    """
    if src.shape[1] == 0:
        return
    if xp is np:
        dst[idx0, idx1] = src
        return
    flat_rows = xp.where(valid, idx0 * int(dst.shape[1]) + idx1, -1).ravel()
    bits = _bits_dtype(dst.dtype)  # copy raw bits: one kernel for every dtype, bf16 included
    row_elems = int(dst.shape[2]) * int(dst.shape[3])
    _masked_row_scatter()(src.view(bits), flat_rows, row_elems, dst.view(bits))


def _bits_dtype(dtype):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]


@functools.cache
def _masked_row_scatter():
    """CuPy kernel: element ``i`` of ``src`` (viewed as rows of ``row_elems``) goes to row
    ``dst_row[i / row_elems]`` of ``dst`` (flat C-order index, strides honoured), or nowhere
    when that row is -1."""
    import cupy

    return cupy.ElementwiseKernel(
        "T src, raw int64 dst_row, int64 row_elems",
        "raw T dst",
        """
        const long long r = dst_row[i / row_elems];
        if (r >= 0) dst[r * row_elems + i % row_elems] = src;
        """,
        "cupy_flashattn_masked_row_scatter",
    )


# -- errors for out-of-range index values (NumPy only: these read the values on the host) -------


def _require(ok, error) -> None:
    if not bool(ok.all()):
        raise error()


def _batch_idx_error(rows, B_cache):
    b = int(np.argwhere((rows < 0) | (rows >= B_cache))[0][0])
    return explain(
        ShapeError, "cache_batch_idx", f"entry {b} is not a row of k_cache",
        f"0 <= cache_batch_idx[b] < B_cache = k_cache.shape[0] = {B_cache}", int(rows[b, 0]),
        "pass indices of existing cache rows",
    )


def _capacity_error(pos, capacity, what, fix):
    b = int(np.argwhere((pos < 0) | (pos >= capacity))[0][0])
    length = int(pos[b, 0])
    if length < 0:
        return explain(
            SeqlenError, "cache_seqlens", f"sequence {b} has a negative length", ">= 0", length,
            "cache_seqlens holds the number of tokens already cached, >= 0",
        )
    return explain(
        SeqlenError, "cache_seqlens",
        f"sequence {b} would grow past the cache: {length} cached + {pos.shape[1]} new tokens",
        f"cache_seqlens[b] + S_new <= {what} = {capacity}",
        f"{length} + {pos.shape[1]} = {length + pos.shape[1]}",
        fix,
    )


def _page_error(pages, col, num_blocks):
    b, i = (int(t) for t in np.argwhere((pages < 0) | (pages >= num_blocks))[0])
    return explain(
        BlockTableError, "block_table",
        f"entry [{b}, {int(col[b, i])}] points outside the page pool",
        f"a page id in [0, {num_blocks})", int(pages[b, i]),
        "fill block_table only with ids of allocated pages; PagedKVCache.block_table() does this",
    )


# -- small checks -------------------------------------------------------------------------------


def _rank(name, a, ndim, layout):
    if a.ndim != ndim:
        raise explain(
            ShapeError, name, f"must have rank {ndim}, {layout}", f"rank {ndim}",
            f"shape {_shape(a)}", f"reshape {name} to {layout}",
        )


def _same_dims(name, a, ref_name, ref, dims: slice, what: str):
    if tuple(a.shape[dims]) != tuple(ref.shape[dims]):
        raise explain(
            ShapeError, name, f"{what} must match {ref_name}'s",
            f"shape {_shape(ref)} in dims {dims.start}..{dims.stop - 1}", f"shape {_shape(a)}",
            f"give {name} {ref_name}'s {what}",
        )


def _dtype_in(name, a, allowed, names):
    if np.dtype(a.dtype) not in allowed:
        raise explain(
            DTypeError, name, "unsupported dtype", f"one of {names}", dtype_name(a.dtype),
            f"cast with {name}.astype(numpy.float32)",
        )


def _index(name, a, shape, layout, ndim=None):
    """An integer index array of the given shape (or rank)."""
    if np.dtype(a.dtype).kind not in "iu":
        raise explain(
            DTypeError, name, "must hold integers", "int32", dtype_name(a.dtype),
            f"convert with {name}.astype(numpy.int32)",
        )
    if (shape is not None and tuple(a.shape) != shape) or (ndim is not None and a.ndim != ndim):
        raise explain(ShapeError, name, "has the wrong shape", layout, f"shape {_shape(a)}",
                      f"pass {name} with shape {layout}")
