"""Quantized weight matrices: 8-bit values and one FP32 scale per output channel (row).

A decode step reads every weight once, so its time is the weights' bytes over the memory
bandwidth: one byte per weight instead of BF16's two (FP32's four on the CPU) is what makes
it faster. Row n of the matrix stands for `data[n] * scale[n]`; a per-row scale factors out
of each dot product (y[n] = scale[n] * sum_k x[k] data[n, k]), so kernels apply it once per
output instead of once per weight.

Two kinds:
- `fp8`: float8 e4m3 (max 448), as published FP8 checkpoints (compressed-tensors) ship and
  Hopper's tensor cores multiply;
- `int8`: symmetric int8 (-127..127), which every CPU's vector units and torch's int8 kernels
  handle.

`quantize` is the round-to-nearest, absmax-per-row scheme used to quantize BF16/FP32 weights
at load; `dequantize` is the spec every kernel is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from .errors import KernelError

QuantKind = Literal["fp8", "int8"]
QUANT_KINDS: tuple[QuantKind, ...] = get_args(QuantKind)

STORAGE_DTYPES: dict[QuantKind, torch.dtype] = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
# The largest magnitude of each kind: a row's absmax maps onto it.
MAX_VALUE: dict[QuantKind, float] = {"fp8": 448.0, "int8": 127.0}


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight matrix [N, K] as `data` (N x K values of `kind`) and `scale` [N] (FP32).

    `dtype` is the dtype the matrix stands in for: the activations' (BF16 on the GPU, FP32 on
    the CPU); `dequantize` returns it and the ops check x against it."""

    data: Tensor
    scale: Tensor
    kind: QuantKind
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def tensors(self) -> tuple[Tensor, Tensor]:
        return self.data, self.scale

    def check(self, op: str) -> None:
        """Raise KernelError naming `op` unless data, scale and kind agree (metadata only)."""
        if self.kind not in STORAGE_DTYPES:
            raise KernelError(f"{op}: unknown quantized kind {self.kind!r} ({QUANT_KINDS})")
        if not isinstance(self.data, Tensor) or self.data.dim() != 2:
            raise KernelError(f"{op}: quantized data must be a 2-D tensor [N, K]")
        if self.data.dtype != STORAGE_DTYPES[self.kind]:
            raise KernelError(
                f"{op}: {self.kind} data must be {STORAGE_DTYPES[self.kind]}, got {self.data.dtype}"
            )
        rows = self.data.shape[0]
        if not isinstance(self.scale, Tensor) or self.scale.shape != (rows,):
            got = list(self.scale.shape) if isinstance(self.scale, Tensor) else self.scale
            raise KernelError(f"{op}: scale must be [N] = [{rows}] (one per row), got {got}")
        if self.scale.dtype != torch.float32:
            raise KernelError(f"{op}: scale must be float32, got {self.scale.dtype}")
        if self.scale.device != self.data.device:
            raise KernelError(
                f"{op}: scale is on {self.scale.device} but data on {self.data.device}"
            )
        if not self.dtype.is_floating_point:
            raise KernelError(f"{op}: dtype must be a float dtype, got {self.dtype}")


LinearWeight = Tensor | QuantizedWeight


def quantize(weight: Tensor, kind: QuantKind) -> QuantizedWeight:
    """Quantize `weight` [N, K] per row: scale = absmax(row) / MAX_VALUE[kind], values rounded
    to the nearest representable one. An all-zero row gets scale 1 (its values are 0)."""
    if kind not in STORAGE_DTYPES:
        raise KernelError(f"quantize: kind must be one of {QUANT_KINDS}, got {kind!r}")
    if weight.dim() != 2 or not weight.is_floating_point():
        raise KernelError(
            f"quantize: expected a 2-D float matrix, got {weight.dtype} {weight.dim()}-D"
        )
    w = weight.float()
    absmax = w.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax / MAX_VALUE[kind], torch.ones_like(absmax))
    scaled = w / scale[:, None]
    if kind == "int8":
        data = scaled.round().clamp(-127, 127).to(torch.int8)
    else:
        data = scaled.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return QuantizedWeight(data, scale, kind, weight.dtype)


def dequantize(weight: QuantizedWeight, dtype: torch.dtype | None = None) -> Tensor:
    """The matrix `weight` stands for, data * scale per row, in `dtype` (default its own)."""
    full = weight.data.float() * weight.scale[:, None]
    return full.to(dtype or weight.dtype)


def dequantize_rows(weight: QuantizedWeight, rows: Tensor) -> Tensor:
    """`dequantize(weight)[rows]` without dequantizing the other rows (an embedding gather)."""
    rows = rows.long()
    # Gathered as bytes: index_select is not implemented for FP8 on every backend.
    data = weight.data.view(torch.uint8).index_select(0, rows).view(weight.data.dtype)
    return (data.float() * weight.scale.index_select(0, rows)[:, None]).to(weight.dtype)
