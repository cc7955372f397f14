"""Helpers shared by the Triton launch wrappers."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

# Read once, when this package is imported: `triton.jit` makes the same decision at the same time.
# The interpreter runs kernels on CPU tensors with numpy; it cannot multiply bf16 matrices
# (tl.dot gives garbage) nor call libdevice, so the wrappers pick FP32 dots and plain tl.log there.
INTERPRET: bool = bool(triton.knobs.runtime.interpret)

# Programmatic dependent launch (PDL, Hopper and later). Without it, a kernel's programs start
# only after the previous kernel in the stream has finished and the launch has gone through
# the front end: at batch 1 a decode step is ~150 kernels of a few microseconds each, and those
# gaps are a tenth of the step. Launched with PDL (`launch_pdl=True`), a kernel is started while
# the previous one is still running; each program then calls `wait_for_prior_kernels` before it
# reads anything the previous kernels write (activations, the KV cache) or writes anything at
# all. Only reads of data no kernel of the step writes (weights) may come before that call,
# which is how the batch-1 GEMV starts streaming its weights under the previous kernel's tail.
# SV_PDL=0 turns it off (for comparison); `PDL_OVERRIDE` forces it (the compile check, which
# compiles for sm_90 on a machine without a GPU).
PDL_OVERRIDE: bool | None = None


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def use_pdl(device: torch.device) -> bool:
    """Launch with PDL on `device`: compiled kernels on a Hopper or later GPU, SV_PDL not 0."""
    if PDL_OVERRIDE is not None:
        return PDL_OVERRIDE
    if INTERPRET or device.type != "cuda" or os.environ.get("SV_PDL", "1") == "0":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _pdl_capable(index)


@triton.jit  # type: ignore[untyped-decorator]
def wait_for_prior_kernels(USE_PDL: tl.constexpr) -> None:
    """Under PDL: let the next kernel launch, then block until the previous kernel in the
    stream has finished and its writes are visible (see PDL above). A no-op otherwise.

    Letting the next kernel launch before waiting (not after) measured 839 -> 788 us per batch-1
    decode step on the H200 (2026-11-30): the next kernel's programs are resident and, for a
    GEMV, already streaming weights while this one still waits for its own predecessor. It is
    safe by induction: a kernel passes its wait only once its predecessor has finished, and a
    predecessor finishes only after passing its own wait, so past the wait every earlier kernel
    of the stream is done; and the launch only happens once every program of this kernel has
    started, so early launches never keep this kernel's programs off the GPU."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


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


@triton.jit  # type: ignore[untyped-decorator]
def store_fp8_row(x, values_ptrs, scale_ptr, mask, FP8_MAX: tl.constexpr):  # type: ignore[no-untyped-def]
    """Store one row of FP32 values x (masked lanes 0) as an FP8 matmul's activations: e4m3
    values x / scale at `values_ptrs` and scale = max(absmax, 1e-12) / FP8_MAX at `scale_ptr`,
    the division rounded to nearest: `reference.quantize_rows_fp8`'s operations in its order.
    The one place the kernels that write those activations (quantize_rows, and rms_norm and
    swiglu with FP8 rows) quantize them, so they agree bit for bit."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / FP8_MAX
    q = tl.math.div_rn(x, scale)
    tl.store(values_ptrs, q.to(values_ptrs.dtype.element_ty), mask=mask)
    tl.store(scale_ptr, scale)
