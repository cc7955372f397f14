"""The sampled ids of a launched step, on their way to the host."""

from __future__ import annotations

import torch
from torch import Tensor


class PendingTokens:
    """The sampled ids of a launched step, on their way to the host: `result()` waits for them.

    On CUDA the ids are copied into pinned memory behind the step, and an event marks the copy's
    end; on the CPU the step has already run."""

    def __init__(self, ids: Tensor) -> None:
        self._ready: torch.cuda.Event | None = None
        if ids.is_cuda:
            self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._host.copy_(ids, non_blocking=True)
            self._ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._ready.record()
        else:
            self._host = ids

    def result(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        ids: list[int] = self._host.tolist()
        return ids
