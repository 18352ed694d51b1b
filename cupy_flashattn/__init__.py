"""cupy_flashattn: FlashAttention forward for CuPy arrays (CUDA kernels compiled at run time
through NVRTC) with a Numba CPU backend for NumPy arrays, and flash-attn's API.

Dense, variable-length and paged-KV-cache batches; prefill and decode; GQA/MQA; causal and
local windows; ALiBi; softcap.  See README.md.
"""

from .api import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from .errors import (
    ArgumentError,
    BlockTableError,
    CacheExhaustedError,
    DeviceError,
    DTypeError,
    FlashAttnError,
    LayoutError,
    PageSizeMismatchError,
    ReadOnlyError,
    SeqlenError,
    ShapeError,
    UnsupportedError,
)
from .flash_attention import FlashAttention
from .kvcache import DecodeSteps, PagedKVCache
from .merge import merge_attention_states
from .precision import get_float32_precision, set_float32_precision

__version__ = "0.1.0"

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "FlashAttention",
    "PagedKVCache",
    "DecodeSteps",
    "merge_attention_states",
    "set_float32_precision",
    "get_float32_precision",
    "precompile",
    "FlashAttnError",
    "ArgumentError",
    "BlockTableError",
    "CacheExhaustedError",
    "DeviceError",
    "DTypeError",
    "LayoutError",
    "PageSizeMismatchError",
    "ReadOnlyError",
    "SeqlenError",
    "ShapeError",
    "UnsupportedError",
]


def precompile(*args, **kwargs):
    """Compile CUDA kernels ahead of first use (see ``cupy_flashattn._cuda.precompile``)."""
    from . import _cuda

    return _cuda.precompile(*args, **kwargs)
