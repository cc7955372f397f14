"""Triton argmax and sample against their references: the same ids, exactly."""

from __future__ import annotations

import pytest
import torch
from kernels_testing import DEVICE, GPU, randint, randn
from sv_kernels import reference, triton_ops

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("batch", "vocab"),
    [
        (1, 37),
        (5, 1000),
        (3, 5000),
        pytest.param(1, 128256, marks=GPU),
        pytest.param(256, 128256, marks=GPU),
    ],
)
def test_argmax(gen: torch.Generator, dtype: torch.dtype, batch: int, vocab: int) -> None:
    logits = randn(gen, batch, vocab, dtype=dtype, scale=4.0)
    # Plant ties for the maximum: the lowest index must win, across chunks too.
    cols = randint(gen, 0, vocab, 3).sort().values
    logits[0, cols] = logits[0].max() + 1
    if batch > 1:
        logits[1] = float("-inf")  # all -inf: index 0, as torch.argmax
    out = triton_ops.argmax(logits)
    assert out.dtype == torch.int64
    assert torch.equal(out, reference.argmax(logits))
    assert int(out[0]) == int(cols[0])


def _sampling_params(
    gen: torch.Generator, batch: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A mix of rows: greedy, temperature only, top-k, top-p, both, and the edge values."""
    # (temperature, top_k, top_p)
    fixed = [
        (0.0, 0, 1.0),  # greedy
        (1.0, 0, 1.0),  # plain sampling
        (0.7, 40, 1.0),
        (1.3, 0, 0.9),
        (0.8, 20, 0.8),
        (1.0, 1, 1.0),  # top-k 1 = greedy
        (1.1, 0, 0.0),  # top-p 0 keeps the maximum only
        (0.6, 10**6, 0.5),  # top-k beyond the vocabulary is off
        (2.0, -5, 0.97),  # negative top-k is off
        (0.0, 5, 0.3),  # greedy wins over the filters
    ]
    rows = [fixed[i % len(fixed)] for i in range(batch)]
    temperature = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    top_k = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    top_p = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    # Random rows after the fixed ones.
    extra = torch.arange(batch) >= len(fixed)
    n = int(extra.sum())
    if n:
        g = torch.Generator().manual_seed(int(randint(gen, 0, 2**31, 1)))
        temperature[extra] = torch.rand(n, generator=g) * 1.5 + 0.05
        top_k[extra] = torch.randint(0, 100, (n,), generator=g, dtype=torch.int32)
        top_p[extra] = torch.rand(n, generator=g) * 0.6 + 0.4
    seeds = randint(gen, -(2**40), 2**40, batch).cpu()  # negative and > 32-bit seeds too
    steps = randint(gen, 0, 2**34, batch).cpu()
    return (
        temperature.to(DEVICE),
        top_k.to(DEVICE),
        top_p.to(DEVICE),
        seeds.to(DEVICE),
        steps.to(DEVICE),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("batch", "vocab", "scale"),
    [
        (10, 700, 3.0),  # peaked rows
        (10, 3000, 1.0),  # flat rows: top-p keeps many columns
        pytest.param(256, 128256, 2.0, marks=GPU),
        pytest.param(10, 128256, 6.0, marks=GPU),
    ],
)
def test_sample_matches_reference_exactly(
    gen: torch.Generator, dtype: torch.dtype, batch: int, vocab: int, scale: float
) -> None:
    logits = randn(gen, batch, vocab, dtype=dtype, scale=scale)
    params = _sampling_params(gen, batch)
    out = triton_ops.sample(logits, *params)
    ref = reference.sample(logits, *params)
    assert out.dtype == torch.int64
    assert torch.equal(out, ref), f"rows differ: {(out != ref).nonzero().flatten().tolist()}"
    # Greedy rows (temperature 0) and top-k 1 rows are the argmax.
    temperature, top_k = params[0], params[1]
    greedy = (temperature <= 0) | (top_k == 1)
    assert torch.equal(out[greedy], reference.argmax(logits)[greedy])


def test_sample_ties_at_the_top_k_boundary(gen: torch.Generator) -> None:
    """Values equal to the k-th largest are all kept (the reference's rule), on both backends."""
    vocab = 64
    base = randint(gen, 0, 6, 4, vocab).float()  # many exact ties
    logits = base.to(DEVICE)
    ones = torch.ones(4, device=DEVICE)
    for top_k in (1, 3, 10):
        for top_p in (1.0, 0.6):
            params = (
                ones * 0.9,
                torch.full((4,), top_k, dtype=torch.int32, device=DEVICE),
                ones * top_p,
                torch.arange(4, dtype=torch.int64, device=DEVICE),
                torch.full((4,), 11, dtype=torch.int64, device=DEVICE),
            )
            out = triton_ops.sample(logits, *params)
            assert torch.equal(out, reference.sample(logits, *params)), (
                f"top_k={top_k} top_p={top_p}"
            )


def test_sample_steps_draw_fresh_noise(gen: torch.Generator) -> None:
    """Flat logits, one request over many steps: the ids follow the reference and vary."""
    steps = 24
    logits = torch.zeros(steps, 50, device=DEVICE)
    params = (
        torch.ones(steps, device=DEVICE),
        torch.zeros(steps, dtype=torch.int32, device=DEVICE),
        torch.ones(steps, device=DEVICE),
        torch.full((steps,), int(randint(gen, 0, 2**31, 1)), dtype=torch.int64, device=DEVICE),
        torch.arange(steps, dtype=torch.int64, device=DEVICE),
    )
    out = triton_ops.sample(logits, *params)
    assert torch.equal(out, reference.sample(logits, *params))
    assert len(set(out.tolist())) > 5
