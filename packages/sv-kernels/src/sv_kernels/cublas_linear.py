"""A linear layer as torch runs it for a plain weight: cuBLAS on CUDA, the reference elsewhere.

The one place both dispatchers reach cuBLAS: `ops.linear` when no Triton tile takes the call,
and `quantized_ops` for a quantized weight dequantized first (its "cublas" path).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import reference


def cublas_linear(
    x: Tensor, weight: Tensor, out_dtype: torch.dtype | None = None, bias: Tensor | None = None
) -> Tensor:
    """x [T, K] @ weight [N, K]^T (+ bias [N]), in out_dtype if given. FP32 out of 16-bit
    inputs on CUDA comes straight from cuBLAS's FP32 accumulator (`torch.mm`'s out_dtype): at
    batch 256 the LM head's BF16 logits are 66 MB, and widening them afterwards was a ~95 us
    kernel per step on the H200. Anything else is computed in x's dtype, then converted."""
    if (
        bias is None
        and out_dtype == torch.float32
        and x.is_cuda
        and x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
    ):
        return torch.mm(x, weight.t(), torch.float32)
    out = reference.linear(x, weight, bias)
    return out if out_dtype is None else out.to(out_dtype)
