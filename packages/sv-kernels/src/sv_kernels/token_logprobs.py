"""`two_stage_topk`: `reference.token_logprobs` in plain torch without writing the [B, V]
log-softmax, the form the Triton kernel (triton_ops/token_logprobs.py, which `ops` runs on
CUDA) replaced; kept as the kernel benchmark's baseline.

A log-probability is `logit - logsumexp(row)`, and the k most likely tokens are the k largest
logits: one logsumexp and a top-k in two stages, per chunk of `_CHUNK` columns and then over
the chunks' survivors (torch.topk gives one row to few blocks), reading the logits twice.
Capturable in a CUDA graph: no host sync.
"""

from __future__ import annotations

import torch
from torch import Tensor

_CHUNK = 1024  # columns per first-stage top-k: ~125 chunks for the Llama 3 vocabulary


def two_stage_topk(logits: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    chosen = x.gather(1, ids.long()[:, None]) - lse
    top_values, top_ids = _top_k(x, k)
    return chosen[:, 0], top_values - lse, top_ids


def _top_k(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """torch.topk(x, k) (sorted, largest first), in two stages when the rows are long."""
    batch, vocab = x.shape
    chunks = vocab // _CHUNK
    if chunks < 2 or k > _CHUNK:
        return torch.topk(x, k, dim=-1)
    body = x[:, : chunks * _CHUNK].view(batch, chunks, _CHUNK)
    values, index = torch.topk(body, k, dim=-1)  # [B, chunks, k]
    offsets = torch.arange(0, chunks * _CHUNK, _CHUNK, device=x.device)
    index = (index + offsets[None, :, None]).view(batch, chunks * k)
    values = values.view(batch, chunks * k)
    tail = vocab - chunks * _CHUNK
    if tail:
        tail_values, tail_index = torch.topk(x[:, chunks * _CHUNK :], min(k, tail), dim=-1)
        values = torch.cat([values, tail_values], dim=1)
        index = torch.cat([index, tail_index + chunks * _CHUNK], dim=1)
    top_values, picked = torch.topk(values, k, dim=-1)
    return top_values, index.gather(1, picked)
