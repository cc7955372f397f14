"""Log-probabilities of the sampled tokens and their top alternatives, for the step trace.

Computed from the FP32 logits rows a step samples from (the model's distribution at
temperature 1, before top-k / top-p), only while a trace is recorded: one log_softmax and one
topk per step, queued on the device behind the step, read back when its tokens are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

TOP_K = 5


@dataclass(frozen=True)
class StepLogprobs:
    """Per sampled row: the chosen token's logprob and the `TOP_K` most likely tokens."""

    chosen: Tensor  # [rows] float32
    top_ids: Tensor  # [rows, k] int64
    top_logprobs: Tensor  # [rows, k] float32

    def rows(self) -> list[tuple[float, list[tuple[int, float]]]]:
        """(chosen logprob, [(token id, logprob), ...] most likely first) per row; waits for the
        device."""
        # 5 decimals: a probability to 1e-5 relative, and a trace a third the size
        chosen = [round(c, 5) for c in self.chosen.tolist()]
        ids = self.top_ids.tolist()
        lps = [[round(lp, 5) for lp in row] for row in self.top_logprobs.tolist()]
        return [
            (c, list(zip(i, lp, strict=True))) for c, i, lp in zip(chosen, ids, lps, strict=True)
        ]


def step_logprobs(logits: Tensor, ids: Tensor, k: int = TOP_K) -> StepLogprobs:
    """`logits` [rows, V] and the sampled `ids` [rows] of one step."""
    with torch.inference_mode():
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        chosen = logprobs.gather(1, ids.view(-1, 1).to(torch.int64)).view(-1)
    return StepLogprobs(chosen, top.indices, top.values)
