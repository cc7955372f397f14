"""`ops.linear` and `ops.linear_swiglu` for a `QuantizedWeight`: the checks and the kernel choice.

- CUDA, one row, a plan with a GEMV tile: the Triton GEMV reads the 8-bit values, converts
  them in registers and applies the row scales to its FP32 sums (half BF16's bytes).
- CUDA, other calls: the plan's path for the row count (`LinearPlan.quantized_path`: up to
  FEW_ROWS rows a verify step or a small decode batch, up to MANY_ROWS a large decode batch,
  above that a step with prompt chunks); the tuner times each path per matrix at one row
  count per band. The paths: the 1-byte weights widened in registers for the 16-bit tensor
  cores (`triton_ops.w8a16_matmul`, up to W8A16_MAX_ROWS rows: past them, as in a prompt,
  dequantizing for cuBLAS is faster and runs instead), FP8 tensor cores with per-token
  activation scales (`scaled_mm`, the scales in cuBLAS's epilogue; `scaled_mm_tensorwise`,
  unit scales in cuBLAS and both scale vectors in a kernel after it, or in the RMSNorm that
  reads its product: `ScaledProduct`), or the matrix dequantized to x's dtype (by
  `triton_ops.dequantize`) for cuBLAS. The FP8 paths take x quantized already (`FP8Rows`) from
  the kernel that made it where the model asks (`ops.takes_fp8_rows`).
- CPU, int8, up to INT8_KERNEL_MAX_ROWS rows (decode steps): torch's int8 weight kernel
  (`torch._weight_int8pack_mm`, AVX2/AVX-512 vectorized) on BF16 activations; its batch-1
  matmuls took 2.6-2.9x less time than FP32's at the default model's shapes on the 2-core
  development machine. It runs on one thread or all of torch's, whichever measures faster at
  the moment (`int8_threads`). At 512 rows (a prompt) it was slower than dequantizing for FP32's
  matmul, which then runs instead. It crashes (SIGSEGV, torch 2.13) when K is not a multiple
  of 8, so such a matrix takes the reference. Its per-row scales are BF16, so it gets scales of
  1 and the FP32 scales are applied to its output.
- anything else: the reference (dequantize, then matmul).
"""

from __future__ import annotations

import functools
from typing import Literal, Protocol, overload

import torch
from torch import Tensor

from . import int8_threads, quantized, reference
from .cublas_linear import cublas_linear
from .errors import KernelError
from .linear_plan import W8A16_MAX_ROWS, LinearPlan, QuantizedPath
from .quantized import FP8Rows, QuantizedWeight, ScaledProduct

# torch._weight_int8pack_mm needs K % 8 == 0; it wins at decode batch sizes (see the module doc).
_INT8PACK_K_MULTIPLE = 8
INT8_KERNEL_MAX_ROWS = 16
# The activation types the 8-bit-weight matmul multiplies in (its tensor cores' 16-bit inputs).
W8A16_DTYPES = (torch.bfloat16, torch.float16)
# The paths that multiply on the FP8 tensor cores, whose activations are `FP8Rows`.
FP8_PATHS: tuple[QuantizedPath, ...] = ("scaled_mm", "scaled_mm_tensorwise")
FP8_DTYPE = torch.float8_e4m3fn
# torch._scaled_mm needs both matrix dims of the weight to be multiples of 16.
_SCALED_MM_MULTIPLE = 16
# The types torch._scaled_mm writes with per-row scales (FP32 checked on the H200, torch 2.11,
# run 145).
_SCALED_MM_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_linear(op: str, x: Tensor | FP8Rows, weight: QuantizedWeight) -> None:
    weight.check(op)
    if isinstance(x, FP8Rows):
        _check_fp8_rows(op, x)
    elif not isinstance(x, Tensor) or x.dim() != 2:
        raise KernelError(f"{op}: x must be a 2-D tensor [T, K] with a quantized weight")
    if x.shape[1] != weight.shape[1]:
        raise KernelError(
            f"{op}: x has {x.shape[1]} features, the weight {list(weight.shape)} expects "
            f"{weight.shape[1]}"
        )
    if x.dtype != weight.dtype:
        raise KernelError(f"{op}: x is {x.dtype}, the quantized weight stands for {weight.dtype}")
    if x.device != weight.device:
        raise KernelError(f"{op}: x is on {x.device}, the weight on {weight.device}")


def _check_fp8_rows(op: str, x: FP8Rows) -> None:
    values, scale = x.values, x.scale
    if not isinstance(values, Tensor) or values.dim() != 2 or values.dtype != FP8_DTYPE:
        raise KernelError(f"{op}: FP8 rows' values must be a 2-D {FP8_DTYPE} tensor [T, K]")
    if not isinstance(scale, Tensor) or scale.shape != (values.shape[0], 1):
        raise KernelError(f"{op}: FP8 rows' scale must be [T, 1] = [{values.shape[0]}, 1]")
    if scale.dtype != torch.float32 or scale.device != values.device:
        raise KernelError(f"{op}: FP8 rows' scale must be float32 on the values' device")


@overload
def linear(
    x: Tensor | FP8Rows,
    weight: QuantizedWeight,
    out_dtype: torch.dtype | None,
    plan: LinearPlan,
    defer_scales: Literal[False] = False,
) -> Tensor: ...
@overload
def linear(
    x: Tensor | FP8Rows,
    weight: QuantizedWeight,
    out_dtype: torch.dtype | None,
    plan: LinearPlan,
    defer_scales: bool,
) -> Tensor | ScaledProduct: ...


def linear(
    x: Tensor | FP8Rows,
    weight: QuantizedWeight,
    out_dtype: torch.dtype | None,
    plan: LinearPlan,
    defer_scales: bool = False,
) -> Tensor | ScaledProduct:
    """`ops.linear` for a quantized weight. `defer_scales`: a call that runs
    `scaled_mm_tensorwise` returns its unscaled product (`ScaledProduct`), for a consumer that
    scales it as it reads it; any other call returns the tensor."""
    check_linear("linear", x, weight)
    if isinstance(x, FP8Rows):
        path = cuda_path(x, weight, plan) if x.values.is_cuda else None
        if path not in FP8_PATHS:
            raise KernelError(
                f"linear: FP8 rows are the input of an FP8 tensor-core path; this call's is "
                f"{path or 'the CPU reference'} (ask ops.takes_fp8_rows first)"
            )
        if path == "scaled_mm":
            return scaled_mm(x, weight, out_dtype)
        return scaled_mm_tensorwise(x, weight, out_dtype, defer_scales)
    if x.is_cuda:
        if plan.one_row_gemv is not None and x.shape[0] == 1:
            from . import triton_ops

            return triton_ops.gemv(
                x, weight.data, plan.one_row_gemv, out_dtype=out_dtype, scale=weight.scale
            )
        path = cuda_path(x, weight, plan)
        if path == "scaled_mm_tensorwise":
            return scaled_mm_tensorwise(x, weight, out_dtype, defer_scales)
        out = PATH_CALLS[path](x, weight, out_dtype)
    elif (
        weight.kind == "int8"
        and weight.shape[1] % _INT8PACK_K_MULTIPLE == 0
        and x.shape[0] <= INT8_KERNEL_MAX_ROWS
    ):
        out = int8_cpu(x, weight)
    else:
        out = reference.linear(x, weight)
    return out if out_dtype is None else out.to(out_dtype)


def linear_swiglu(x: Tensor | FP8Rows, gate_up: QuantizedWeight, plan: LinearPlan) -> Tensor | None:
    """The fused one-row GEMV + SwiGLU when the plan and shapes allow it, else None (the
    caller runs linear, then swiglu)."""
    check_linear("linear_swiglu", x, gate_up)
    tile = plan.one_row_gemv
    if isinstance(x, FP8Rows) or tile is None or not x.is_cuda or x.shape[0] != 1:
        return None
    if gate_up.shape[0] % 2:  # not a packed [gate; up] pair
        return None
    from . import triton_ops

    return triton_ops.gemv(x, gate_up.data, tile, swiglu=True, scale=gate_up.scale)


def int8_cpu(x: Tensor, weight: QuantizedWeight) -> Tensor:
    """x @ dequantize(weight)^T through torch's int8 CPU kernel, x rounded to BF16 for it."""
    x16, unit = x.to(torch.bfloat16), _unit_scales(weight.shape[0])
    # On one thread or all, as measured (int8_threads: on a busy machine two can be 30x slower).
    choice = int8_threads.choice_for(weight.shape)
    out = choice.run(lambda: torch._weight_int8pack_mm(x16, weight.data, unit))
    out = out * weight.scale  # BF16 times FP32 promotes: the product is FP32's
    return out if out.dtype == x.dtype else out.to(x.dtype)


@functools.cache
def _unit_scales(rows: int) -> Tensor:
    """The kernel's BF16 row scales: all 1 (the FP32 scales are applied to its output). Made
    once per row count, never written: a fresh tensor per call was one more torch call per
    matrix of a decode step, which costs microseconds whatever its size."""
    return torch.ones(rows, dtype=torch.bfloat16)


def dequantize(weight: QuantizedWeight, dtype: torch.dtype) -> Tensor:
    """`quantized.dequantize(weight, dtype)`: on CUDA by one Triton kernel at copy bandwidth
    (torch's mixed-type multiply ran at ~0.7 TB/s there), elsewhere by the reference."""
    if weight.data.is_cuda:
        from . import triton_ops

        return triton_ops.dequantize(weight, dtype)
    return quantized.dequantize(weight, dtype)


def cuda_path(x: Tensor | FP8Rows, weight: QuantizedWeight, plan: LinearPlan) -> QuantizedPath:
    """The path of a CUDA call of x's rows that no GEMV tile takes: `band_path`."""
    return band_path(x.shape[0], x.dtype, weight, plan)


def band_path(
    rows: int, dtype: torch.dtype, weight: QuantizedWeight, plan: LinearPlan
) -> QuantizedPath:
    """The path of a CUDA call of `rows` rows of `dtype` that no GEMV tile takes: the plan's
    for the row band, unless that path cannot take the call (w8a16 past W8A16_MAX_ROWS rows or
    for other activation types, scaled_mm for int8 or shapes `torch._scaled_mm` refuses),
    when the weight is dequantized for cuBLAS instead."""
    path = plan.quantized_path(rows)
    if (path == "w8a16" and not w8a16_fits(rows, dtype)) or (
        path in FP8_PATHS and not scaled_mm_fits(weight)
    ):
        return "cublas"
    return path


def w8a16_fits(rows: int, dtype: torch.dtype) -> bool:
    """The 8-bit-weight matmul takes the call: 16-bit activations, at most W8A16_MAX_ROWS."""
    return dtype in W8A16_DTYPES and rows <= W8A16_MAX_ROWS


def scaled_mm_fits(weight: QuantizedWeight) -> bool:
    n, k = weight.shape
    return weight.kind == "fp8" and n % _SCALED_MM_MULTIPLE == 0 and k % _SCALED_MM_MULTIPLE == 0


def scaled_mm(
    x: Tensor | FP8Rows, weight: QuantizedWeight, out_dtype: torch.dtype | None = None
) -> Tensor:
    """x @ dequantize(weight)^T on FP8 tensor cores: each row of x quantized to e4m3 with its
    own scale (absmax / 448, one kernel: `triton_ops.quantize_rows_fp8`, unless x comes as
    `FP8Rows`), the product scaled by
    both scales in the GEMM's epilogue and written in out_dtype (default x's). FP32 comes
    straight from the FP32 accumulator: the LM head's logits at 256 rows written as BF16 and
    widened afterwards took 219 us on the H200, written as FP32 138 (and unrounded)."""
    xq, x_scale = _quantize_rows_fp8(x)
    want = out_dtype or x.dtype
    written = want if want in _SCALED_MM_OUT_DTYPES else torch.bfloat16
    out = torch._scaled_mm(
        xq,
        weight.data.t(),
        scale_a=x_scale,
        scale_b=weight.scale[None, :],
        out_dtype=written,
    )
    return out.to(want)


@overload
def scaled_mm_tensorwise(
    x: Tensor | FP8Rows,
    weight: QuantizedWeight,
    out_dtype: torch.dtype | None = None,
    defer_scales: Literal[False] = False,
) -> Tensor: ...
@overload
def scaled_mm_tensorwise(
    x: Tensor | FP8Rows, weight: QuantizedWeight, out_dtype: torch.dtype | None, defer_scales: bool
) -> Tensor | ScaledProduct: ...


def scaled_mm_tensorwise(
    x: Tensor | FP8Rows,
    weight: QuantizedWeight,
    out_dtype: torch.dtype | None = None,
    defer_scales: bool = False,
) -> Tensor | ScaledProduct:
    """What `scaled_mm` computes, with the scales applied after the matmul instead of in it:
    the e4m3 activations times the e4m3 weights on the FP8 tensor cores with unit per-tensor
    scales, an FP32 product, then one kernel multiplying each row by its token's scale and each
    column by its channel's (`triton_ops.scale_product`). cuBLAS picks other kernels for
    per-tensor scales than for a scale vector: at 256 rows on the H200 the down projection
    (2048 x 8192) took 12.8 us against 22.9, q/k/v 6.8 against 9.2 (run 147).
    `defer_scales` returns the product and its scales unapplied (`ScaledProduct`)."""
    xq, x_scale = _quantize_rows_fp8(x)
    unit = _unit_scale(x.device)
    product = torch._scaled_mm(
        xq, weight.data.t(), scale_a=unit, scale_b=unit, out_dtype=torch.float32
    )
    if defer_scales:
        return ScaledProduct(product, x_scale, weight.scale, out_dtype or x.dtype)
    if x.device.type == "cuda":
        from . import triton_ops

        return triton_ops.scale_product(product, x_scale, weight.scale, out_dtype or x.dtype)
    return reference.scale_product(product, x_scale, weight.scale, out_dtype or x.dtype)


def _quantize_rows_fp8(x: Tensor | FP8Rows) -> tuple[Tensor, Tensor]:
    """The FP8 matmuls' activations: x's own if it comes quantized, else `fp8_rows(x)`'s."""
    rows = x if isinstance(x, FP8Rows) else fp8_rows(x)
    return rows.values, rows.scale


def fp8_rows(x: Tensor) -> FP8Rows:
    """x [T, K] as an FP8 matmul's activations (`reference.quantize_rows_fp8`): on CUDA by
    `triton_ops.quantize_rows_fp8` (one kernel, the reference's bits), elsewhere by the
    reference. The one place `FP8Rows` are made from a tensor outside the kernels that write
    them themselves."""
    if x.device.type == "cuda":
        from . import triton_ops

        return FP8Rows(*triton_ops.quantize_rows_fp8(x), x.dtype)
    return FP8Rows(*reference.quantize_rows_fp8(x), x.dtype)


_UNIT_SCALES: dict[torch.device, Tensor] = {}


def _unit_scale(device: torch.device) -> Tensor:
    """A scalar 1.0 on device, made once (outside a CUDA graph capture: one made inside would
    hold its value only once the graph ran) and never written."""
    unit = _UNIT_SCALES.get(device)
    if unit is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelError(
                "scaled_mm_tensorwise: first call on this device inside a CUDA graph capture; "
                "run it once before capturing (the tuner does)"
            )
        unit = _UNIT_SCALES[device] = torch.ones((), dtype=torch.float32, device=device)
    return unit


def dequantized_linear(
    x: Tensor, weight: QuantizedWeight, out_dtype: torch.dtype | None = None
) -> Tensor:
    """x @ dequantize(weight)^T by cuBLAS, the weight dequantized to x's dtype first and then
    multiplied as `ops.linear` multiplies a plain weight (`cublas_linear`: FP32 out of 16-bit x
    straight from cuBLAS's accumulator)."""
    return cublas_linear(x, dequantize(weight, x.dtype), out_dtype)


def w8a16(x: Tensor, weight: QuantizedWeight, out_dtype: torch.dtype | None = None) -> Tensor:
    """x @ dequantize(weight)^T by `triton_ops.w8a16_matmul` (the 8-bit values widened in
    registers for the 16-bit tensor cores, the row scales applied to the FP32 sums, written
    in out_dtype)."""
    from . import triton_ops

    return triton_ops.w8a16_matmul(x, weight.data, weight.scale, out_dtype=out_dtype)


class _PathCall(Protocol):
    def __call__(
        self, x: Tensor, weight: QuantizedWeight, out_dtype: torch.dtype | None = None
    ) -> Tensor: ...


# What each path runs on CUDA: `linear` calls these, and the tuner times these same calls.
PATH_CALLS: dict[QuantizedPath, _PathCall] = {
    "cublas": dequantized_linear,
    "scaled_mm": scaled_mm,
    "w8a16": w8a16,
    "scaled_mm_tensorwise": scaled_mm_tensorwise,
}
