"""How `ops.linear` multiplies by one weight matrix: a plan its owner chooses and passes along.

cuBLAS runs every matmul except a one-row call (a batch-1 decode step), where a Triton GEMV
tile may beat it for a weight's shape on a given GPU, and a call of 2 to 16 rows (a verify
step, a small decode batch), where a Triton split-K tile may. `ops.tune_linear` measures both
and returns one plan per weight; whoever owns the weights (the model runner) keeps the plans and
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

# How a quantized weight is multiplied by more than one row on CUDA (`quantized_ops` says at
# which row counts a fixed path runs instead): "cublas" dequantizes it to
# the activations' dtype and calls cuBLAS; "scaled_mm" (FP8 only) quantizes the activations per
# token to FP8 and multiplies on the FP8 tensor cores (`torch._scaled_mm`), reading the 1-byte
# weights as they are; "w8a16" reads the 1-byte weights and widens them in registers for the
# 16-bit tensor cores (`triton_ops.w8a16_matmul`).
ManyRows = Literal["cublas", "scaled_mm", "w8a16"]
MANY_ROWS_PATHS: tuple[ManyRows, ...] = ("cublas", "scaled_mm", "w8a16")


@dataclass(frozen=True)
class LinearPlan:
    """The kernels `ops.linear` runs for one weight. `one_row_gemv`: the Triton GEMV tile for a
    one-row CUDA call, or None for cuBLAS there too (the default: nothing measured).
    `few_rows`: the Triton tile for a CUDA call of 2 to 16 rows of an unquantized weight, or
    None for cuBLAS. `many_rows`: the path of a quantized weight's other CUDA calls (see
    `ManyRows`)."""

    one_row_gemv: GemvTile | None = None
    many_rows: ManyRows = "cublas"
    few_rows: FewRowsTile | None = None


# The plan of a weight nobody tuned: cuBLAS (or the CPU reference) for every call.
CUBLAS = LinearPlan()


@dataclass(frozen=True)
class TunedLinear:
    """What the tuner chose for one weight, and a line saying why (timings, and whether they
    were measured now or kept from the tuning cache), for logs."""

    plan: LinearPlan
    summary: str
