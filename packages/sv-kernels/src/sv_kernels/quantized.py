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

`quantize` is the round-to-nearest, per-row scheme used to quantize BF16/FP32 weights at
load; `dequantize` is the spec every kernel is tested against.

The scale of a row: int8 maps the row's absmax onto 127. e4m3 rounds each value to 3
mantissa bits whatever the scale, so the scale only decides where each value falls between
two representable ones; `quantize` tries FP8_SCALE_STEPS scales from absmax / 448 up to
twice that (none clips) and keeps, per row, the one of least squared error. On the default
model (SmolLM2-135M) that took fp8's held-out perplexity from +2.40% to +1.91% of FP32's and
its mean KL from 0.032 to 0.024 nats/token (BENCHMARKS.md); 32 scales measured no better.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal, get_args

import torch
from torch import Tensor

from .errors import KernelError

QuantKind = Literal["fp8", "int8"]
QUANT_KINDS: tuple[QuantKind, ...] = get_args(QuantKind)

STORAGE_DTYPES: dict[QuantKind, torch.dtype] = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
# The largest magnitude of each kind: a row's absmax maps onto it (fp8: at most).
MAX_VALUE: dict[QuantKind, float] = {"fp8": 448.0, "int8": 127.0}
# fp8 row scales tried: absmax / 448 * 2 ** (j / FP8_SCALE_STEPS), j = 0 .. FP8_SCALE_STEPS - 1.
FP8_SCALE_STEPS = 8
# Rows quantized at once by the fp8 search: bounds its FP32 temporaries (~64 MiB each).
_SEARCH_ELEMENTS = 1 << 24


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
        if self._problem is not None:
            raise KernelError(f"{op}: {self._problem}")

    @functools.cached_property
    def _problem(self) -> str | None:
        """What is wrong with this weight, or None. Worked out once: the fields are frozen and
        a tensor's dtype, shape and device do not change, and a CPU decode step checks each of
        its 121 matrices, where every microsecond of host time shows."""
        if self.kind not in STORAGE_DTYPES:
            return f"unknown quantized kind {self.kind!r} ({QUANT_KINDS})"
        if not isinstance(self.data, Tensor) or self.data.dim() != 2:
            return "quantized data must be a 2-D tensor [N, K]"
        if self.data.dtype != STORAGE_DTYPES[self.kind]:
            return f"{self.kind} data must be {STORAGE_DTYPES[self.kind]}, got {self.data.dtype}"
        rows = self.data.shape[0]
        if not isinstance(self.scale, Tensor) or self.scale.shape != (rows,):
            got = list(self.scale.shape) if isinstance(self.scale, Tensor) else self.scale
            return f"scale must be [N] = [{rows}] (one per row), got {got}"
        if self.scale.dtype != torch.float32:
            return f"scale must be float32, got {self.scale.dtype}"
        if self.scale.device != self.data.device:
            return f"scale is on {self.scale.device} but data on {self.data.device}"
        if not self.dtype.is_floating_point:
            return f"dtype must be a float dtype, got {self.dtype}"
        return None


LinearWeight = Tensor | QuantizedWeight


@dataclass(frozen=True)
class FP8Rows:
    """Activations x [T, K] already quantized for an FP8 matmul: `values` (e4m3 [T, K]) and
    `scale` (FP32 [T, 1]), x ~= values * scale, as `reference.quantize_rows_fp8` makes them;
    `dtype` is x's. The RMSNorm before q/k/v and gate/up writes these instead of x when the
    matmul after it runs on the FP8 tensor cores (`ops.takes_fp8_rows`): the same bits, one
    kernel fewer per matrix (a ~2 us launch at 256 rows, a host launch in every prompt)."""

    values: Tensor
    scale: Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device


def quantize(weight: Tensor, kind: QuantKind) -> QuantizedWeight:
    """Quantize `weight` [N, K] per row, values rounded to the nearest representable one.
    int8: scale = absmax(row) / 127. fp8: the least-squared-error scale of the candidates
    (see the module doc). An all-zero row gets scale 1 (its values are 0)."""
    if kind not in STORAGE_DTYPES:
        raise KernelError(f"quantize: kind must be one of {QUANT_KINDS}, got {kind!r}")
    if weight.dim() != 2 or not weight.is_floating_point():
        raise KernelError(
            f"quantize: expected a 2-D float matrix, got {weight.dtype} {weight.dim()}-D"
        )
    w = weight.float()
    absmax = w.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax / MAX_VALUE[kind], torch.ones_like(absmax))
    if kind == "int8":
        data = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        return QuantizedWeight(data, scale, kind, weight.dtype)
    rows = max(1, _SEARCH_ELEMENTS // max(1, w.shape[1]))
    parts = [_fp8_rows(w[i : i + rows], scale[i : i + rows]) for i in range(0, w.shape[0], rows)]
    data = torch.cat([d for d, _ in parts]).view(torch.float8_e4m3fn)
    return QuantizedWeight(data, torch.cat([s for _, s in parts]), kind, weight.dtype)


def _fp8_rows(w: Tensor, base: Tensor) -> tuple[Tensor, Tensor]:
    """e4m3 values (as their bytes) and scales of the rows `w` (FP32), each row's scale the
    candidate base * 2 ** (j / FP8_SCALE_STEPS) of least squared error (the first of equals)."""
    best_err = torch.full_like(base, float("inf"))
    best_scale = base.clone()
    # Bytes: torch.where and torch.cat are not implemented for FP8 on every backend.
    best_bytes = torch.zeros(w.shape, dtype=torch.uint8, device=w.device)
    for j in range(FP8_SCALE_STEPS):
        scale = base * 2.0 ** (j / FP8_SCALE_STEPS)
        data = (w / scale[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        err = (data.float() * scale[:, None] - w).square().sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, scale, best_scale)
        best_bytes = torch.where(better[:, None], data.view(torch.uint8), best_bytes)
    return best_bytes, best_scale


def dequantize(weight: QuantizedWeight, dtype: torch.dtype | None = None) -> Tensor:
    """The matrix `weight` stands for, data * scale per row, in `dtype` (default its own):
    each product in FP32, rounded once to `dtype`.

    One elementwise pass writes the result: `torch.mul` into an output of `dtype` computes in
    FP32 and rounds on the store, where widening to FP32, multiplying and narrowing took three
    passes (~19 bytes of traffic per weight instead of 3). On CUDA, `quantized_ops.dequantize`
    runs `triton_ops.dequantize` instead, the same values at copy bandwidth (torch's
    mixed-type multiply ran at ~0.7 TB/s there, BENCHMARKS.md run 121). torch does not
    promote FP8 with other types, so FP8 data is widened to BF16 first: exact, as every e4m3
    value is a BF16 value."""
    data = weight.data
    if data.dtype == torch.float8_e4m3fn:
        data = data.to(torch.bfloat16)
    out = torch.empty(weight.shape, dtype=dtype or weight.dtype, device=data.device)
    return torch.mul(data, weight.scale[:, None], out=out)


def dequantize_rows(weight: QuantizedWeight, rows: Tensor) -> Tensor:
    """`dequantize(weight)[rows]` without dequantizing the other rows (an embedding gather)."""
    rows = rows.long()
    # Gathered as bytes: index_select is not implemented for FP8 on every backend.
    data = weight.data.view(torch.uint8).index_select(0, rows).view(weight.data.dtype)
    return dequantize(replace(weight, data=data, scale=weight.scale.index_select(0, rows)))


@dataclass(frozen=True)
class ScaledProduct:
    """An FP8 matmul's output with its scales not yet applied: y = (product * row_scale) *
    col_scale, rounded to `dtype` (`reference.scale_product`), from `product` (FP32 [T, N],
    the e4m3 operands multiplied with unit scales), `row_scale` (FP32 [T, 1], the
    activations') and `col_scale` (FP32 [N], the weight's). The RMSNorm after the o and down
    projections applies them as it reads y (`ops.linear(defer_scales=True)`): one kernel fewer
    per matrix than `scaled_mm_tensorwise`'s own scaling kernel."""

    product: Tensor
    row_scale: Tensor
    col_scale: Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.product.shape

    @property
    def device(self) -> torch.device:
        return self.product.device
