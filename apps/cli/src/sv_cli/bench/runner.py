"""What `sv bench` measures a model runner by: its sizes, and the bare replay of a decode step.

The rooflines divide by these sizes (weight bytes a decode step reads, the KV pool), and the
"decode step GPU time" row times `decode_replay`: the graph alone, without its input copy or
any host work.
"""

from __future__ import annotations

from collections.abc import Callable

from sv_kernels.quantized import LinearWeight, QuantizedWeight
from sv_model import KVCache, ModelRunner, ModelWeights, StepInputs, step_packing


def _weights(weights: ModelWeights, include_embedding: bool) -> list[LinearWeight]:
    found: list[LinearWeight] = [weights.final_norm, weights.lm_head]
    found += [t for layer in weights.layers for t in vars(layer).values() if t is not None]
    if include_embedding and weights.embed is not weights.lm_head:
        found.append(weights.embed)
    return found


def num_parameters(weights: ModelWeights, include_embedding: bool = True) -> int:
    """Parameters in the weights (a tied LM head counted once; a quantized matrix's scales
    are not parameters)."""
    found = _weights(weights, include_embedding)
    return sum(w.data.numel() if isinstance(w, QuantizedWeight) else w.numel() for w in found)


def weight_bytes_per_decode_step(weights: ModelWeights) -> int:
    """Bytes of weights a decode step must read: every matrix once, with its scales when
    quantized (the one embedding row per token is negligible and not counted)."""
    found = _weights(weights, include_embedding=False)
    parts = [t for w in found for t in (w.tensors() if isinstance(w, QuantizedWeight) else (w,))]
    return sum(t.nbytes for t in parts)


def kv_pool_bytes(kv: KVCache) -> int:
    return 2 * kv.k.numel() * kv.k.element_size()


def decode_replay(runner: ModelRunner, step: StepInputs) -> Callable[[], None]:
    """Load a step the decode graphs run (a decode or verify step: see
    `step_packing.decode_rows`) into its CUDA graph and return the bare replay: no input copy,
    no host work, the graph alone (every call recomputes the same step)."""
    graphs = runner.decode_graphs
    if graphs is None or step_packing.decode_rows(step, runner.max_num_seqs) is None:
        raise ValueError("decode_replay needs CUDA graphs and a step they run")
    runner.logits(step)  # copies the step into its bucket's graph and replays it once
    return graphs.for_batch(len(step.token_ids)).replay_inputs_in_place
