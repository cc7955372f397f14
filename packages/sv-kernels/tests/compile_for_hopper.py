"""Compile every Triton kernel for an H100/H200 (sm_90) on a machine without a GPU.

The interpreter (how CI runs the kernels) executes Triton code as numpy and accepts programs
that the compiler rejects: a variable bound to tensors of two shapes in the two arms of an
`if`, say. This script catches those before a GPU session does. It replaces every `*_kernel`
of `sv_kernels.triton_ops` by a recorder, calls each op's wrapper on CPU tensors at serving
shapes (so the launch arguments, constexprs, num_warps and num_stages are the wrappers' own),
and compiles each distinct recorded launch to a cubin for sm_90 with Triton's bundled ptxas.

Run with TRITON_INTERPRET unset (under the interpreter the kernels are not compilable
objects): `python compile_for_hopper.py` prints one line per compiled variant, exits 1 on any
failure. `test_kernels_compile.py` runs it in a subprocess.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

HOPPER = GPUTarget("cuda", 90, 32)
LAUNCH_OPTIONS = ("num_warps", "num_stages")
_POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.uint8: "*u8",
    torch.bool: "*i1",
}


class Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records instead of launching."""

    def __init__(self, kernel: JITFunction[Any], launches: list[tuple[Any, ...]]) -> None:
        self.kernel = kernel
        self.launches = launches

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.launches.append((self.kernel, args, kwargs))

        return record


def _signature(kernel: JITFunction[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    values = dict(zip(kernel.arg_names, args, strict=False)) | {
        k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS
    }
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for param in kernel.params:
        value = values.get(param.name, param.default)
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = _POINTER_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: argument {param.name}={value!r} not handled")
    options = {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs}
    return signature, constexprs, options


def record_launches() -> list[tuple[Any, ...]]:
    from sv_kernels import rope_tables, triton_ops

    launches: list[tuple[Any, ...]] = []
    # By module path: several modules share their name with the op they define, which
    # `triton_ops` re-exports (triton_ops.rms_norm is the function).
    for name in (
        "decode_attention",
        "embedding",
        "gemv",
        "prefill_attention",
        "rms_norm",
        "rope_cache",
        "sampling",
        "swiglu",
    ):
        module = importlib.import_module(f"sv_kernels.triton_ops.{name}")
        for attr, value in vars(module).items():
            if attr.endswith("_kernel") and isinstance(value, JITFunction):
                setattr(module, attr, Recorder(value, launches))
    gemv_configs = importlib.import_module("sv_kernels.triton_ops.gemv").CONFIGS

    bf16, f32 = torch.bfloat16, torch.float32
    hidden, inter, vocab, hq, hkv, d = 2048, 8192, 128256, 32, 8, 64
    for dtype in (bf16, f32):
        for tokens in (1, 8192):
            x = torch.zeros(tokens, hidden, dtype=dtype)
            triton_ops.rms_norm(x, torch.zeros(hidden, dtype=dtype), 1e-5, x.clone())
            triton_ops.rms_norm(x, torch.zeros(hidden, dtype=dtype), 1e-5)
            triton_ops.swiglu(torch.zeros(tokens, 2 * inter, dtype=dtype))
        triton_ops.embedding(
            torch.zeros(7, dtype=torch.int64), torch.zeros(vocab, hidden, dtype=dtype)
        )
        cos, sin = rope_tables.rope_tables(d, 64, 500000.0)
        pages = 64
        k_cache = torch.zeros(pages, 16, hkv, d, dtype=dtype)
        for tokens in (1, 256, 2048, 8192):
            qkv = torch.zeros(tokens, hq + 2 * hkv, d, dtype=dtype)
            q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
            positions = torch.zeros(tokens, dtype=torch.int64)
            triton_ops.rope_cache_write(q, k, v, positions, cos, sin, k_cache, k_cache, positions)
        for batch, context in ((1, 32768), (256, 1024)):
            tables = torch.zeros(batch, context // 16, dtype=torch.int32)
            lens = torch.zeros(batch, dtype=torch.int32)
            q = torch.zeros(batch, hq, d, dtype=dtype)
            triton_ops.paged_decode_attention(q, k_cache, k_cache, tables, lens, 0.125)
        q = torch.zeros(2048, hq, d, dtype=dtype)
        cu = torch.tensor([0, 2048], dtype=torch.int32)
        tables = torch.zeros(1, 128, dtype=torch.int32)
        lens = torch.tensor([2048], dtype=torch.int32)
        triton_ops.prefill_attention(q, k_cache, k_cache, cu, lens, tables, 0.125, 2048)
        for config in gemv_configs:
            triton_ops.gemv(
                torch.zeros(1, hidden, dtype=dtype), torch.zeros(inter, hidden, dtype=dtype), config
            )
        for batch in (1, 256):
            logits = torch.zeros(batch, vocab, dtype=dtype)
            triton_ops.argmax(logits)
            triton_ops.sample(
                logits,
                torch.ones(batch),
                torch.zeros(batch, dtype=torch.int32),
                torch.ones(batch),
                torch.zeros(batch, dtype=torch.int64),
                torch.zeros(batch, dtype=torch.int64),
            )
    return launches


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("run with TRITON_INTERPRET unset: interpreted kernels cannot be compiled")
        return 2
    seen: set[str] = set()
    failures = 0
    for kernel, args, kwargs in record_launches():
        signature, constexprs, options = _signature(kernel, args, kwargs)
        key = repr(
            (kernel.__name__, sorted(signature.items()), sorted(constexprs.items()), options)
        )
        if key in seen:
            continue
        seen.add(key)
        label = f"{kernel.__name__} {options} {constexprs}"
        try:
            source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
            compiled = triton.compile(source, target=HOPPER, options=options)
        except Exception as error:  # report every failing variant, not just the first
            failures += 1
            print(f"FAILED {label}\n{error}", flush=True)
            continue
        print(f"ok  {label}  shared={compiled.metadata.shared}", flush=True)
    print(f"{len(seen)} variants compiled for sm_90, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
