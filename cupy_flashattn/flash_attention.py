"""``FlashAttention``: a reusable, configured attention object (the project seed's "builder").

Model code usually fixes the softmax scale, masks, softcap, ALiBi slopes and the KV cache's page
size once and then calls attention many times.  This object validates that configuration once,
at construction, and is then called like the functions::

    attn = FlashAttention(causal=True, page_block_size=16)
    out = attn(q, k, v)                                   # flash_attn_func
    out = attn.varlen(q, k, v, cu_q, cu_k, max_q, max_k)  # flash_attn_varlen_func
    out = attn.with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens,
                            block_table=table)            # flash_attn_with_kvcache

A configured ``page_block_size`` is compared with every paged cache it meets: a cache allocated
with another page size raises :class:`~cupy_flashattn.errors.PageSizeMismatchError` showing both
values and the fix, before any kernel runs.
"""

from __future__ import annotations

from . import api, validate


class FlashAttention:
    """Configured attention.

    Arguments (validated once here):
        softmax_scale: float or None (``1 / sqrt(head_dim)``).
        causal: bottom-right aligned causal mask.
        window_size: ``(left, right)`` local window, -1 = unlimited.
        softcap: logit soft cap (0 disables).
        alibi_slopes: float32 ``(H,)`` or ``(B, H)`` (checked against q at call time).
        sinks: float32 ``(H,)`` attention-sink logits (see :func:`flash_attn_func`).
        mm_prefix_ranges: int32 ``(B, max_ranges, 2)`` (see :func:`flash_attn_func`).
        page_block_size: the page size this model's paged cache uses, or None to read it from
            each cache.
        check: value checks that synchronise with the device (see the functions).
    """

    def __init__(self, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 alibi_slopes=None, page_block_size=None, check=None, sinks=None,
                 mm_prefix_ranges=None):
        validate.softmax_scale(softmax_scale)
        validate.window_size(window_size)
        validate.softcap(softcap)
        if page_block_size is not None:
            validate.page_block_size_value(page_block_size)
        self.softmax_scale = softmax_scale
        self.causal = bool(causal)
        self.window_size = tuple(int(w) for w in window_size)
        self.softcap = float(softcap)
        self.alibi_slopes = alibi_slopes
        self.sinks = sinks
        self.mm_prefix_ranges = mm_prefix_ranges
        self.page_block_size = page_block_size
        self.check = check

    def _options(self):
        return dict(softmax_scale=self.softmax_scale, causal=self.causal,
                    window_size=self.window_size, softcap=self.softcap,
                    alibi_slopes=self.alibi_slopes, sinks=self.sinks,
                    mm_prefix_ranges=self.mm_prefix_ranges, check=self.check)

    def __call__(self, q, k, v, *, return_softmax_lse=False, out=None, k_scale=None,
                 v_scale=None, kv_cache_dtype=None):
        """Dense attention (:func:`~cupy_flashattn.flash_attn_func`) with this configuration
        (``k_scale`` / ``v_scale`` / ``kv_cache_dtype``: a float8 k / v's scales and format,
        per call like the arrays)."""
        return api.flash_attn_func(q, k, v, return_softmax_lse=return_softmax_lse, out=out,
                                   k_scale=k_scale, v_scale=v_scale,
                                   kv_cache_dtype=kv_cache_dtype, **self._options())

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               block_table=None, *, seqused_k=None, seq_ids=None, return_softmax_lse=False,
               out=None, k_scale=None, v_scale=None, kv_cache_dtype=None):
        """Varlen / paged attention (:func:`~cupy_flashattn.flash_attn_varlen_func`)."""
        return api.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            block_table=block_table, page_block_size=self._page_size_for(block_table, k),
            seqused_k=seqused_k, seq_ids=seq_ids, return_softmax_lse=return_softmax_lse,
            out=out, k_scale=k_scale, v_scale=v_scale, kv_cache_dtype=kv_cache_dtype,
            **self._options(),
        )

    def with_kvcache(self, q, k_cache, v_cache=None, k=None, v=None, *, rotary_cos=None,
                     rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                     cache_leftpad=None, block_table=None, rotary_interleaved=True,
                     num_splits=0, seq_ids=None, return_softmax_lse=False, out=None,
                     k_scale=None, v_scale=None, kv_cache_dtype=None):
        """Decode against a KV cache (:func:`~cupy_flashattn.flash_attn_with_kvcache`)."""
        return api.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
            cache_leftpad=cache_leftpad, block_table=block_table,
            rotary_interleaved=rotary_interleaved, num_splits=num_splits,
            return_softmax_lse=return_softmax_lse,
            page_block_size=self._page_size_for(block_table, k_cache), seq_ids=seq_ids,
            out=out, k_scale=k_scale, v_scale=v_scale, kv_cache_dtype=kv_cache_dtype,
            **self._options(),
        )

    def _page_size_for(self, block_table, k):
        """The configured page size applies to paged calls only (a dense call has no pages)."""
        from .kvcache import PagedKVCache

        paged = block_table is not None or isinstance(k, PagedKVCache)
        return self.page_block_size if paged else None

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k,
                           v in vars(self).items() if k not in ("alibi_slopes", "sinks",
                           "mm_prefix_ranges"))
        return f"FlashAttention({fields})"
