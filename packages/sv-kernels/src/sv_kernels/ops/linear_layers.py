"""The embedding, RMSNorm, linear projections and SwiGLU, for plain and quantized weights
(`LinearWeight`), and `tune_linear`, which picks each weight's matmul kernels (its `LinearPlan`).

Around an FP8 matmul the norm and SwiGLU can write their output as its activations (`FP8Rows`),
and the norm can apply a deferred FP8 product's scales (`ScaledProduct`); `takes_fp8_rows`
says where the model should ask for FP8 rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, overload

import torch
from torch import Tensor

from .. import cpu_ops, quantized_ops, reference
from ..cublas_linear import cublas_linear
from ..linear_plan import CUBLAS, LinearPlan, TunedLinear
from ..quantized import FP8Rows, LinearWeight, QuantizedWeight, ScaledProduct
from ..tuning_cache import TuningCache
from .checks import (
    check_bias,
    check_device,
    check_dims,
    check_float,
    check_int,
    fail,
    few_rows,
    on_cpu,
    on_cuda,
    shape_str,
)


def embedding(ids: Tensor, weight: LinearWeight) -> Tensor:
    op = "embedding"
    check_dims(op, "ids", ids, 1, "[T]")
    check_int(op, "ids", ids)
    if isinstance(weight, QuantizedWeight):  # a quantized tied LM head: gather and dequantize
        weight.check(op)
        check_device(op, ids=ids, weight=weight.data)
    else:
        check_dims(op, "weight", weight, 2, "[V, H]")
        check_device(op, ids=ids, weight=weight)
    if on_cuda(weight):
        from .. import triton_ops

        return triton_ops.embedding(ids, weight)
    return reference.embedding(ids, weight)


@overload
def rms_norm(
    x: Tensor | ScaledProduct,
    weight: Tensor,
    eps: float,
    residual: Tensor | None = None,
    *,
    fp8_rows: Literal[False] = False,
) -> tuple[Tensor, Tensor]: ...
@overload
def rms_norm(
    x: Tensor | ScaledProduct,
    weight: Tensor,
    eps: float,
    residual: Tensor | None = None,
    *,
    fp8_rows: bool,
) -> tuple[Tensor | FP8Rows, Tensor]: ...


def rms_norm(
    x: Tensor | ScaledProduct,
    weight: Tensor,
    eps: float,
    residual: Tensor | None = None,
    *,
    fp8_rows: bool = False,
) -> tuple[Tensor | FP8Rows, Tensor]:
    """`reference.rms_norm`; with `fp8_rows` (x [T, H], a weight of x's dtype) the normalized
    rows as an FP8 matmul's activations (`FP8Rows`, what `reference.quantize_rows_fp8` makes
    of them): on CUDA written so by the norm's own kernel. Ask for them where
    `takes_fp8_rows` says the next matmul would quantize them itself.

    x may be an FP8 matmul's `ScaledProduct` (with a residual: the o and down projections'
    outputs): the norm sees `reference.scale_product` of it, on CUDA scaled by its own kernel."""
    op = "rms_norm"
    if isinstance(x, ScaledProduct):
        _check_scaled_product(op, x, residual)
        if on_cuda(x.product):
            _check_norm_args(op, x.product.shape, x.dtype, weight, eps, residual, fp8_rows)
            check_device(op, x=x.product, weight=weight, residual=residual)
            from .. import triton_ops

            return triton_ops.rms_norm(x, weight, eps, residual, fp8_rows)
        x = reference.scale_product(x.product, x.row_scale, x.col_scale, x.dtype)
    if not isinstance(x, Tensor) or x.dim() < 1:
        fail(op, "x must be a tensor [..., H]")
    check_float(op, "x", x)
    _check_norm_args(op, x.shape, x.dtype, weight, eps, residual, fp8_rows)
    check_device(op, x=x, weight=weight, residual=residual)
    if on_cuda(x):
        from .. import triton_ops

        return triton_ops.rms_norm(x, weight, eps, residual, fp8_rows)
    if on_cpu(x):
        out, s = cpu_ops.rms_norm(x, weight, eps, residual)
    else:
        out, s = reference.rms_norm(x, weight, eps, residual)
    if fp8_rows:
        return quantized_ops.fp8_rows(out), s
    return out, s


def _check_norm_args(
    op: str,
    shape: torch.Size,
    dtype: torch.dtype,
    weight: Tensor,
    eps: float,
    residual: Tensor | None,
    fp8_rows: bool,
) -> None:
    """rms_norm's arguments beside x, for an x of `shape` and `dtype`."""
    check_dims(op, "weight", weight, 1, "[H]")
    if weight.shape[0] != shape[-1]:
        fail(
            op, f"weight has {weight.shape[0]} along dim 0, expected {shape[-1]} (x's hidden size)"
        )
    if residual is not None and residual.shape != shape:
        fail(
            op, f"residual {shape_str(residual)} must have x's shape [{', '.join(map(str, shape))}]"
        )
    if eps < 0:
        fail(op, f"eps must be >= 0, got {eps}")
    if fp8_rows and (len(shape) != 2 or weight.dtype != dtype):
        fail(
            op,
            f"FP8 rows need x [T, H] and a weight of x's dtype, got x "
            f"[{', '.join(map(str, shape))}] {dtype}, weight {weight.dtype}",
        )


def _check_scaled_product(op: str, x: ScaledProduct, residual: Tensor | None) -> None:
    """A `ScaledProduct` as `quantized_ops.scaled_mm_tensorwise` makes it; the norm takes one
    only with a residual, whose dtype is the product's nominal dtype."""
    product, rows, cols = x.product, x.row_scale, x.col_scale
    if not isinstance(product, Tensor) or product.dim() != 2 or product.dtype != torch.float32:
        fail(op, "a scaled product must be an FP32 tensor [T, N]")
    if not isinstance(rows, Tensor) or rows.shape != (product.shape[0], 1):
        fail(op, f"its row scales must be [T, 1] = [{product.shape[0]}, 1]")
    if not isinstance(cols, Tensor) or cols.shape != (product.shape[1],):
        fail(op, f"its column scales must be [N] = [{product.shape[1]}]")
    if rows.dtype != torch.float32 or cols.dtype != torch.float32:
        fail(op, "its scales must be float32")
    check_device(op, product=product, row_scale=rows, col_scale=cols)
    if residual is None or residual.dtype != x.dtype:
        fail(op, f"a scaled product needs a residual of its dtype {x.dtype}")


def takes_fp8_rows(weight: LinearWeight, plan: LinearPlan, rows: int, dtype: torch.dtype) -> bool:
    """Whether `linear(x, weight, plan=plan)` for x of `rows` rows of `dtype` runs on the FP8
    tensor cores and would quantize x itself: then the op that makes x can make `FP8Rows`
    instead (`rms_norm(fp8_rows=True)`), and `linear`, `linear_swiglu` and `qkv_rope_cache`
    take them."""
    return (
        isinstance(weight, QuantizedWeight)
        and on_cuda(weight)
        and not (rows == 1 and plan.one_row_gemv is not None)
        and quantized_ops.band_path(rows, dtype, weight, plan) in quantized_ops.FP8_PATHS
    )


@overload
def linear(
    x: Tensor | FP8Rows,
    weight: LinearWeight,
    out_dtype: torch.dtype | None = None,
    plan: LinearPlan = CUBLAS,
    bias: Tensor | None = None,
    *,
    defer_scales: Literal[False] = False,
) -> Tensor: ...
@overload
def linear(
    x: Tensor | FP8Rows,
    weight: LinearWeight,
    out_dtype: torch.dtype | None = None,
    plan: LinearPlan = CUBLAS,
    bias: Tensor | None = None,
    *,
    defer_scales: bool,
) -> Tensor | ScaledProduct: ...


def linear(
    x: Tensor | FP8Rows,
    weight: LinearWeight,
    out_dtype: torch.dtype | None = None,
    plan: LinearPlan = CUBLAS,
    bias: Tensor | None = None,
    *,
    defer_scales: bool = False,
) -> Tensor | ScaledProduct:
    """x [T, K] @ weight [N, K]^T (+ bias [N]), as `torch.nn.functional.linear` (cuBLAS on
    CUDA), in out_dtype if given (the LM head's FP32 logits; on the CPU, `.to(out_dtype)`
    afterwards). The bias is added to the FP32 accumulator, before the rounding to x's dtype.

    `plan` is this weight's (see `linear_plan`): a one-row CUDA call (a batch-1 decode step)
    goes to the Triton GEMV with the plan's tile when it has one, a call of 2 to 16 rows (a
    verify step) to the few-row kernel with its tile when it has one; both write out_dtype
    themselves, rounded to x's dtype first.
    Anything else is `cublas_linear`, whose FP32 out of 16-bit inputs comes straight from
    cuBLAS's FP32 accumulator: those logits are then not rounded to BF16 first, unlike the
    GEMV's (BF16 results may differ across batch sizes anyway).

    A `QuantizedWeight` (FP8 or int8 with per-row scales) goes to `quantized_ops.linear`, which
    also takes x as `FP8Rows` where the plan multiplies on the FP8 tensor cores. With
    `defer_scales` (and no bias) a call that runs `scaled_mm_tensorwise` returns its product
    with the scales unapplied (`ScaledProduct`), which `rms_norm` applies as it reads it.
    """
    if bias is not None:
        check_bias("linear", bias, weight, x)
    if isinstance(weight, QuantizedWeight):  # the bias after the scaled product, in out's dtype
        if bias is None:
            return quantized_ops.linear(x, weight, out_dtype, plan, defer_scales)
        out = quantized_ops.linear(x, weight, out_dtype, plan)
        return out + bias.to(out.dtype)
    if isinstance(x, FP8Rows):
        fail("linear", f"FP8 rows are an FP8 matmul's input; the weight is {weight.dtype}")
    if plan.one_row_gemv is not None and on_cuda(x) and x.dim() == 2 and x.shape[0] == 1:
        from .. import triton_ops

        return triton_ops.gemv(x, weight, plan.one_row_gemv, out_dtype=out_dtype, bias=bias)
    if plan.few_rows is not None and few_rows(x):
        from .. import triton_ops

        return triton_ops.few_rows_linear(x, weight, plan.few_rows, out_dtype=out_dtype, bias=bias)
    return cublas_linear(x, weight, out_dtype, bias)


@overload
def linear_swiglu(
    x: Tensor | FP8Rows,
    gate_up: LinearWeight,
    plan: LinearPlan = CUBLAS,
    *,
    fp8_rows: Literal[False] = False,
) -> Tensor: ...
@overload
def linear_swiglu(
    x: Tensor | FP8Rows, gate_up: LinearWeight, plan: LinearPlan = CUBLAS, *, fp8_rows: bool
) -> Tensor | FP8Rows: ...


def linear_swiglu(
    x: Tensor | FP8Rows,
    gate_up: LinearWeight,
    plan: LinearPlan = CUBLAS,
    *,
    fp8_rows: bool = False,
) -> Tensor | FP8Rows:
    """swiglu(linear(x, gate_up)) for a packed [gate; up] projection [2I, K] -> [T, I]; with
    `fp8_rows`, as the down projection's FP8 activations (see `swiglu`).

    A one-row CUDA call whose plan gives the GEMV a tile runs as one kernel: the GEMV applies
    SwiGLU to its own outputs (same bits as the two ops), and so does the few-row kernel for
    2 to 16 rows when the plan has its tile; anything else runs both ops. The
    fused kernel uses the tile tuned for the plain GEMV of this weight: its programs stream
    the same number of weight rows (half gate, half up), so the timing carries over. (A fused
    call asked for FP8 rows quantizes its output in one more kernel.)
    """
    fused: Tensor | None = None
    if isinstance(gate_up, QuantizedWeight):
        fused = quantized_ops.linear_swiglu(x, gate_up, plan)
    elif isinstance(x, Tensor) and gate_up.shape[0] % 2 == 0:
        tile = plan.one_row_gemv
        if tile is not None and on_cuda(x) and x.dim() == 2 and x.shape[0] == 1:
            from .. import triton_ops

            fused = triton_ops.gemv(x, gate_up, tile, swiglu=True)
        elif plan.few_rows is not None and few_rows(x):
            from .. import triton_ops

            fused = triton_ops.few_rows_linear(x, gate_up, plan.few_rows, swiglu=True)
    if fused is None:
        return swiglu(linear(x, gate_up, plan=plan), fp8_rows=fp8_rows)
    if fp8_rows:
        return quantized_ops.fp8_rows(fused)
    return fused


def tune_linear(
    weights: list[LinearWeight],
    cache: TuningCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TunedLinear]:
    """Measure, for each distinct CUDA weight shape, whether the Triton GEMV beats cuBLAS at
    one row, which path a quantized weight takes at each row band, and whether the few-row
    kernel beats cuBLAS at 16 rows (see `linear_tuning`); returns one `TunedLinear` per weight,
    in order (cuBLAS, untimed, for a weight not on CUDA). Call before capturing CUDA graphs.

    cache: where results are kept between processes (see `tuning_cache`); shapes found there
    for this GPU and software are not measured again, unless `cache.retune`. `progress` hears
    a line before any timing starts."""
    cuda = [w for w in weights if on_cuda(w)]
    tuned: list[TunedLinear] = []
    if cuda:
        from .. import linear_tuning

        tuned = linear_tuning.tune(cuda, cache, progress)
    cuda_tuned = iter(tuned)
    untimed = TunedLinear(CUBLAS, "cuBLAS: not on CUDA, not timed")
    return [next(cuda_tuned) if on_cuda(w) else untimed for w in weights]


@overload
def swiglu(gate_up: Tensor, *, fp8_rows: Literal[False] = False) -> Tensor: ...
@overload
def swiglu(gate_up: Tensor, *, fp8_rows: bool) -> Tensor | FP8Rows: ...


def swiglu(gate_up: Tensor, *, fp8_rows: bool = False) -> Tensor | FP8Rows:
    """`reference.swiglu`; with `fp8_rows` (gate_up [T, 2I]) the result as the next FP8
    matmul's activations (`FP8Rows`, what `reference.quantize_rows_fp8` makes of it): on CUDA
    written so by the SwiGLU kernel itself."""
    op = "swiglu"
    if not isinstance(gate_up, Tensor) or gate_up.dim() < 1 or gate_up.shape[-1] % 2 != 0:
        fail(op, "gate_up must be a tensor [..., 2I] (gate and up packed, an even last dim)")
    check_float(op, "gate_up", gate_up)
    if fp8_rows and gate_up.dim() != 2:
        fail(op, f"FP8 rows need gate_up [T, 2I], got {shape_str(gate_up)}")
    if on_cuda(gate_up):
        from .. import triton_ops

        return triton_ops.swiglu(gate_up, fp8_rows)
    out = cpu_ops.swiglu(gate_up) if on_cpu(gate_up) else reference.swiglu(gate_up)
    if fp8_rows:
        return quantized_ops.fp8_rows(out)
    return out
