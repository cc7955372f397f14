"""The log-probabilities a step returns beside its sampled ids.

Always the top `ops.MAX_LOGPROBS` (fixed shapes: one captured graph per decode bucket serves
every request's K; the host keeps the K each asked for). They are of the raw FP32 logits, as
OpenAI's and vLLM's are: before temperature, filters or any other processing.
"""

from __future__ import annotations

import numpy as np
from sv_kernels import ops
from torch import Tensor

from sv_model.decode_graphs import DecodeGraph
from sv_model.pending_tokens import DeviceLogprobs
from sv_model.step import StepInputs
from sv_model.uploads import upload


def _top(logits: Tensor) -> int:
    return min(ops.MAX_LOGPROBS, logits.shape[1])


def of_sampled(logits: Tensor, ids: Tensor, graph: DecodeGraph | None) -> DeviceLogprobs:
    """Of the sampled `ids`, one per row of `logits`; in `graph`'s logprob graph when the
    logits are that decode graph's buffer."""
    if graph is not None:
        return graph.logprobs(ids.shape[0], ids)
    return ops.token_logprobs(logits, ids, _top(logits))


def of_prompts(step: StepInputs, logits: Tensor) -> DeviceLogprobs:
    """Of `step.prompt_logprobs`' targets, given `logits`: one row per target, in order."""
    targets = np.concatenate([np.asarray(t, dtype=np.int64) for _, _, t in step.prompt_logprobs])
    return ops.token_logprobs(logits, upload(targets, logits.device), _top(logits))


def logits_rows(step: StepInputs, chunk_starts: np.ndarray) -> np.ndarray:
    """The packed token index of each prompt target's logits row (`chunk_starts[b]`: where
    prefill row b's chunk starts among the step's tokens)."""
    return np.concatenate(
        [
            chunk_starts[b] + offset + np.arange(len(targets), dtype=np.int32)
            for b, offset, targets in step.prompt_logprobs
        ]
    ).astype(np.int32)
