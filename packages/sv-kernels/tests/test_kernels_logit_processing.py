"""Penalties, min_p and logit_bias against hand-written loops of OpenAI's and vLLM's formulas.

OpenAI (presence/frequency): mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) *
alpha_presence, c[j] counting token j in the output so far. vLLM (repetition, from CTRL): a
token in the prompt or the output has logit / r if positive, logit * r otherwise. vLLM's min_p:
after temperature T, drop tokens with p < min_p * p_max. logit_bias: added to the logit.
"""

from __future__ import annotations

import math

import pytest
import torch
from sv_kernels import KernelError, ops

VOCAB = 12


def _rows(gen: torch.Generator, batch: int) -> torch.Tensor:
    return torch.randn(batch, VOCAB, generator=gen) * 3


def test_penalties_equal_the_formulas() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = _rows(gen, 4)
    counts = torch.randint(0, 3, (4, VOCAB), generator=gen, dtype=torch.int32)
    prompt = torch.rand(4, VOCAB, generator=gen) < 0.3
    presence = [0.5, 0.0, -1.0, 2.0]
    frequency = [0.25, 1.0, 0.0, -0.5]
    repetition = [1.0, 1.3, 0.8, 2.0]
    got = ops.apply_penalties(
        logits,
        counts,
        prompt,
        torch.tensor(presence),
        torch.tensor(frequency),
        torch.tensor(repetition),
    )
    for b in range(4):
        for j in range(VOCAB):
            mu = float(logits[b, j])
            c = int(counts[b, j])
            if c > 0 or bool(prompt[b, j]):
                mu = mu / repetition[b] if mu > 0 else mu * repetition[b]
            mu = mu - c * frequency[b] - float(c > 0) * presence[b]
            assert float(got[b, j]) == pytest.approx(mu, rel=1e-6, abs=1e-6)


def test_penalties_off_change_nothing() -> None:
    logits = _rows(torch.Generator().manual_seed(1), 2)
    counts = torch.ones(2, VOCAB, dtype=torch.int32)
    zeros = torch.zeros(2)
    got = ops.apply_penalties(logits, counts, counts > 0, zeros, zeros, torch.ones(2))
    assert torch.equal(got, logits)


def test_a_repetition_penalty_keeps_finite_logits_finite() -> None:
    """At its limits the repetition penalty saturates at FP32's largest magnitude instead of
    overflowing (a huge logit_bias divided by r < 1; a very negative one times r > 1), and the
    infinities a logit already had (a ban: -inf) stay as they were."""
    largest = torch.finfo(torch.float32).max
    logits = torch.tensor([[3e38, -3e38, float("-inf"), 2.0], [3e38, -3e38, float("-inf"), -2.0]])
    seen = torch.ones(2, 4, dtype=torch.bool)
    zeros = torch.zeros(2)
    got = ops.apply_penalties(
        logits, torch.zeros(2, 4, dtype=torch.int32), seen, zeros, zeros, torch.tensor([0.5, 2.0])
    )
    want = [[largest, -1.5e38, float("-inf"), 4.0], [1.5e38, -largest, float("-inf"), -4.0]]
    assert got.tolist() == torch.tensor(want).tolist()


def test_min_p_equals_the_formula() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = _rows(gen, 4)
    temperature = [1.0, 0.5, 0.0, 1.7]
    min_p = [0.1, 0.3, 0.9, 0.0]
    got = ops.apply_min_p(logits, torch.tensor(temperature), torch.tensor(min_p))
    for b in range(4):
        if temperature[b] <= 0 or min_p[b] == 0:
            assert torch.equal(got[b], logits[b])
            continue
        scaled = [float(v) / temperature[b] for v in logits[b]]
        z = sum(math.exp(v) for v in scaled)
        probs = [math.exp(v) / z for v in scaled]
        for j, p in enumerate(probs):
            kept = p >= min_p[b] * max(probs)
            assert math.isfinite(float(got[b, j])) == kept
            if kept:
                assert float(got[b, j]) == float(logits[b, j])


def test_logit_bias_adds_and_bans() -> None:
    logits = _rows(torch.Generator().manual_seed(3), 3)
    entries = [(0, 1, 5.0), (0, 1, 1.0), (2, 7, -100.0), (1, 0, float("-inf"))]
    rows = torch.tensor([e[0] for e in entries])
    tokens = torch.tensor([e[1] for e in entries])
    values = torch.tensor([e[2] for e in entries])
    got = ops.apply_logit_bias(logits, rows, tokens, values)
    want = logits.clone().tolist()
    for b, j, v in entries:
        want[b][j] += v
    for b in range(3):
        assert got[b].tolist() == pytest.approx(want[b])
    assert torch.isneginf(got[1, 0])


def test_allowed_tokens_ban_all_others_of_their_rows() -> None:
    logits = _rows(torch.Generator().manual_seed(4), 3)
    allowed = {0: [2, 5], 2: [7]}  # row 1 is not restricted
    rows = torch.tensor([b for b, ids in allowed.items() for _ in ids])
    tokens = torch.tensor([j for ids in allowed.values() for j in ids])
    got = ops.apply_allowed_tokens(logits, rows, tokens, torch.tensor(list(allowed)))
    for b in range(3):
        for j in range(VOCAB):
            kept = b not in allowed or j in allowed[b]
            assert float(got[b, j]) == (float(logits[b, j]) if kept else -math.inf)


def test_bad_arguments_named() -> None:
    logits = torch.zeros(2, VOCAB)
    with pytest.raises(KernelError, match="prompt_mask"):
        ops.apply_penalties(
            logits,
            torch.zeros(2, VOCAB, dtype=torch.int32),
            torch.zeros(2, VOCAB),
            torch.zeros(2),
            torch.zeros(2),
            torch.ones(2),
        )
    with pytest.raises(KernelError, match="min_p"):
        ops.apply_min_p(logits, torch.ones(2), torch.ones(3))
    with pytest.raises(KernelError, match="tokens"):
        ops.apply_logit_bias(
            logits, torch.zeros(2, dtype=torch.int64), torch.zeros(1), torch.zeros(2)
        )
    with pytest.raises(KernelError, match="restricted"):
        ops.apply_allowed_tokens(
            logits,
            torch.zeros(1, dtype=torch.int64),
            torch.ones(1, dtype=torch.int64),
            torch.zeros(1),
        )
