"""Choosing how a step's next tokens are drawn from its logits.

A grammar's token bitmask, when the step has one, is applied first (`apply_grammar`), in
place: the drawing below then only ever sees allowed tokens. Greedy rows take the argmax (a
decode graph computes it in the same replay); sampled rows of a graph-replayed step are drawn
by a captured sampling graph over that graph's logits buffer; any other step calls
`ops.sample` eagerly.
"""

from __future__ import annotations

import numpy as np
import torch
from sv_kernels import ops
from torch import Tensor

from sv_model.decode_graphs import DecodeGraph
from sv_model.step import SamplingRows, TokenBitmask
from sv_model.uploads import upload


def next_token_ids(
    logits: Tensor,
    greedy_ids: Tensor | None,
    sampling: SamplingRows | None,
    graph: DecodeGraph | None,
    bitmask: TokenBitmask | None = None,
) -> Tensor:
    """The next token of each row of `logits`. `greedy_ids`: their argmax, if already computed;
    `graph`: the decode graph whose logits buffer starts with these rows, if any; `bitmask`:
    the grammar constraints of some rows."""
    if bitmask is not None:
        apply_grammar(logits, bitmask)
        greedy_ids = None  # the decode graph's argmax saw the logits before the mask
    if sampling is None or sampling.all_greedy():
        return greedy_ids if greedy_ids is not None else ops.argmax(logits)
    if graph is not None:  # the logits are the graph's own buffer: sample in a graph too
        return graph.sample(logits.shape[0], sampling)
    return sample_eagerly(logits, sampling)


def apply_grammar(logits: Tensor, bitmask: TokenBitmask) -> None:
    """Disallowed tokens of the constrained rows get -inf, in place (one upload, one kernel)."""
    rows = upload(np.asarray(bitmask.rows, dtype=np.int32), logits.device)
    words = upload(np.ascontiguousarray(bitmask.words, dtype=np.int32), logits.device)
    ops.apply_token_bitmask(logits, words, rows)


def sample_eagerly(logits: Tensor, sampling: SamplingRows) -> Tensor:
    """`ops.sample` with the rows' parameters uploaded in two copies."""
    floats = upload(
        np.asarray([sampling.temperature, sampling.top_p], dtype=np.float32), logits.device
    )
    ints = upload(
        np.asarray([sampling.top_k, sampling.seeds, sampling.steps], dtype=np.int64),
        logits.device,
    )
    return ops.sample(
        logits,
        floats[0],
        ints[0].int(),
        floats[1],
        ints[1],
        ints[2],
        any_top_k=sampling.any_top_k(),
        any_top_p=sampling.any_top_p(),
    )


def compile_sampler(vocab_size: int, device: torch.device) -> None:
    """Run the sampler's kernels once with top-k and top-p on (one compile per vocabulary size,
    any batch size), so that the first sampled request does not pay for it."""
    rows = torch.ones(1, device=device)
    index = torch.zeros(1, dtype=torch.int64, device=device)
    logits = torch.zeros((1, vocab_size), device=device)
    top_k = torch.full((1,), 50, dtype=torch.int32, device=device)
    ops.sample(logits, rows, top_k, rows * 0.9, index, index)
