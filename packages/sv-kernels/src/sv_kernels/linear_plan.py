"""How `ops.linear` multiplies by one weight matrix: a plan its owner chooses and passes along.

cuBLAS runs every matmul except a one-row call (a batch-1 decode step), where a Triton GEMV
tile may beat it for a weight's shape on a given GPU, and a call of 2 to 16 rows (a verify
step, a small decode batch), where a Triton split-K tile may; a quantized weight's calls take
one of four paths per row band (`QuantizedPath`). `ops.tune_linear` measures them all and
returns one plan per weight; whoever owns the weights (the model runner) keeps the plans and
hands each to `ops.linear` with its weight. Nothing in the process remembers a choice, so two
runners (two GPUs, two tunings, two tests) never change each other's kernels. A plan is per
weight, not per shape, so that a weight's storage format (quantized kinds and their scales)
can join its kernel choice here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# (BLOCK_N, BLOCK_K, num_warps) of `triton_ops.gemv`.
GemvTile = tuple[int, int, int]

# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, STAGES) of `triton_ops.few_rows`.
FewRowsTile = tuple[int, int, int, int, int]

# The most rows of a call that a plan's `few_rows` tile takes: the tensor cores' smallest tile
# height, and the rows of a verify step of a 15-token draft, the most the decode graphs verify.
FEW_ROWS = 16

# The most rows of a quantized weight's many-row band: a full decode batch. Calls with more
# rows (a step holding prompt chunks) take the plan's prompt-row path: writing an FP32 product
# and scaling it afterwards costs little beside a 256-row matmul and grows with the rows.
MANY_ROWS = 256

# The most rows of a call sent to the 8-bit-weight matmul ("w8a16" below). At 2,048 rows (a
# prompt) dequantizing for cuBLAS was 1.4-1.6x faster on every matrix (BENCHMARKS.md run 123:
# q/k/v 42.9 against 67.0 µs, gate/up 230 against 329, down 108 against 155): the dequantized
# copy costs the same at any row count, and many rows repay it.
W8A16_MAX_ROWS = 256

# How a quantized weight is multiplied on CUDA when no GEMV tile takes the call: "cublas"
# dequantizes it to the activations' dtype and calls cuBLAS; "scaled_mm" (FP8 only) quantizes
# the activations per token to FP8 and multiplies on the FP8 tensor cores (`torch._scaled_mm`),
# reading the 1-byte weights as they are; "scaled_mm_tensorwise" the same with unit scales in
# the matmul and both scale vectors applied by a kernel after it (cuBLAS's faster per-tensor
# kernels); "w8a16" reads the 1-byte weights and widens them in registers for the 16-bit
# tensor cores (`triton_ops.w8a16_matmul`). Which one wins depends on the matrix and the row
# count (BENCHMARKS.md run 124, fp8 at 16 rows: scaled_mm for gate/up, dequantize + cuBLAS for
# down, w8a16 for q/k/v and o), so a plan holds one per row band: up to FEW_ROWS, up to
# MANY_ROWS, and above.
QuantizedPath = Literal["cublas", "scaled_mm", "w8a16", "scaled_mm_tensorwise"]
QUANTIZED_PATHS: tuple[QuantizedPath, ...] = (
    "cublas",
    "scaled_mm",
    "w8a16",
    "scaled_mm_tensorwise",
)


@dataclass(frozen=True)
class LinearPlan:
    """The kernels `ops.linear` runs for one weight on CUDA.

    `one_row_gemv`: the Triton GEMV tile for a one-row call, or None for cuBLAS there too (the
    default: nothing measured). `few_rows`: the Triton tile for a call of 2 to FEW_ROWS rows of
    an unquantized weight, or None for cuBLAS. A quantized weight's other calls take a
    `QuantizedPath`: `quantized_few_rows` up to FEW_ROWS rows, `quantized_many_rows` up to
    MANY_ROWS, `quantized_prompt_rows` above (`quantized_ops` says where a path cannot take a
    call and dequantize + cuBLAS runs instead)."""

    one_row_gemv: GemvTile | None = None
    few_rows: FewRowsTile | None = None
    quantized_few_rows: QuantizedPath = "cublas"
    quantized_many_rows: QuantizedPath = "cublas"
    quantized_prompt_rows: QuantizedPath = "cublas"

    def quantized_path(self, rows: int) -> QuantizedPath:
        """The quantized path of this plan's row band for a call of `rows` rows."""
        if rows <= FEW_ROWS:
            return self.quantized_few_rows
        if rows <= MANY_ROWS:
            return self.quantized_many_rows
        return self.quantized_prompt_rows


# The plan of a weight nobody tuned: cuBLAS (or the CPU reference) for every call.
CUBLAS = LinearPlan()


@dataclass(frozen=True)
class TunedLinear:
    """What the tuner chose for one weight, and a line saying why (timings, and whether they
    were measured now or kept from the tuning cache), for logs."""

    plan: LinearPlan
    summary: str
