"""token_logprobs: the device path (logsumexp + two-stage top-k) against the reference
(log_softmax, gather, topk), and the reference against a hand-computed case."""

from __future__ import annotations

import math

import pytest
import torch
from kernels_testing import GPU, randint, randn
from sv_kernels import KernelError, ops, reference
from sv_kernels import token_logprobs as device


def test_reference_on_a_hand_computed_row() -> None:
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)]])  # probabilities 0.1, 0.3, 0.6
    chosen, values, ids = reference.token_logprobs(logits, torch.tensor([1]), 2)
    assert chosen.tolist() == pytest.approx([math.log(0.3)])
    assert ids.tolist() == [[2, 1]]
    assert values.tolist() == [pytest.approx([math.log(0.6), math.log(0.3)])]


@pytest.mark.parametrize(
    ("batch", "vocab", "k"),
    [
        (1, 37, 5),  # one stage (shorter than a chunk)
        (3, 5000, 20),  # chunks and a tail
        (2, 4096, 0),  # chunks, no tail; no alternatives
        (4, 3000, 1),
        pytest.param(1, 128256, 20, marks=GPU),
        pytest.param(256, 128256, 20, marks=GPU),
    ],
)
def test_device_path_equals_reference(gen: torch.Generator, batch: int, vocab: int, k: int) -> None:
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=4.0)
    logits[0, -1] = logits[0].max() + 2  # the best token in the tail
    ids = randint(gen, 0, vocab, batch)
    got = device.token_logprobs(logits, ids, k)
    want = reference.token_logprobs(logits, ids, k)
    assert torch.allclose(got[0], want[0], atol=1e-5)
    assert torch.allclose(got[1], want[1], atol=1e-5)
    assert torch.equal(got[2], want[2])
    if k:
        assert int(got[2][0, 0]) == vocab - 1


def test_bf16_logits_scored_in_fp32(gen: torch.Generator) -> None:
    logits = randn(gen, 2, 3000, dtype=torch.bfloat16, scale=4.0)
    ids = torch.tensor([0, 7], device=logits.device)
    got = device.token_logprobs(logits, ids, 4)
    want = reference.token_logprobs(logits.float(), ids, 4)
    assert got[1].dtype == torch.float32
    assert torch.allclose(got[0], want[0], atol=1e-5)
    assert torch.allclose(got[1], want[1], atol=1e-5)
    # BF16 rows of 3,000 logits hold ties, which either top-k may order its own way: the ids
    # must be distinct and score what the reference's top-k scores.
    full = torch.log_softmax(logits.float(), dim=-1)
    assert all(len(set(row)) == 4 for row in got[2].tolist())
    assert torch.allclose(full.gather(1, got[2]), want[1], atol=1e-5)


@pytest.mark.parametrize(
    ("logits", "ids", "k", "message"),
    [
        (torch.zeros(2, 10), torch.zeros(3, dtype=torch.int64), 1, "ids"),
        (torch.zeros(2, 10), torch.zeros(2), 1, "integer"),
        (torch.zeros(2, 10), torch.zeros(2, dtype=torch.int64), 21, "k must be"),
        (torch.zeros(2, 10), torch.zeros(2, dtype=torch.int64), 11, "k must be"),
    ],
)
def test_bad_arguments_named(logits: torch.Tensor, ids: torch.Tensor, k: int, message: str) -> None:
    with pytest.raises(KernelError, match=message):
        ops.token_logprobs(logits, ids, k)
