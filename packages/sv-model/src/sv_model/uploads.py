"""Host-to-device copies of small int32 arrays (a step's inputs, block-table rows) that never
wait for the GPU.

A copy from pageable memory would wait for the stream to drain, i.e. for the step still
running; so an array is first copied into pinned memory from torch's caching host allocator,
which keeps that pinned buffer until the copy is done. On the CPU the array is used in place.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def upload(host: np.ndarray, device: torch.device) -> Tensor:
    """One asynchronous host-to-device copy of a small array (kilobytes)."""
    tensor = torch.from_numpy(host)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def upload_packed(parts: list[np.ndarray], device: torch.device) -> list[Tensor]:
    """Upload int32 arrays in one copy; returns a device view of each. Every view starts on
    a 16-byte boundary: Triton specializes a kernel on whether each pointer argument is
    16-byte aligned, and offsets that moved with the step's sizes would compile new
    variants mid-run (seen on the H200: ~2 s in the first large batch after warm-up)."""
    starts = [0]
    for part in parts:
        starts.append(starts[-1] + -(-len(part) // 4) * 4)
    host = np.zeros(starts[-1], dtype=np.int32)
    for part, start in zip(parts, starts[:-1], strict=True):
        host[start : start + len(part)] = part
    dev = upload(host, device)
    return [dev[start : start + len(part)] for part, start in zip(parts, starts[:-1], strict=True)]
