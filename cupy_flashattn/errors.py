"""Typed errors.  Every message names the argument, shows what was expected and what was given,
and says how to fix it, so a user never has to read our source to act on an error.

All classes derive from :class:`FlashAttnError` and from ``ValueError`` or ``TypeError``, so
``except ValueError`` keeps working for code written against flash-attn.
"""

from __future__ import annotations

__all__ = [
    "FlashAttnError",
    "ShapeError",
    "PageSizeMismatchError",
    "DTypeError",
    "LayoutError",
    "ReadOnlyError",
    "DeviceError",
    "SeqlenError",
    "BlockTableError",
    "UnsupportedError",
    "ArgumentError",
    "CacheExhaustedError",
    "explain",
]


class FlashAttnError(Exception):
    """Base class of every error cupy_flashattn raises on bad input."""


class ShapeError(FlashAttnError, ValueError):
    """An argument's rank or a dimension disagrees with the layout or with another argument."""


class PageSizeMismatchError(ShapeError):
    """``page_block_size`` disagrees with the page dimension of the paged k/v cache."""


class DTypeError(FlashAttnError, TypeError):
    """An argument has the wrong dtype or type."""


class LayoutError(FlashAttnError, ValueError):
    """An argument's memory layout (strides) cannot be read by the kernels."""


class ReadOnlyError(LayoutError):
    """An array the call writes in place (``out``, a KV cache that receives new k/v, the pools
    of a PagedKVCache) is read-only (NumPy ``flags.writeable`` is False)."""


class DeviceError(FlashAttnError, TypeError):
    """Arrays live on different devices or in different array libraries."""


class SeqlenError(FlashAttnError, ValueError):
    """cu_seqlens / seqused / cache_seqlens / max_seqlen values are inconsistent."""


class BlockTableError(FlashAttnError, ValueError):
    """The block table of a paged cache is malformed or points outside the page pool."""


class UnsupportedError(FlashAttnError, ValueError):
    """A valid request that this library does not implement (dropout, a head dim too large)."""


class ArgumentError(FlashAttnError, ValueError):
    """A scalar option (softmax_scale, window_size, softcap, num_splits...) is out of range."""


class CacheExhaustedError(FlashAttnError, ValueError):
    """A :class:`~cupy_flashattn.PagedKVCache` has no free page left for an append."""


def explain(cls, argument: str, problem: str, expected, given, fix: str) -> FlashAttnError:
    """Build an error whose text reads as one paragraph:

    ``<argument>: <problem> (expected <expected>, got <given>). Fix: <fix>``
    """
    return cls(f"{argument}: {problem} (expected {expected}, got {given}). Fix: {fix}")
