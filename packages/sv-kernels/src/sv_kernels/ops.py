"""The ops the model calls: CUDA tensors go to the Triton kernels, all others to the reference
(CPU tensors to `cpu_ops` for the decode step's ops it has: the reference's values in fewer
torch calls).

Each function has the signature of its twin in `sv_kernels.reference` (the spec: read it for
shapes and semantics). The inputs' shapes, dtypes and devices are checked here, on the host,
from metadata only, so a bad call raises `KernelError` naming the op and the argument instead
of failing deep inside a kernel. Nothing here reads device values: every op can be captured in
a CUDA graph. `sv_kernels.triton_ops` (and with it triton) is imported on the first CUDA call,
so CPU users never import triton.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal, NamedTuple, NoReturn, overload

import torch
from torch import Tensor

from . import cpu_ops, quantized_ops, reference
from .errors import KernelError
from .linear_plan import CUBLAS, FEW_ROWS, FewRowsTile, GemvTile, LinearPlan, TunedLinear
from .quantized import FP8Rows, LinearWeight, QuantizedWeight, ScaledProduct
from .tuning_cache import TuningCache


# `is_cuda` / `is_cpu`, not `device.type`: these run several times per op, and building the
# device object is most of a microsecond each time, which adds up over a CPU decode step.
def _on_cuda(t: Tensor | QuantizedWeight) -> bool:
    return t.is_cuda if isinstance(t, Tensor) else t.data.is_cuda


def _on_cpu(t: Tensor) -> bool:
    return t.is_cpu


def _fail(op: str, message: str) -> NoReturn:
    raise KernelError(f"{op}: {message}")


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.shape) + "]"


def _check_dims(op: str, name: str, t: Tensor, dims: int, layout: str) -> None:
    if not isinstance(t, Tensor):
        _fail(op, f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != dims:
        _fail(op, f"{name} must be {layout}, got shape {_shape(t)}")


def _check_float(op: str, name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        _fail(op, f"{name} must be a floating-point tensor, got {t.dtype}")


_INTEGER_DTYPES = frozenset(
    {
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    }
)


def _check_int(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _INTEGER_DTYPES:  # one lookup: this runs several times per op
        _fail(op, f"{name} must be an integer tensor, got {t.dtype}")


def _check_len(op: str, name: str, t: Tensor, dim: int, size: int, what: str) -> None:
    if t.shape[dim] != size:
        _fail(op, f"{name} has {t.shape[dim]} along dim {dim}, expected {size} ({what})")


def _check_device(op: str, **tensors: Tensor | None) -> None:
    devices = {t.device for t in tensors.values() if t is not None}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in tensors.items() if t is not None)
        _fail(op, f"all tensors must be on one device, got {where}")


def _check_cache(op: str, k_cache: Tensor, v_cache: Tensor) -> None:
    _check_dims(op, "k_cache", k_cache, 4, "[P, S, Hkv, D]")
    _check_float(op, "k_cache", k_cache)
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        _fail(
            op,
            f"v_cache {_shape(v_cache)} {v_cache.dtype} must match "
            f"k_cache {_shape(k_cache)} {k_cache.dtype}",
        )
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(-1) != 1:
            _fail(op, f"{name} must be contiguous along its last dim (D)")


def _check_kv_scales(op: str, k_cache: Tensor, kv_scales: Tensor | None) -> None:
    """An FP8 cache needs its scales [2, Hkv] (FP32); any other cache takes none."""
    fp8 = k_cache.dtype == reference.FP8_KV_DTYPE
    if kv_scales is None:
        if fp8:
            _fail(op, f"an {k_cache.dtype} cache needs kv_scales [2, Hkv]")
        return
    if not fp8:
        _fail(op, f"kv_scales are for an FP8 cache, but the cache is {k_cache.dtype}")
    _check_dims(op, "kv_scales", kv_scales, 2, "[2, Hkv]")
    if tuple(kv_scales.shape) != (2, k_cache.shape[2]) or kv_scales.dtype != torch.float32:
        _fail(
            op,
            f"kv_scales must be float32 [2, {k_cache.shape[2]}] (K's and V's scale per KV "
            f"head), got {kv_scales.dtype} {_shape(kv_scales)}",
        )
    if not kv_scales.is_contiguous():
        _fail(op, "kv_scales must be contiguous")


def _check_heads(op: str, q: Tensor, k_cache: Tensor) -> None:
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if head_dim != k_cache.shape[3]:
        _fail(op, f"q has head dim {head_dim}, the cache {k_cache.shape[3]}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        _fail(op, f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if q.dtype != k_cache.dtype and k_cache.dtype != reference.FP8_KV_DTYPE:
        _fail(op, f"q is {q.dtype} but the cache is {k_cache.dtype}")


# --- ops --------------------------------------------------------------------------------------


def embedding(ids: Tensor, weight: LinearWeight) -> Tensor:
    op = "embedding"
    _check_dims(op, "ids", ids, 1, "[T]")
    _check_int(op, "ids", ids)
    if isinstance(weight, QuantizedWeight):  # a quantized tied LM head: gather and dequantize
        weight.check(op)
        _check_device(op, ids=ids, weight=weight.data)
    else:
        _check_dims(op, "weight", weight, 2, "[V, H]")
        _check_device(op, ids=ids, weight=weight)
    if _on_cuda(weight):
        from . import triton_ops

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
        if _on_cuda(x.product):
            _check_norm_args(op, x.product.shape, x.dtype, weight, eps, residual, fp8_rows)
            _check_device(op, x=x.product, weight=weight, residual=residual)
            from . import triton_ops

            return triton_ops.rms_norm(x, weight, eps, residual, fp8_rows)
        x = reference.scale_product(x.product, x.row_scale, x.col_scale, x.dtype)
    if not isinstance(x, Tensor) or x.dim() < 1:
        _fail(op, "x must be a tensor [..., H]")
    _check_float(op, "x", x)
    _check_norm_args(op, x.shape, x.dtype, weight, eps, residual, fp8_rows)
    _check_device(op, x=x, weight=weight, residual=residual)
    if _on_cuda(x):
        from . import triton_ops

        return triton_ops.rms_norm(x, weight, eps, residual, fp8_rows)
    if _on_cpu(x):
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
    _check_dims(op, "weight", weight, 1, "[H]")
    if weight.shape[0] != shape[-1]:
        _fail(
            op, f"weight has {weight.shape[0]} along dim 0, expected {shape[-1]} (x's hidden size)"
        )
    if residual is not None and residual.shape != shape:
        _fail(op, f"residual {_shape(residual)} must have x's shape [{', '.join(map(str, shape))}]")
    if eps < 0:
        _fail(op, f"eps must be >= 0, got {eps}")
    if fp8_rows and (len(shape) != 2 or weight.dtype != dtype):
        _fail(
            op,
            f"FP8 rows need x [T, H] and a weight of x's dtype, got x "
            f"[{', '.join(map(str, shape))}] {dtype}, weight {weight.dtype}",
        )


def _check_scaled_product(op: str, x: ScaledProduct, residual: Tensor | None) -> None:
    """A `ScaledProduct` as `quantized_ops.scaled_mm_tensorwise` makes it; the norm takes one
    only with a residual, whose dtype is the product's nominal dtype."""
    product, rows, cols = x.product, x.row_scale, x.col_scale
    if not isinstance(product, Tensor) or product.dim() != 2 or product.dtype != torch.float32:
        _fail(op, "a scaled product must be an FP32 tensor [T, N]")
    if not isinstance(rows, Tensor) or rows.shape != (product.shape[0], 1):
        _fail(op, f"its row scales must be [T, 1] = [{product.shape[0]}, 1]")
    if not isinstance(cols, Tensor) or cols.shape != (product.shape[1],):
        _fail(op, f"its column scales must be [N] = [{product.shape[1]}]")
    if rows.dtype != torch.float32 or cols.dtype != torch.float32:
        _fail(op, "its scales must be float32")
    _check_device(op, product=product, row_scale=rows, col_scale=cols)
    if residual is None or residual.dtype != x.dtype:
        _fail(op, f"a scaled product needs a residual of its dtype {x.dtype}")


def takes_fp8_rows(weight: LinearWeight, plan: LinearPlan, rows: int, dtype: torch.dtype) -> bool:
    """Whether `linear(x, weight, plan=plan)` for x of `rows` rows of `dtype` runs on the FP8
    tensor cores and would quantize x itself: then the op that makes x can make `FP8Rows`
    instead (`rms_norm(fp8_rows=True)`), and `linear`, `linear_swiglu` and `qkv_rope_cache`
    take them."""
    return (
        isinstance(weight, QuantizedWeight)
        and _on_cuda(weight)
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
    FP32 out of 16-bit inputs on CUDA comes straight from cuBLAS's FP32 accumulator
    (`torch.mm`'s out_dtype): at batch 256 the LM head's BF16 logits are 66 MB, and widening
    them afterwards was a ~95 us kernel per step on the H200. Those logits are then not rounded
    to BF16 first, unlike the GEMV's (BF16 results may differ across batch sizes anyway).

    A `QuantizedWeight` (FP8 or int8 with per-row scales) goes to `quantized_ops.linear`, which
    also takes x as `FP8Rows` where the plan multiplies on the FP8 tensor cores. With
    `defer_scales` (and no bias) a call that runs `scaled_mm_tensorwise` returns its product
    with the scales unapplied (`ScaledProduct`), which `rms_norm` applies as it reads it.
    """
    if bias is not None:
        _check_bias("linear", bias, weight, x)
    if isinstance(weight, QuantizedWeight):  # the bias after the scaled product, in out's dtype
        if bias is None:
            return quantized_ops.linear(x, weight, out_dtype, plan, defer_scales)
        out = quantized_ops.linear(x, weight, out_dtype, plan)
        return out + bias.to(out.dtype)
    if isinstance(x, FP8Rows):
        _fail("linear", f"FP8 rows are an FP8 matmul's input; the weight is {weight.dtype}")
    if plan.one_row_gemv is not None and _on_cuda(x) and x.dim() == 2 and x.shape[0] == 1:
        from . import triton_ops

        return triton_ops.gemv(x, weight, plan.one_row_gemv, out_dtype=out_dtype, bias=bias)
    if plan.few_rows is not None and _few_rows(x):
        from . import triton_ops

        return triton_ops.few_rows_linear(x, weight, plan.few_rows, out_dtype=out_dtype, bias=bias)
    if (
        bias is None
        and out_dtype == torch.float32
        and _on_cuda(x)
        and x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
    ):
        return torch.mm(x, weight.t(), torch.float32)
    out = reference.linear(x, weight, bias)
    return out if out_dtype is None else out.to(out_dtype)


def _check_bias(op: str, bias: Tensor, weight: LinearWeight, x: Tensor | FP8Rows) -> None:
    _check_dims(op, "bias", bias, 1, "[N]")
    _check_len(op, "bias", bias, 0, weight.shape[0], "one per output feature (weight's rows)")
    if bias.dtype != x.dtype:
        _fail(op, f"bias is {bias.dtype} but x is {x.dtype}")
    _check_device(op, x=x if isinstance(x, Tensor) else x.values, bias=bias)


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
        if tile is not None and _on_cuda(x) and x.dim() == 2 and x.shape[0] == 1:
            from . import triton_ops

            fused = triton_ops.gemv(x, gate_up, tile, swiglu=True)
        elif plan.few_rows is not None and _few_rows(x):
            from . import triton_ops

            fused = triton_ops.few_rows_linear(x, gate_up, plan.few_rows, swiglu=True)
    if fused is None:
        return swiglu(linear(x, gate_up, plan=plan), fp8_rows=fp8_rows)
    if fp8_rows:
        return quantized_ops.fp8_rows(fused)
    return fused


def _few_rows(x: Tensor) -> bool:
    """A CUDA call the few-row kernel takes: 2 to FEW_ROWS rows."""
    return _on_cuda(x) and x.dim() == 2 and 2 <= x.shape[0] <= FEW_ROWS


def tune_linear(
    weights: list[LinearWeight],
    cache: TuningCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TunedLinear]:
    """Measure, for each distinct CUDA weight shape, whether the Triton GEMV beats cuBLAS at
    one row (see `triton_ops.gemv`), and for an unquantized one whether the few-row kernel does
    at 16 rows (`triton_ops.few_rows`); returns one `TunedLinear` per weight, in order (cuBLAS,
    untimed, for a weight not on CUDA). Call before capturing CUDA graphs.

    cache: where results are kept between processes (see `tuning_cache`); shapes found there
    for this GPU and software are not measured again, unless `cache.retune`. `progress` hears
    a line before any timing starts."""
    cuda = [w for w in weights if _on_cuda(w)]
    tuned: list[TunedLinear] = []
    if cuda:
        from . import triton_ops

        tuned = triton_ops.tune_gemv(cuda, cache, progress)
        plain = [(i, w) for i, w in enumerate(cuda) if not isinstance(w, QuantizedWeight)]
        fingerprint = triton_ops.tuning_fingerprint(cuda[0].device)
        few = triton_ops.tune_few_rows([w for _, w in plain], cache, fingerprint, progress)
        for (i, _), (tile, summary) in zip(plain, few, strict=True):
            plan = dataclasses.replace(tuned[i].plan, few_rows=tile)
            tuned[i] = TunedLinear(plan, f"{tuned[i].summary}; {summary}")
    on_cuda = iter(tuned)
    untimed = TunedLinear(CUBLAS, "cuBLAS: not on CUDA, not timed")
    return [next(on_cuda) if _on_cuda(w) else untimed for w in weights]


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
        _fail(op, "gate_up must be a tensor [..., 2I] (gate and up packed, an even last dim)")
    _check_float(op, "gate_up", gate_up)
    if fp8_rows and gate_up.dim() != 2:
        _fail(op, f"FP8 rows need gate_up [T, 2I], got {_shape(gate_up)}")
    if _on_cuda(gate_up):
        from . import triton_ops

        return triton_ops.swiglu(gate_up, fp8_rows)
    out = cpu_ops.swiglu(gate_up) if _on_cpu(gate_up) else reference.swiglu(gate_up)
    if fp8_rows:
        return quantized_ops.fp8_rows(out)
    return out


def _check_rope_inputs(
    op: str, num_tokens: int, head_dim: int, positions: Tensor, cos: Tensor, sin: Tensor
) -> None:
    """RoPE's inputs beside q and k: one position per token, cos/sin [max_positions, D/2]."""
    if head_dim % 2 != 0:
        _fail(op, f"the head dim must be even for RoPE, got {head_dim}")
    _check_dims(op, "positions", positions, 1, "[T]")
    _check_int(op, "positions", positions)
    _check_len(op, "positions", positions, 0, num_tokens, "one per token")
    for name, table in (("cos", cos), ("sin", sin)):
        _check_dims(op, name, table, 2, "[max_positions, D/2]")
        _check_float(op, name, table)
        _check_len(op, name, table, 1, head_dim // 2, "half the head dim")
    if sin.shape != cos.shape:
        _fail(op, f"sin {_shape(sin)} must have cos's shape {_shape(cos)}")


def _check_slots(op: str, num_tokens: int, slot_mapping: Tensor) -> None:
    _check_dims(op, "slot_mapping", slot_mapping, 1, "[T]")
    _check_int(op, "slot_mapping", slot_mapping)
    _check_len(op, "slot_mapping", slot_mapping, 0, num_tokens, "one per token")


class _RopeCacheArgs(NamedTuple):
    """RoPE's and the cache write's arguments, in the order the kernels and references take
    them (`*args`); built once per op call and handed to its helpers as one value."""

    positions: Tensor
    cos: Tensor
    sin: Tensor
    k_cache: Tensor
    v_cache: Tensor
    slot_mapping: Tensor
    kv_scales: Tensor | None


def _check_rope_cache_args(
    op: str, num_tokens: int, args: _RopeCacheArgs, **inputs: Tensor | None
) -> None:
    """RoPE's and the cache write's arguments for `num_tokens` tokens, the caches already through
    `_check_cache`; `inputs` (the op's own tensors) must share their device."""
    _check_rope_inputs(op, num_tokens, args.k_cache.shape[3], args.positions, args.cos, args.sin)
    _check_kv_scales(op, args.k_cache, args.kv_scales)
    _check_slots(op, num_tokens, args.slot_mapping)
    _check_device(op, **inputs, **args._asdict())


def rope_cache_write(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    kv_scales: Tensor | None = None,
) -> Tensor:
    op = "rope_cache_write"
    _check_cache(op, k_cache, v_cache)
    args = _RopeCacheArgs(positions, cos, sin, k_cache, v_cache, slot_mapping, kv_scales)
    return _rope_cache_write(op, q, k, v, args)


def _rope_cache_write(op: str, q: Tensor, k: Tensor, v: Tensor, args: _RopeCacheArgs) -> Tensor:
    """`rope_cache_write` with the caches already through `_check_cache`."""
    _check_dims(op, "q", q, 3, "[T, Hq, D]")
    _check_dims(op, "k", k, 3, "[T, Hkv, D]")
    _check_dims(op, "v", v, 3, "[T, Hkv, D]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(op, name, t)
    num_tokens, head_dim = q.shape[0], q.shape[2]
    if k.shape[0] != num_tokens or k.shape[2] != head_dim or v.shape != k.shape:
        _fail(op, f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)} disagree on T, Hkv or D")
    if args.k_cache.shape[2:] != k.shape[1:]:
        _fail(op, f"cache heads x dim {_shape(args.k_cache)[1:]} do not match k {_shape(k)}")
    _check_rope_cache_args(op, num_tokens, args, q=q, k=k, v=v)
    if _on_cuda(q):
        from . import triton_ops

        return triton_ops.rope_cache_write(q, k, v, *args)
    if _on_cpu(q):
        return cpu_ops.rope_cache_write(q, k, v, *args)
    return reference.rope_cache_write(q, k, v, *args)


def qkv_rope_cache(
    x: Tensor | FP8Rows,
    qkv: LinearWeight,
    num_q_heads: int,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    kv_scales: Tensor | None = None,
    *,
    plan: LinearPlan = CUBLAS,
    bias: Tensor | None = None,
    qk_norms: tuple[Tensor, Tensor, float] | None = None,
) -> Tensor:
    """Attention's inputs from the normed hidden state x [T, K]: q, k, v = `linear(x, qkv)`
    (+ bias) split into Hq, Hkv and Hkv heads of the cache's D, then `rms_norm` of q and k per
    head where `qk_norms` (q's weight, k's weight, eps: Qwen3) is given, then
    `rope_cache_write`. Returns the rotated q [T, Hq, D].

    Without q/k norms, a CUDA call runs as one kernel (`triton_ops.qkv_rope_cache`: the matmul
    rotates and writes its own outputs, rounded as the ops in turn round them) where the plan gives
    its kernel a tile that holds whole RoPE pairs: one row the GEMV's, 2 to 16 rows of an
    unquantized weight the few-row kernel's. Anything else runs the ops in turn.
    """
    op = "qkv_rope_cache"
    _check_cache(op, k_cache, v_cache)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    rows = (num_q_heads + 2 * num_kv_heads) * head_dim
    args = _RopeCacheArgs(positions, cos, sin, k_cache, v_cache, slot_mapping, kv_scales)
    tile: GemvTile | FewRowsTile | None = None
    if qk_norms is None and isinstance(x, Tensor) and _on_cuda(x) and x.dim() == 2:
        if x.shape[0] == 1:
            tile = plan.one_row_gemv
        elif _few_rows(x) and not isinstance(qkv, QuantizedWeight):
            tile = plan.few_rows
    if tile is not None and isinstance(x, Tensor):
        from . import triton_ops

        if triton_ops.qkv_rope_fits(tile[0], head_dim):
            return _fused_qkv_rope_cache(op, x, qkv, tile, num_q_heads, rows, bias, args)
    # An FP8 product's scales are applied by the RoPE kernel as it reads q, k and v (one
    # scaling kernel fewer per layer); a bias or q/k norms need the scaled values first.
    out = linear(x, qkv, plan=plan, bias=bias, defer_scales=bias is None and qk_norms is None)
    product = out.product if isinstance(out, ScaledProduct) else out
    if product.dim() != 2 or product.shape[1] != rows:
        _fail_qkv_rows(op, qkv, num_q_heads, rows)
    heads = [num_q_heads, num_kv_heads, num_kv_heads]
    q, k, v = product.view(product.shape[0], -1, head_dim).split_with_sizes(heads, dim=1)
    if isinstance(out, ScaledProduct):  # only CUDA's scaled_mm_tensorwise defers its scales
        from . import triton_ops

        _check_rope_cache_args(op, product.shape[0], args, product=product)
        scales = (out.row_scale, out.col_scale, out.dtype)
        return triton_ops.rope_cache_write(q, k, v, *args, product_scales=scales)
    if qk_norms is not None:
        q_norm, k_norm, eps = qk_norms
        q, _ = rms_norm(q, q_norm, eps)
        k, _ = rms_norm(k, k_norm, eps)
    return _rope_cache_write(op, q, k, v, args)


def _fused_qkv_rope_cache(
    op: str,
    x: Tensor,
    qkv: LinearWeight,
    tile: GemvTile | FewRowsTile,
    num_q_heads: int,
    rows: int,
    bias: Tensor | None,
    args: _RopeCacheArgs,
) -> Tensor:
    """`qkv_rope_cache` as one kernel, its inputs checked here (the unfused path leaves x,
    the weight and the bias to `linear`)."""
    _check_float(op, "x", x)
    if isinstance(qkv, QuantizedWeight):
        quantized_ops.check_linear(op, x, qkv)
        weight, scale = qkv.data, qkv.scale
    elif qkv.dim() != 2 or qkv.shape[1] != x.shape[1] or qkv.dtype != x.dtype:
        _fail(
            op, f"qkv {qkv.dtype} {_shape(qkv)} must be [N, K] of x's {x.dtype}, K = {x.shape[1]}"
        )
    else:
        weight, scale = qkv, None
    if qkv.shape[0] != rows:
        _fail_qkv_rows(op, qkv, num_q_heads, rows)
    if bias is not None:
        _check_bias(op, bias, qkv, x)
    _check_rope_cache_args(op, x.shape[0], args, x=x, qkv=weight, bias=bias)
    from . import triton_ops

    return triton_ops.qkv_rope_cache(x, weight, tile, num_q_heads, *args, bias=bias, scale=scale)


def _fail_qkv_rows(op: str, qkv: LinearWeight, num_q_heads: int, rows: int) -> NoReturn:
    _fail(
        op,
        f"qkv has {qkv.shape[0]} rows, expected (Hq + 2 Hkv) x D = {rows} for {num_q_heads} "
        "query heads and the cache's KV heads and head dim",
    )


def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    kv_scales: Tensor | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    op = "paged_decode_attention"
    _check_dims(op, "q", q, 3, "[B, Hq, D]")
    _check_float(op, "q", q)
    _check_cache(op, k_cache, v_cache)
    _check_kv_scales(op, k_cache, kv_scales)
    _check_heads(op, q, k_cache)
    batch = q.shape[0]
    _check_dims(op, "block_tables", block_tables, 2, "[B, max_pages]")
    _check_int(op, "block_tables", block_tables)
    _check_len(op, "block_tables", block_tables, 0, batch, "one row per sequence")
    _check_dims(op, "seq_lens", seq_lens, 1, "[B]")
    _check_int(op, "seq_lens", seq_lens)
    _check_len(op, "seq_lens", seq_lens, 0, batch, "one per sequence")
    _check_window(op, sliding_window)
    _check_device(
        op,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        kv_scales=kv_scales,
    )
    if _on_cuda(q):
        from . import triton_ops

        return triton_ops.paged_decode_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            scale,
            kv_scales=kv_scales,
            sliding_window=sliding_window,
        )
    attention = cpu_ops.paged_decode_attention if _on_cpu(q) else reference.paged_decode_attention
    return attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        scale,
        kv_scales=kv_scales,
        sliding_window=sliding_window,
    )


def _check_window(op: str, sliding_window: int | None) -> None:
    if sliding_window is not None and (
        not isinstance(sliding_window, int)
        or isinstance(sliding_window, bool)
        or sliding_window < 1
    ):
        _fail(op, f"sliding_window must be a host int >= 1 or None, got {sliding_window!r}")


class DecodeTail(NamedTuple):
    """The last sequences of a packed batch when each feeds one token, as a mixed step's
    decodes do: their context lengths [n] and block-table rows [n, max_pages], as tensors of
    their own (each 16-byte aligned, as a decode step's are, so the decode kernel runs the
    variant a decode graph compiled). `prefill_attention` may attend their rows with the decode
    kernel; the result is the same."""

    seq_lens: Tensor
    block_tables: Tensor


def _check_decode_tail(
    op: str, tail: DecodeTail, cu_seqlens_q: Tensor, seq_lens: Tensor, block_tables: Tensor
) -> None:
    _check_dims(op, "decode_tail.seq_lens", tail.seq_lens, 1, "[n]")
    _check_int(op, "decode_tail.seq_lens", tail.seq_lens)
    n = tail.seq_lens.shape[0]
    if n > seq_lens.shape[0]:
        _fail(op, f"decode_tail names {n} sequences; the batch has {seq_lens.shape[0]}")
    _check_dims(op, "decode_tail.block_tables", tail.block_tables, 2, "[n, max_pages]")
    _check_int(op, "decode_tail.block_tables", tail.block_tables)
    _check_len(op, "decode_tail.block_tables", tail.block_tables, 0, n, "one row per sequence")
    _check_device(
        op,
        cu_seqlens_q=cu_seqlens_q,
        tail_seq_lens=tail.seq_lens,
        tail_block_tables=tail.block_tables,
    )
    if not _on_cpu(cu_seqlens_q):
        return  # device values are never read here (see the module doc)
    # On the CPU the values are at hand: hold the caller to the tail's promise.
    batch = seq_lens.shape[0]
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1])[batch - n :]
    if bool((q_lens != 1).any()):
        _fail(op, f"decode_tail's {n} sequences must feed one token each, got {q_lens.tolist()}")
    width = tail.block_tables.shape[1]
    if not torch.equal(tail.seq_lens, seq_lens[batch - n :]) or not torch.equal(
        tail.block_tables, block_tables[batch - n :, :width]
    ):
        _fail(op, "decode_tail must hold the seq_lens and block-table rows of the last sequences")


def prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens: Tensor,
    block_tables: Tensor,
    scale: float,
    max_seqlen_q: int,
    kv_scales: Tensor | None = None,
    sliding_window: int | None = None,
    decode_tail: DecodeTail | None = None,
) -> Tensor:
    op = "prefill_attention"
    _check_dims(op, "q", q, 3, "[T, Hq, D]")
    _check_float(op, "q", q)
    _check_cache(op, k_cache, v_cache)
    _check_kv_scales(op, k_cache, kv_scales)
    _check_heads(op, q, k_cache)
    _check_dims(op, "seq_lens", seq_lens, 1, "[B]")
    _check_int(op, "seq_lens", seq_lens)
    batch = seq_lens.shape[0]
    _check_dims(op, "cu_seqlens_q", cu_seqlens_q, 1, "[B + 1]")
    _check_int(op, "cu_seqlens_q", cu_seqlens_q)
    _check_len(op, "cu_seqlens_q", cu_seqlens_q, 0, batch + 1, "B + 1 offsets")
    _check_dims(op, "block_tables", block_tables, 2, "[B, max_pages]")
    _check_int(op, "block_tables", block_tables)
    _check_len(op, "block_tables", block_tables, 0, batch, "one row per sequence")
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        _fail(op, f"max_seqlen_q must be a host int >= 0, got {max_seqlen_q!r}")
    _check_window(op, sliding_window)
    _check_device(
        op,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        cu_seqlens_q=cu_seqlens_q,
        seq_lens=seq_lens,
        block_tables=block_tables,
        kv_scales=kv_scales,
    )
    if decode_tail is not None:
        _check_decode_tail(op, decode_tail, cu_seqlens_q, seq_lens, block_tables)
    if _on_cuda(q):
        from . import triton_ops

        return triton_ops.prefill_attention(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q,
            seq_lens,
            block_tables,
            scale,
            max_seqlen_q,
            kv_scales=kv_scales,
            sliding_window=sliding_window,
            decode_tail=decode_tail,
        )
    attention = cpu_ops.prefill_attention if _on_cpu(q) else reference.prefill_attention
    return attention(
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        seq_lens,
        block_tables,
        scale,
        max_seqlen_q,
        kv_scales=kv_scales,
        sliding_window=sliding_window,
        decode_tail=decode_tail,
    )


def decode_metadata(
    block_tables: Tensor, table_rows: Tensor, positions: Tensor, page_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(block-table rows, cache slots, context lengths) of a decode step: one token per
    sequence; see `reference.decode_metadata`. Positions must lie inside each row's pages."""
    op = "decode_metadata"
    _check_dims(op, "block_tables", block_tables, 2, "[S, max_pages]")
    _check_int(op, "block_tables", block_tables)
    _check_dims(op, "table_rows", table_rows, 1, "[B]")
    _check_int(op, "table_rows", table_rows)
    _check_dims(op, "positions", positions, 1, "[B]")
    _check_int(op, "positions", positions)
    _check_len(op, "positions", positions, 0, table_rows.shape[0], "one per sequence")
    if page_size < 1:
        _fail(op, f"page_size must be positive, got {page_size}")
    _check_device(op, block_tables=block_tables, table_rows=table_rows, positions=positions)
    if _on_cuda(block_tables):
        from . import triton_ops

        return triton_ops.decode_metadata(block_tables, table_rows, positions, page_size)
    return reference.decode_metadata(block_tables, table_rows, positions, page_size)


def feed_tokens(token_ids: Tensor, source_rows: Tensor, sampled: Tensor) -> Tensor:
    """`reference.feed_tokens`: token ids with the pending entries read from `sampled` (the
    previous step's ids, still on the device). Rows of `sampled` are not range-checked here
    (that would need a sync); the caller's source rows must index it."""
    op = "feed_tokens"
    _check_dims(op, "token_ids", token_ids, 1, "[T]")
    _check_int(op, "token_ids", token_ids)
    _check_dims(op, "source_rows", source_rows, 1, "[T]")
    _check_int(op, "source_rows", source_rows)
    _check_len(op, "source_rows", source_rows, 0, token_ids.shape[0], "one per token")
    _check_dims(op, "sampled", sampled, 1, "[N]")
    _check_int(op, "sampled", sampled)
    _check_device(op, token_ids=token_ids, source_rows=source_rows, sampled=sampled)
    if _on_cuda(token_ids):
        from . import triton_ops

        return triton_ops.feed_tokens(token_ids, source_rows, sampled)
    return reference.feed_tokens(token_ids, source_rows, sampled)


def apply_token_bitmask(logits: Tensor, bitmask: Tensor, rows: Tensor) -> None:
    """`reference.apply_token_bitmask`: in place, the rows of logits named by `rows` keep only
    the tokens their bitmask row allows. Row indices are not range-checked (that would need a
    sync); the caller's rows must index logits."""
    op = "apply_token_bitmask"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    _check_dims(op, "bitmask", bitmask, 2, "[N, ceil(V / 32)]")
    if bitmask.dtype != torch.int32:
        _fail(op, f"bitmask must be int32, got {bitmask.dtype}")
    _check_len(op, "bitmask", bitmask, 1, (logits.shape[1] + 31) // 32, "32 tokens a word")
    _check_dims(op, "rows", rows, 1, "[N]")
    _check_int(op, "rows", rows)
    _check_len(op, "rows", rows, 0, bitmask.shape[0], "one per bitmask row")
    if logits.stride(1) != 1:
        _fail(op, "logits must be contiguous along its last dim (V)")
    _check_device(op, logits=logits, bitmask=bitmask, rows=rows)
    if _on_cuda(logits):
        from . import triton_ops

        triton_ops.apply_token_bitmask(logits, bitmask, rows)
        return
    reference.apply_token_bitmask(logits, bitmask, rows)


def argmax(logits: Tensor) -> Tensor:
    op = "argmax"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    if logits.shape[1] == 0:
        _fail(op, "logits has an empty vocabulary")
    if _on_cuda(logits):
        from . import triton_ops

        return triton_ops.argmax(logits)
    return reference.argmax(logits)


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
    steps: Tensor,
    *,
    any_top_k: bool = True,
    any_top_p: bool = True,
) -> Tensor:
    """`reference.sample`. any_top_k / any_top_p = False promise that no row uses that filter
    (the caller knows from its host-side request list); the CUDA path then skips its passes."""
    op = "sample"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    if logits.shape[1] == 0:
        _fail(op, "logits has an empty vocabulary")
    batch = logits.shape[0]
    per_row = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seeds": seeds,
        "steps": steps,
    }
    for name, t in per_row.items():
        _check_dims(op, name, t, 1, "[B]")
        _check_len(op, name, t, 0, batch, "one per row of logits")
    for name in ("temperature", "top_p"):
        _check_float(op, name, per_row[name])
    for name in ("top_k", "seeds", "steps"):
        _check_int(op, name, per_row[name])
    _check_device(op, logits=logits, **per_row)
    if _on_cuda(logits):
        from . import triton_ops

        return triton_ops.sample(
            logits,
            temperature,
            top_k,
            top_p,
            seeds,
            steps,
            any_top_k=any_top_k,
            any_top_p=any_top_p,
        )
    return reference.sample(logits, temperature, top_k, top_p, seeds, steps)


MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs


def token_logprobs(logits: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """`reference.token_logprobs`; on CUDA one Triton kernel reads the logits once, without
    materializing the log-softmax (triton_ops/token_logprobs.py)."""
    op = "token_logprobs"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    _check_dims(op, "ids", ids, 1, "[B]")
    _check_int(op, "ids", ids)
    _check_len(op, "ids", ids, 0, logits.shape[0], "one per row of logits")
    _check_device(op, logits=logits, ids=ids)
    if not 0 <= k <= min(MAX_LOGPROBS, logits.shape[1]):
        _fail(op, f"k must be in [0, {min(MAX_LOGPROBS, logits.shape[1])}], got {k}")
    if _on_cuda(logits):
        from . import triton_ops

        return triton_ops.token_logprobs(logits, ids, k)
    return reference.token_logprobs(logits, ids, k)


def _check_rows(op: str, batch: int, **rows: Tensor) -> None:
    for name, t in rows.items():
        _check_dims(op, name, t, 1, "[B]")
        _check_len(op, name, t, 0, batch, "one per row of logits")


def apply_logit_bias(logits: Tensor, rows: Tensor, tokens: Tensor, values: Tensor) -> Tensor:
    """`reference.apply_logit_bias` (torch's index_put on every backend)."""
    op = "apply_logit_bias"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    for name, t in (("rows", rows), ("tokens", tokens), ("values", values)):
        _check_dims(op, name, t, 1, "[N]")
        _check_len(op, name, t, 0, rows.shape[0], "one per bias entry")
    _check_int(op, "rows", rows)
    _check_int(op, "tokens", tokens)
    _check_float(op, "values", values)
    _check_device(op, logits=logits, rows=rows, tokens=tokens, values=values)
    return reference.apply_logit_bias(logits, rows, tokens, values)


def apply_allowed_tokens(
    logits: Tensor, rows: Tensor, tokens: Tensor, restricted: Tensor
) -> Tensor:
    """`reference.apply_allowed_tokens` (torch's index_put and masked_fill on every backend)."""
    op = "apply_allowed_tokens"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    for name, t in (("rows", rows), ("tokens", tokens), ("restricted", restricted)):
        _check_dims(op, name, t, 1, "[N]")
        _check_int(op, name, t)
    _check_len(op, "tokens", tokens, 0, rows.shape[0], "one per allowed entry")
    _check_device(op, logits=logits, rows=rows, tokens=tokens, restricted=restricted)
    return reference.apply_allowed_tokens(logits, rows, tokens, restricted)


def apply_penalties(
    logits: Tensor,
    output_counts: Tensor,
    prompt_mask: Tensor,
    presence: Tensor,
    frequency: Tensor,
    repetition: Tensor,
) -> Tensor:
    """`reference.apply_penalties`: a few elementwise passes over [B, V], as torch ops on every
    backend (memory-bound and capturable; the sampler's own kernels dominate)."""
    op = "apply_penalties"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    for name, t in (("output_counts", output_counts), ("prompt_mask", prompt_mask)):
        if t.shape != logits.shape:
            _fail(op, f"{name} must be shaped like logits {_shape(logits)}, got {_shape(t)}")
    _check_int(op, "output_counts", output_counts)
    if prompt_mask.dtype != torch.bool:
        _fail(op, f"prompt_mask must be a bool tensor, got {prompt_mask.dtype}")
    _check_rows(op, logits.shape[0], presence=presence, frequency=frequency, repetition=repetition)
    for name, t in (("presence", presence), ("frequency", frequency), ("repetition", repetition)):
        _check_float(op, name, t)
    _check_device(
        op,
        logits=logits,
        output_counts=output_counts,
        prompt_mask=prompt_mask,
        presence=presence,
        frequency=frequency,
        repetition=repetition,
    )
    return reference.apply_penalties(
        logits, output_counts, prompt_mask, presence, frequency, repetition
    )


def apply_min_p(logits: Tensor, temperature: Tensor, min_p: Tensor) -> Tensor:
    """`reference.apply_min_p` (torch ops on every backend)."""
    op = "apply_min_p"
    _check_dims(op, "logits", logits, 2, "[B, V]")
    _check_float(op, "logits", logits)
    _check_rows(op, logits.shape[0], temperature=temperature, min_p=min_p)
    _check_float(op, "temperature", temperature)
    _check_float(op, "min_p", min_p)
    _check_device(op, logits=logits, temperature=temperature, min_p=min_p)
    return reference.apply_min_p(logits, temperature, min_p)
