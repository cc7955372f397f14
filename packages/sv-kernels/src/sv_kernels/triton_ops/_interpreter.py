"""Three fixes to Triton 3.6's CPU interpreter (TRITON_INTERPRET=1), applied only in that mode.

The interpreter is how the kernels run in CI, on CPU tensors. Three of its defects would make
it disagree with the GPU:

1. It truncates FP32 -> BF16 casts (round toward zero) where the GPU rounds to nearest even,
   which doubles the error of every BF16 output and breaks bit-exact comparisons that hold on
   the device. The fix rounds that one conversion with torch.
2. It converts a scalar (kept as a 1-element array) to a Python int with `int(array)`, which
   numpy >= 2.4 rejects: loops whose bounds come from a loaded value (`range(start, end)`)
   fail. The fix converts the one element.
3. Its casts to FP8 e4m3 drop the carry when rounding up crosses a power of two (7.98 becomes
   4.0, not 8.0: one value in 40 of a normal sample). The fix converts with torch, which rounds
   to nearest even as the GPU's cvt.rn does (the kernels saturate before the cast, so the two
   agree on out-of-range values too).

Nothing changes in compiled mode; the kernels are the same code either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_applied = False


def apply_interpreter_fixes() -> None:
    global _applied
    if _applied:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original_cast = builder.cast_impl

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            as_f32 = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = as_f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits, tl.bfloat16)
        return original_cast(self, src, dst_type)

    builder.cast_impl = cast_impl
    original_fp_to_fp = builder.create_fp_to_fp

    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar != tl.float8e4nv:
            wide = src
            if src.dtype.scalar != tl.float32:
                wide = original_fp_to_fp(self, src, tl.float32, rounding_mode)
            values = torch.from_numpy(np.ascontiguousarray(wide.data, dtype=np.float32))
            bits = values.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            return interpreter.TensorHandle(bits, tl.float8e4nv)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_fp_to_fp = create_fp_to_fp

    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _applied = True
