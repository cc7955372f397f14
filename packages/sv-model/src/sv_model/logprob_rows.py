"""The log-probabilities a step returns beside its sampled ids.

Always the top `ops.MAX_LOGPROBS` (fixed shapes: one captured graph per decode bucket serves
every request's K; the host keeps the K each asked for). They are of the raw FP32 logits, as
OpenAI's and vLLM's are: before temperature, filters or any other processing.
"""

from __future__ import annotations

import numpy as np
import torch
from sv_kernels import ops
from torch import Tensor

from sv_model.decode_graphs import DecodeGraph
from sv_model.pending_tokens import DeviceLogprobs, PromptDeviceLogprobs
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


# Rows compared at a time for the prompt tokens' ranks: bounds the [rows, V] comparison's
# memory (a 2,048-token prompt chunk of a 128k vocabulary would be 256 MiB at once).
_RANK_ROWS = 256


def of_prompts(step: StepInputs, logits: Tensor) -> PromptDeviceLogprobs:
    """Of `step.prompt_logprobs`' targets, given `logits`: one row per target, in order, and
    each target's rank (vLLM's prompt logprobs give it)."""
    targets = np.concatenate([np.asarray(t, dtype=np.int64) for _, _, t in step.prompt_logprobs])
    ids = upload(targets, logits.device)
    chosen, values, top_ids = ops.token_logprobs(logits, ids, _top(logits))
    return chosen, values, top_ids, _ranks(logits, ids)


def _ranks(logits: Tensor, ids: Tensor) -> Tensor:
    """Each row's rank of its token `ids[b]`, as vLLM counts it: how many tokens are at least
    as likely (itself included, so the most likely is 1, and ties count). Compared on the raw
    logits, whose order the log-softmax keeps (one row's shift)."""
    ranks = torch.empty(ids.shape, dtype=torch.int64, device=logits.device)
    for start in range(0, logits.shape[0], _RANK_ROWS):
        rows = logits[start : start + _RANK_ROWS]
        own = rows.gather(1, ids[start : start + _RANK_ROWS, None])
        ranks[start : start + _RANK_ROWS] = (rows >= own).sum(dim=1)
    return ranks


def logits_rows(step: StepInputs, chunk_starts: np.ndarray) -> np.ndarray:
    """The packed token index of each prompt target's logits row (`chunk_starts[b]`: where
    prefill row b's chunk starts among the step's tokens)."""
    return np.concatenate(
        [
            chunk_starts[b] + offset + np.arange(len(targets), dtype=np.int32)
            for b, offset, targets in step.prompt_logprobs
        ]
    ).astype(np.int32)
