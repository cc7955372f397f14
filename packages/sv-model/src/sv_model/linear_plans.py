"""The plan each of the model's weight matrices is multiplied with (see `sv_kernels.linear_plan`).

A model starts untuned (cuBLAS everywhere); `tune` measures, at batch 1, the Triton GEMV
against cuBLAS for every matrix and returns the plans, which the runner gives its model before
capturing any CUDA graph. The plans belong to that model alone: another runner in the same
process, on the same weights or not, has its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sv_kernels import LinearPlan, TuningCache, ops
from sv_kernels.linear_plan import CUBLAS

from sv_model.weights import ModelWeights


@dataclass(frozen=True)
class LayerPlans:
    """The plans of one layer's four matrices (fields named as in `LayerWeights`)."""

    qkv: LinearPlan = CUBLAS
    o: LinearPlan = CUBLAS
    gate_up: LinearPlan = CUBLAS
    down: LinearPlan = CUBLAS


@dataclass(frozen=True)
class LinearPlans:
    """A plan for every matrix of a `ModelWeights`: one `LayerPlans` per layer, and the LM head's."""

    layers: tuple[LayerPlans, ...]
    lm_head: LinearPlan = CUBLAS

    @classmethod
    def untuned(cls, num_layers: int) -> LinearPlans:
        return cls(tuple(LayerPlans() for _ in range(num_layers)))


def tune(
    weights: ModelWeights,
    cache: TuningCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[LinearPlans, dict[tuple[int, int], str]]:
    """Tune every matrix of `weights` (`ops.tune_linear`: CUDA weights only, cuBLAS for the
    rest). Returns the plans and, per matrix shape (N, K), a line saying what was chosen."""
    per_layer = [(layer.qkv, layer.o, layer.gate_up, layer.down) for layer in weights.layers]
    matrices = [weights.lm_head] + [m for four in per_layer for m in four]
    tuned = ops.tune_linear(matrices, cache, progress)
    plans = [t.plan for t in tuned]
    layers = tuple(LayerPlans(*plans[1 + 4 * i : 5 + 4 * i]) for i in range(len(per_layer)))
    summaries = {(m.shape[0], m.shape[1]): t.summary for m, t in zip(matrices, tuned, strict=True)}
    return LinearPlans(layers, plans[0]), summaries
