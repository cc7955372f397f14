"""Triton implementations of every op, each with the signature of its twin in `sv_kernels.reference`.

Importing this package imports triton; `sv_kernels.ops` does so only when a CUDA tensor arrives.
Under TRITON_INTERPRET=1 the kernels run on CPU tensors; see `_interpreter` for two fixes to
Triton's interpreter that this package applies in that mode.
"""

from ._common import INTERPRET
from ._interpreter import apply_interpreter_fixes

if INTERPRET:
    apply_interpreter_fixes()

from .decode_attention import choose_num_splits, paged_decode_attention
from .decode_metadata import decode_metadata
from .dequantize import dequantize
from .embedding import embedding
from .feed_tokens import feed_tokens
from .few_rows import few_rows_linear
from .gemv import gemv
from .prefill_attention import prefill_attention
from .qkv_rope_cache import fits as qkv_rope_fits
from .qkv_rope_cache import qkv_rope_cache
from .quantize_rows import quantize_rows_fp8
from .rms_norm import rms_norm
from .rope_cache import rope_cache_write
from .sampling import argmax, sample
from .scale_product import scale_product
from .swiglu import swiglu
from .token_bitmask import apply_token_bitmask
from .token_logprobs import token_logprobs
from .w8a16 import w8a16_matmul

__all__ = [
    "apply_token_bitmask",
    "argmax",
    "choose_num_splits",
    "decode_metadata",
    "dequantize",
    "embedding",
    "feed_tokens",
    "few_rows_linear",
    "gemv",
    "paged_decode_attention",
    "prefill_attention",
    "qkv_rope_cache",
    "qkv_rope_fits",
    "quantize_rows_fp8",
    "rms_norm",
    "rope_cache_write",
    "sample",
    "scale_product",
    "swiglu",
    "token_logprobs",
    "w8a16_matmul",
]
