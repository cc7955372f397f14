"""The input checks the ops share, and the device tests they dispatch on.

A check reads metadata only (types, shapes, dtypes, devices, strides), never device values, and
raises `KernelError` as "<op>: <message>", naming the op and the argument at fault.
"""

from __future__ import annotations

from typing import NoReturn

import torch
from torch import Tensor

from ..errors import KernelError
from ..linear_plan import FEW_ROWS
from ..quantized import FP8Rows, LinearWeight, QuantizedWeight


# `is_cuda` / `is_cpu`, not `device.type`: these run several times per op, and building the
# device object is most of a microsecond each time, which adds up over a CPU decode step.
def on_cuda(t: Tensor | QuantizedWeight) -> bool:
    return t.is_cuda if isinstance(t, Tensor) else t.data.is_cuda


def on_cpu(t: Tensor) -> bool:
    return t.is_cpu


def fail(op: str, message: str) -> NoReturn:
    raise KernelError(f"{op}: {message}")


def shape_str(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.shape) + "]"


def check_dims(op: str, name: str, t: Tensor, dims: int, layout: str) -> None:
    if not isinstance(t, Tensor):
        fail(op, f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != dims:
        fail(op, f"{name} must be {layout}, got shape {shape_str(t)}")


def check_float(op: str, name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        fail(op, f"{name} must be a floating-point tensor, got {t.dtype}")


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


def check_int(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _INTEGER_DTYPES:  # one lookup: this runs several times per op
        fail(op, f"{name} must be an integer tensor, got {t.dtype}")


def check_len(op: str, name: str, t: Tensor, dim: int, size: int, what: str) -> None:
    if t.shape[dim] != size:
        fail(op, f"{name} has {t.shape[dim]} along dim {dim}, expected {size} ({what})")


def check_device(op: str, **tensors: Tensor | None) -> None:
    devices = {t.device for t in tensors.values() if t is not None}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in tensors.items() if t is not None)
        fail(op, f"all tensors must be on one device, got {where}")


def check_bias(op: str, bias: Tensor, weight: LinearWeight, x: Tensor | FP8Rows) -> None:
    check_dims(op, "bias", bias, 1, "[N]")
    check_len(op, "bias", bias, 0, weight.shape[0], "one per output feature (weight's rows)")
    if bias.dtype != x.dtype:
        fail(op, f"bias is {bias.dtype} but x is {x.dtype}")
    check_device(op, x=x if isinstance(x, Tensor) else x.values, bias=bias)


def few_rows(x: Tensor) -> bool:
    """A CUDA call the few-row kernel takes: 2 to FEW_ROWS rows."""
    return on_cuda(x) and x.dim() == 2 and 2 <= x.shape[0] <= FEW_ROWS
