"""Helpers shared by the Triton launch wrappers."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Read once, when this package is imported: `triton.jit` makes the same decision at the same time.
# The interpreter runs kernels on CPU tensors with numpy; it cannot multiply bf16 matrices
# (tl.dot gives garbage) nor call libdevice, so the wrappers pick FP32 dots and plain tl.log there.
INTERPRET: bool = bool(triton.knobs.runtime.interpret)

# H200 = 132 SMs; used when there is no device to ask (the interpreter).
DEFAULT_NUM_SMS = 132

_TL_DTYPES = {
    torch.float32: tl.float32,
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
}


def next_pow2(n: int) -> int:
    return int(triton.next_power_of_2(max(1, n)))


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The operand type of tl.dot for tensors of `dtype` (FP32 under the interpreter)."""
    if INTERPRET:
        return tl.float32
    return _TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """FP32 inputs must be multiplied in full FP32 ("ieee"); TF32 would lose 13 mantissa bits."""
    return "ieee" if INTERPRET or dtype == torch.float32 else "tf32"


@functools.cache
def _num_sms_of(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (a host-side query, safe under graph capture)."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _num_sms_of(index)


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """View `x` as [rows, last] with a unit stride along the last dim (copy only if needed)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """`x` itself when its last dim is contiguous, else a contiguous copy."""
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()
