"""Tensor parallelism: one rank's slice of the model, and the collectives between ranks.

Megatron-LM's split of a decoder layer, as gpt-fast and vLLM use it: q/k/v and gate/up are
split by output rows (column-parallel: each rank computes its own heads and its own part of
the MLP's hidden units, no communication), o and down by input columns (row-parallel: each
rank's product is a partial sum of the full output, so one all-reduce each makes every rank's
copy whole again). Attention needs no communication in between because a rank holds whole
heads, and its KV pool holds the K and V of its own KV heads only. Everything else (the
embedding, the norms, the LM head) is replicated: each rank ends the forward with the same
full logits, so every rank samples the same tokens from the same step inputs.

A rank's model is the same `DecoderModel` over a smaller config (`rank_config`: its share of
the heads and of the MLP), so the forward, the KV pool and the kernels need nothing new; the
forward only adds the two all-reduces when it has a `TensorParallel`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from sv_weights import ModelConfig
from torch import Tensor


class TensorParallel:
    """This process's place among the ranks of one model.

    `group` carries the model's all-reduces (NCCL on CUDA, gloo on the CPU); `control` (gloo,
    host objects) carries rank 0's commands and step inputs to the others. Two groups, so that
    a rank waiting for its next command (idle for as long as no request comes) is never on the
    model's group, whose timeout ends a step that a dead rank would hang."""

    def __init__(
        self, rank: int, world_size: int, group: dist.ProcessGroup, control: dist.ProcessGroup
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = (group, control)

    @property
    def group(self) -> dist.ProcessGroup:
        return self._joined()[0]

    @property
    def control(self) -> dist.ProcessGroup:
        return self._joined()[1]

    def leave(self) -> None:
        """Destroy the process groups and drop this object's hold on them (idempotent).

        Dropping them ends their worker threads here and now. `destroy_process_group` alone
        does not while a reference is held, and a gloo worker thread still releasing a
        finished collective's tensors when the interpreter exits cannot take the GIL back:
        the process aborts ("terminate called without an active exception")."""
        self._groups = None
        if dist.is_initialized():
            dist.destroy_process_group()

    def _joined(self) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
        if self._groups is None:
            raise RuntimeError(f"rank {self.rank} has left its tensor-parallel process groups")
        return self._groups

    def all_reduce(self, x: Tensor) -> None:
        """Sum `x` over the ranks, in place: the end of a row-parallel matmul."""
        dist.all_reduce(x, group=self.group)

    def broadcast(self, obj: object = None) -> object:
        """Rank 0's `obj`, on every rank (the others pass nothing)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj: object) -> list[object]:
        """Every rank's `obj`, in rank order, on rank 0 (the others get an empty list)."""
        gathered: list[object] = [None] * self.world_size if self.rank == 0 else []
        dist.gather_object(obj, gathered if self.rank == 0 else None, dst=0, group=self.control)
        return gathered

    def minimum(self, value: int) -> int:
        """The smallest of every rank's `value` (e.g. the KV pages each rank's memory holds)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())


def check_tensor_parallel_size(config: ModelConfig, size: int) -> None:
    """A ValueError naming the model's counts unless `size` ranks can split it: whole query
    and KV heads on every rank, and an equal share of the MLP."""
    if size < 1:
        raise ValueError(f"tensor parallel size must be at least 1, got {size}")
    counts = {
        "attention heads": config.num_attention_heads,
        "key/value heads": config.num_key_value_heads,
        "MLP width (intermediate_size)": config.intermediate_size,
    }
    bad = [f"{what} ({count})" for what, count in counts.items() if count % size]
    if bad:
        raise ValueError(
            f"tensor parallel size {size} must divide the model's attention heads "
            f"({config.num_attention_heads}), key/value heads ({config.num_key_value_heads}) "
            f"and MLP width ({config.intermediate_size}); it does not divide the "
            + " nor the ".join(bad)
        )


def rank_config(config: ModelConfig, size: int) -> ModelConfig:
    """The config of one rank's slice: its share of the heads and of the MLP width."""
    check_tensor_parallel_size(config, size)
    return dataclasses.replace(
        config,
        num_attention_heads=config.num_attention_heads // size,
        num_key_value_heads=config.num_key_value_heads // size,
        intermediate_size=config.intermediate_size // size,
    )


# The matrices split by output rows, by the config count whose share a rank takes.
_COLUMN_PARALLEL = {
    "self_attn.q_proj": "num_attention_heads",
    "self_attn.k_proj": "num_key_value_heads",
    "self_attn.v_proj": "num_key_value_heads",
    "mlp.gate_proj": "intermediate_size",
    "mlp.up_proj": "intermediate_size",
}
# The matrices split by input columns (their output is a partial sum to all-reduce).
_ROW_PARALLEL = {"self_attn.o_proj": "num_attention_heads", "mlp.down_proj": "intermediate_size"}


def shard_state(
    config: ModelConfig, state: dict[str, Tensor], rank: int, size: int
) -> dict[str, Tensor]:
    """Rank `rank`'s part of a Hugging Face-named state dict (validated against `config`),
    for `sv_model.ModelWeights.from_state_dict` with `rank_config(config, size)`.

    Column-parallel weights, their biases (Qwen2) and their per-row scales (FP8 checkpoints)
    keep the rank's rows; row-parallel weights keep its columns (their per-row scales stay
    whole: a scale belongs to an output row, and every rank has every output row). Qwen3's
    q/k norms are one gain vector of head_dim shared by every head, so they are replicated
    like the other norms, the embedding and the LM head. Slices of a mapped file stay views
    until the model copies them to its device: only the rank's share is ever read."""
    sliced = rank_config(config, size)
    shard = dict(state)
    for i in range(config.num_hidden_layers):
        for module, count in _COLUMN_PARALLEL.items():
            name = f"model.layers.{i}.{module}"
            rows = getattr(sliced, count) * (config.head_dim if count != "intermediate_size" else 1)
            for suffix in (".weight", ".bias", ".weight_scale"):
                tensor = state.get(name + suffix)
                if tensor is None or (suffix == ".weight_scale" and tensor.numel() == 1):
                    continue  # absent, or one scale for the whole matrix: the same on every rank
                shard[name + suffix] = tensor.narrow(0, rank * rows, rows)
        for module, count in _ROW_PARALLEL.items():
            name = f"model.layers.{i}.{module}.weight"
            cols = getattr(sliced, count) * (config.head_dim if count != "intermediate_size" else 1)
            # A copy of its own: a column slice is strided, and the kernels want dense rows.
            shard[name] = state[name].narrow(1, rank * cols, cols).contiguous()
    return shard
