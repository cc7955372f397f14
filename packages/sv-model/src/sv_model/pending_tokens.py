"""The sampled ids of a launched step (and their log-probabilities), on their way to the host."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# Device results of ops.token_logprobs: (chosen [N] f32, top values [N, K] f32, top ids [N, K]).
DeviceLogprobs = tuple[Tensor, Tensor, Tensor]
# A prompt's: the same and each token's rank ([N] int64; logprob_rows.of_prompts).
PromptDeviceLogprobs = tuple[Tensor, Tensor, Tensor, Tensor]


@dataclass(frozen=True, slots=True)
class Logprobs:
    """Log-probabilities of N tokens: each token's own, and the top K of its distribution
    (most likely first): `top_ids` [N, K] int64 and `top_values` [N, K] float32, kept as
    arrays (per-entry Python objects are made only for the rows a caller reads). `ranks`
    (prompt tokens' only): each token's rank in its distribution, 1 for the most likely."""

    chosen: list[float]
    top_ids: np.ndarray
    top_values: np.ndarray
    ranks: list[int] | None = None


class PendingTokens:
    """The sampled ids of a launched step, on their way to the host: `result()` waits for them.

    On CUDA the ids (and any log-probabilities) are copied into pinned memory behind the step,
    and one event marks the copies' end; on the CPU the step has already run."""

    def __init__(
        self,
        ids: Tensor,
        logprobs: DeviceLogprobs | None = None,
        prompt_logprobs: PromptDeviceLogprobs | DeviceLogprobs | None = None,
    ) -> None:
        self._ready: torch.cuda.Event | None = None
        self._host = _to_host(ids)
        self._logprobs = None if logprobs is None else tuple(map(_to_host, logprobs))
        self._prompt = None if prompt_logprobs is None else tuple(map(_to_host, prompt_logprobs))
        if ids.is_cuda:
            self._ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._ready.record()

    def result(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        ids: list[int] = self._host.tolist()
        return ids

    def logprobs(self) -> Logprobs | None:
        """The sampled tokens' log-probabilities (after `result()`), if the step asked."""
        return _as_logprobs(self._logprobs)

    def prompt_logprobs(self) -> Logprobs | None:
        """The prompt targets' log-probabilities, in `StepInputs.prompt_logprobs` order."""
        return _as_logprobs(self._prompt)


def _to_host(t: Tensor) -> Tensor:
    if not t.is_cuda:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _as_logprobs(host: tuple[Tensor, ...] | None) -> Logprobs | None:
    if host is None:
        return None
    chosen, values, ids, *ranks = host
    # Copies: the host tensors are pinned buffers, to go back to the pool with this step.
    return Logprobs(
        chosen.tolist(),
        ids.numpy().copy(),
        values.numpy().copy(),
        ranks[0].tolist() if ranks else None,
    )
