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
    # Greedy rows (temperature 0) are the argmax. Top-k 1 rows draw one of the maxima: top-k
    # keeps ties, and BF16 rows often have several (so the argmax would fail ~1% of runs).
    temperature, top_k = params[0], params[1]
    greedy = temperature <= 0
    assert torch.equal(out[greedy], reference.argmax(logits)[greedy])
    top1 = (top_k == 1) & ~greedy
    drawn = logits[top1].gather(1, out[top1][:, None]).squeeze(1)
    assert torch.equal(drawn, logits[top1].max(dim=-1).values)


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


# --- the chunked radix select: shapes and values at its edges -------------------------------


def _draw(
    gen: torch.Generator,
    logits: torch.Tensor,
    temperature: list[float],
    top_k: list[int],
    top_p: list[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both backends' ids for these rows (fresh random seeds and steps); asserts they agree."""
    batch = logits.shape[0]
    params = (
        torch.tensor(temperature, dtype=torch.float32, device=DEVICE),
        torch.tensor(top_k, dtype=torch.int32, device=DEVICE),
        torch.tensor(top_p, dtype=torch.float32, device=DEVICE),
        randint(gen, -(2**40), 2**40, batch),
        randint(gen, 0, 2**34, batch),
    )
    out = triton_ops.sample(logits, *params)
    ref = reference.sample(logits, *params)
    assert torch.equal(out, ref), f"rows differ: {(out != ref).nonzero().flatten().tolist()}"
    return out, ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab"), [(1, 9001), (5, 4099), (5, 6143)])
def test_sample_several_chunks_odd_vocab(
    gen: torch.Generator, dtype: torch.dtype, batch: int, vocab: int
) -> None:
    """Rows split over several chunks, the last one partial: every kind of row still matches."""
    from sv_kernels.triton_ops.sampling import _MAX_CHUNK, _MIN_CHUNK, _vocab_chunk

    chunk = _vocab_chunk(batch, vocab, DEVICE, _MIN_CHUNK, _MAX_CHUNK)
    assert vocab > chunk and vocab % chunk != 0  # the shape exercises what it is meant to
    for scale in (1.0, 4.0):
        logits = randn(gen, batch, vocab, dtype=dtype, scale=scale)
        # Each kind of row in turn: greedy, temperature only, top-k, top-p, both.
        kinds = [(0.0, 0, 1.0), (0.9, 0, 1.0), (0.8, 30, 1.0), (1.2, 0, 0.7), (0.7, 200, 0.95)]
        for shift in range(len(kinds) if batch < len(kinds) else 1):
            rows = [kinds[(shift + i) % len(kinds)] for i in range(batch)]
            temperature = [r[0] for r in rows]
            _draw(gen, logits, temperature, [r[1] for r in rows], [r[2] for r in rows])


def test_sample_top_k_edges(gen: torch.Generator) -> None:
    """top-k 1, top-k at / beyond the vocabulary, and top-k equal to a tie group's size."""
    batch, vocab = 5, 4099
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=3.0)
    # Row 3: 7 columns tie for the maximum; row 4: 6 columns tie just below it.
    top_cols = randint(gen, 0, vocab, 7)
    logits[3, top_cols] = logits[3].max() + 1.0
    # The 6 are drawn from the other columns: one of them being the maximum's would leave a tie.
    order = torch.randperm(vocab, generator=gen, device=gen.device)
    logits[4, order[0]] = logits[4].max() + 2.0
    logits[4, order[1:7]] = logits[4].max() - 0.5
    ties = int((logits[3] == logits[3].max()).sum())
    greedy = reference.argmax(logits)
    top_p = [1.0, 0.8, 0.95, 1.0, 0.8]
    for top_k in (1, ties, ties + 1, vocab - 1, vocab, vocab + 1):
        out, _ = _draw(gen, logits, [1.0] * batch, [top_k] * batch, top_p)
        if top_k == 1:
            # top-k 1 keeps the maximum and its ties: row 3 draws among its ties.
            assert torch.equal(out[[0, 1, 2, 4]], greedy[[0, 1, 2, 4]])
        if top_k <= ties:
            assert bool((logits[3, out[3]] == logits[3].max()).item())


def test_sample_many_ties_at_the_boundary(gen: torch.Generator) -> None:
    """Integer logits over several chunks: every threshold falls inside a large tie group."""
    batch, vocab = 7, 6143
    logits = randint(gen, -8, 8, batch, vocab).float()
    for row in range(batch):  # a large group tied for the maximum
        logits[row, torch.randperm(vocab, generator=gen, device=gen.device)[:500]] = 8.0
    top_k = [1, 3, 50, 499, 500, 501, 2000]  # one per row, around the group's size
    for top_p in (1.0, 0.3, 0.9):
        _draw(gen, logits, [0.6] * batch, top_k, [top_p] * batch)


def test_sample_top_p_extremes(gen: torch.Generator) -> None:
    """Tiny top-p keeps the maximum only; top-p 1.0 is off (the same draw as no filter)."""
    batch, vocab = 5, 4099
    logits = randn(gen, batch, vocab, dtype=torch.bfloat16, scale=2.0)
    temperature = [0.5, 1.0, 1.5, 2.0, 0.8]
    for tiny in (0.0, 1e-6, -1.0):
        out, _ = _draw(gen, logits, temperature, [0] * batch, [tiny] * batch)
        # The maximum only, or one of its ties (BF16 rows often have some).
        drawn = logits.gather(1, out[:, None]).squeeze(1)
        assert torch.equal(drawn, logits.max(dim=-1).values)
    seeds = randint(gen, 0, 2**40, batch)
    steps = randint(gen, 0, 2**34, batch)
    draws = []
    for top_p in (1.0, 1.5, 2.0):
        params = (
            torch.tensor(temperature, device=DEVICE),
            torch.zeros(batch, dtype=torch.int32, device=DEVICE),
            torch.full((batch,), top_p, device=DEVICE),
            seeds,
            steps,
        )
        out = triton_ops.sample(logits, *params)
        assert torch.equal(out, reference.sample(logits, *params))
        draws.append(out)
    assert all(torch.equal(d, draws[0]) for d in draws)


def test_sample_rows_with_minus_inf(gen: torch.Generator) -> None:
    """-inf logits (masked tokens): never drawn, and top-k beyond the finite ones keeps all."""
    batch, vocab = 5, 4099
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=2.0)
    masked = torch.rand(batch, vocab, generator=gen, device=gen.device) < 0.5
    logits[masked] = float("-inf")
    logits[2] = float("-inf")
    few = randint(gen, 0, vocab, 3)
    logits[2, few] = torch.tensor([1.0, 2.0, 3.0], device=DEVICE)  # three finite values
    finite = torch.isfinite(logits)
    temperature = [0.0, 1.0, 0.7, 1.3, 0.9]
    top_p = [1.0, 0.5, 0.99, 1.0, 0.5]
    for i, top_k in enumerate((0, 2, 4, 3000)):
        rows_top_p = top_p[i:] + top_p[:i]  # each row meets several top-p values
        out, _ = _draw(gen, logits, temperature, [top_k] * batch, rows_top_p)
        assert bool(finite[torch.arange(batch, device=DEVICE), out].all())


# At T = 1e-38 the logits below the largest divide past FP32's range to -inf, as intended.
@pytest.mark.filterwarnings("ignore:overflow encountered in divide:RuntimeWarning")
def test_sample_far_from_zero_and_at_a_tiny_temperature(gen: torch.Generator) -> None:
    """Rows where FP32 cannot hold the noise beside x (`reference`'s sampling notes): both
    backends measure x from the row's largest logit, found across chunks, and agree."""
    batch, vocab = 5, 2100  # two chunks: the row maximum is merged from their maxima
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=2.0)
    tops = torch.tensor([5, 1000, 2050, 2099])
    logits[0, tops] = 1e30  # ties the noise cannot break without the offset
    logits[1] = logits[1].abs() + 4.0  # at T = 1e-38 every logit / T overflows (3.4 would not)
    logits[2] -= 1e30  # far below zero: every logit loses digits, all equally
    logits[3] = float("-inf")  # but for four near FP32's largest and two at -1e30
    logits[3, tops] = 3e38
    logits[3, [10, 20]] = -1e30
    logits[4, tops[1:3]] = float("inf")  # overflowed logits: measured from 0, never NaN
    # (no top-p there: the mass of +inf has no fixed-point value)
    logits = logits.to(DEVICE)
    temperature = [1.0, 1e-38, 0.8, 2.0, 0.9]
    drawn: list[set[int]] = [set() for _ in range(batch)]
    for top_k, top_p in ((0, 1.0), (3, 1.0), (0, 0.9), (20, 0.7)):
        for _ in range(3):
            out, _ = _draw(gen, logits, temperature, [top_k] * batch, [top_p] * 4 + [1.0])
            for row, token in enumerate(out.tolist()):
                drawn[row].add(token)
    # Twelve draws among four tied tokens: all the same one is a 2e-7 chance.
    for row in (0, 3):
        assert drawn[row] <= set(tops.tolist()) and len(drawn[row]) >= 2, (row, drawn[row])
    assert drawn[1] == {int(torch.argmax(logits[1]))}
    assert drawn[4] <= set(tops[1:3].tolist()), drawn[4]


# At T = 1e-5 the logits far below the saturated ones divide past FP32's range to -inf.
@pytest.mark.filterwarnings("ignore:overflow encountered in divide:RuntimeWarning")
def test_a_repetition_penalty_on_a_huge_bias_samples_alike_on_both_backends(
    gen: torch.Generator,
) -> None:
    """A repetition penalty below 1 on logits biased to near FP32's largest (both allowed by
    SamplingParams) once overflowed them to +inf: the reference drew the lowest such column
    every time, and the Triton sampler's top-p mass of +inf was garbage, so it drew column 0,
    a token nobody favoured. Saturated at FP32's largest, the overflowed tokens tie: both
    backends agree and draw among them."""
    batch, vocab = 4, 300
    raw = randn(gen, batch, vocab, dtype=torch.float32, scale=2.0)
    favoured = torch.tensor([7, 50, 201])
    raw[:, favoured] += 3.4e38  # logit_bias near FP32's largest
    seen = torch.zeros(batch, vocab, dtype=torch.bool, device=DEVICE)
    seen[:, favoured] = True  # in the prompt
    off = torch.zeros(batch, device=DEVICE)
    penalised = reference.apply_penalties(
        raw, torch.zeros_like(raw, dtype=torch.int32), seen, off, off, off + 0.5
    )
    assert bool(torch.isfinite(penalised).all())
    drawn: set[int] = set()
    for temperature, top_p in ((1.0, 0.9), (1e-5, 0.9), (0.7, 1.0)):
        for _ in range(3):
            out, _ = _draw(gen, penalised, [temperature] * batch, [0] * batch, [top_p] * batch)
            drawn.update(out.tolist())
    assert drawn <= set(favoured.tolist()) and len(drawn) >= 2, drawn


def test_sample_is_deterministic(gen: torch.Generator) -> None:
    """The same inputs give the same ids run after run (integer histograms, no float atomics)."""
    batch, vocab = 5, 4099
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=1.0)
    params = _sampling_params(gen, batch)
    first = triton_ops.sample(logits, *params)
    for _ in range(2):
        assert torch.equal(triton_ops.sample(logits, *params), first)


@pytest.mark.parametrize(
    ("filters", "any_top_k", "any_top_p"),
    [
        ("none", False, False),  # greedy and temperature-only rows: the 3-launch path
        ("top-k", True, False),
        ("top-p", False, True),
    ],
)
def test_sample_skipping_unused_filters(
    gen: torch.Generator, filters: str, any_top_k: bool, any_top_p: bool
) -> None:
    """A truthful any_top_k / any_top_p = False skips that filter's kernels and changes no id
    (the scratch the skipped rounds would have written is never read uninitialized)."""
    batch, vocab = 6, 5000
    # All negative: a threshold left at anything but -inf (or the filter's own) would show.
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=3.0) - 30.0
    temperature = [0.0, 0.7, 1.3, 0.0, 0.5, 1.0]
    top_k = [40, 30, 5, 0, 100, 7] if any_top_k else [0] * batch
    top_p = [0.5, 0.8, 0.3, 1.0, 0.95, 0.6] if any_top_p else [1.0] * batch
    params = (
        torch.tensor(temperature, device=DEVICE),
        torch.tensor(top_k, dtype=torch.int32, device=DEVICE),
        torch.tensor(top_p, device=DEVICE),
        randint(gen, 0, 2**40, batch),
        randint(gen, 0, 2**20, batch),
    )
    for _ in range(3):  # fresh noise each time, via fresh steps
        hinted = triton_ops.sample(logits, *params, any_top_k=any_top_k, any_top_p=any_top_p)
        assert torch.equal(hinted, reference.sample(logits, *params)), filters
        assert torch.equal(hinted, triton_ops.sample(logits, *params))
        params = (*params[:4], params[4] + 1)
