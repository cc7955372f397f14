"""token_logprobs: the Triton kernel (one read of the logits: per-chunk max, sum of exp and
top k, then a per-row merge) and the plain-torch two-stage path (logsumexp + two-stage top-k)
against the reference (log_softmax, gather, topk), and the reference against a hand-computed
case. Where values tie, the reference's top-k leaves the order open; the kernel's is that of
a stable descending sort (the lower id first), checked against torch.sort(stable=True)."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from kernels_testing import DEVICE, GPU, gpu_test, randint, randn
from sv_kernels import KernelError, graphs, ops, reference, triton_ops
from sv_kernels import token_logprobs as device

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def assert_equals_reference(got: Result, logits: torch.Tensor, ids: torch.Tensor, k: int) -> None:
    """Values within FP32 rounding of the reference; ids those of a stable descending sort of
    the log-softmax (the reference's own where nothing ties)."""
    chosen, values, _ = reference.token_logprobs(logits.float(), ids, k)
    assert got[1].dtype == torch.float32 and got[2].dtype == torch.int64
    assert got[1].shape == got[2].shape == (logits.shape[0], k)
    assert torch.allclose(got[0], chosen, atol=1e-5)
    assert torch.allclose(got[1], values, atol=1e-5)
    full = torch.log_softmax(logits.float(), dim=-1)
    order = torch.sort(full, dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(got[2], order)


def test_reference_on_a_hand_computed_row() -> None:
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)]])  # probabilities 0.1, 0.3, 0.6
    chosen, values, ids = reference.token_logprobs(logits, torch.tensor([1]), 2)
    assert chosen.tolist() == pytest.approx([math.log(0.3)])
    assert ids.tolist() == [[2, 1]]
    assert values.tolist() == [pytest.approx([math.log(0.6), math.log(0.3)])]


SHAPES = [
    (1, 37, 5),  # one stage (shorter than a chunk)
    (3, 5000, 20),  # chunks and a tail
    (2, 4096, 0),  # chunks, no tail; no alternatives
    (4, 3000, 1),
    pytest.param(1, 128256, 20, marks=GPU),
    pytest.param(256, 128256, 20, marks=GPU),
]


@pytest.mark.parametrize(("batch", "vocab", "k"), SHAPES)
def test_kernel_equals_reference(gen: torch.Generator, batch: int, vocab: int, k: int) -> None:
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=4.0)
    logits[0, -1] = logits[0].max() + 2  # the best token in the tail
    ids = randint(gen, 0, vocab, batch)
    got = triton_ops.token_logprobs(logits, ids, k)
    assert_equals_reference(got, logits, ids, k)
    if k:
        assert int(got[2][0, 0]) == vocab - 1


@pytest.mark.parametrize("k", [0, 1, 2, 7, 19, 20])
def test_kernel_every_k(gen: torch.Generator, k: int) -> None:
    logits = randn(gen, 2, 2100, dtype=torch.float32, scale=3.0)
    ids = randint(gen, 0, 2100, 2)
    assert_equals_reference(triton_ops.token_logprobs(logits, ids, k), logits, ids, k)


def test_kernel_ties_go_to_the_lower_id(gen: torch.Generator) -> None:
    """Three distinct values over 2,500 columns (three chunks): every top-20 entry ties with
    hundreds. Row 2's best value is held by three tokens in three chunks, stored last first."""
    logits = randint(gen, 0, 3, 3, 2500).float()
    logits[1, 2400] = 5.0  # one clear best, in the last chunk
    logits[2, :] = logits[2].clamp(max=1.0)
    logits[2, [2100, 1100, 50]] = 2.0
    ids = randint(gen, 0, 2500, 3)
    got = triton_ops.token_logprobs(logits, ids, 20)
    assert_equals_reference(got, logits, ids, 20)
    assert int(got[2][1, 0]) == 2400
    assert got[2][2, :3].tolist() == [50, 1100, 2100]


def test_kernel_masked_logits(gen: torch.Generator) -> None:
    """-inf entries (a grammar's mask): half of row 0; all of row 1 but one token; all of row
    2 but three tokens, so most of its top 20 are -inf, the lower ids first."""
    vocab = 3000
    logits = randn(gen, 3, vocab, dtype=torch.float32, scale=2.0)
    logits[0, torch.randperm(vocab, generator=gen, device=gen.device)[: vocab // 2]] = -math.inf
    logits[1, :] = -math.inf
    logits[1, 2999] = 0.5
    logits[2, :] = -math.inf
    logits[2, [7, 1500, 2048]] = torch.tensor([1.0, 3.0, 1.0], device=logits.device)
    ids = torch.tensor([0, 2999, 5], device=logits.device)
    got = triton_ops.token_logprobs(logits, ids, 20)
    assert_equals_reference(got, logits, ids, 20)
    assert got[2][1].tolist() == [2999, *range(19)]
    assert got[1][1, 0] == 0.0 and bool(torch.isinf(got[1][1, 1:]).all())
    assert got[2][2, :3].tolist() == [1500, 7, 2048]
    assert float(got[0][2]) == -math.inf  # the chosen token was masked


def test_kernel_at_each_chunk_width(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The widths larger batches use (2,048 and 4,096 columns), on a small batch."""
    module = importlib.import_module("sv_kernels.triton_ops.token_logprobs")
    logits = randn(gen, 2, 9000, dtype=torch.float32, scale=4.0)
    ids = randint(gen, 0, 9000, 2)
    for width in (2048, 4096):
        monkeypatch.setattr(module, "_chunk_width", lambda *_args, width=width: width)
        assert_equals_reference(triton_ops.token_logprobs(logits, ids, 20), logits, ids, 20)


@pytest.mark.parametrize("case", ["random", "ties", "masked"])
def test_kernel_prunes_chunks_below_the_threshold(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """64-column chunks, so a row has more chunks than k and the chunks below the row's
    threshold (the k-th largest chunk max) stop at once: random rows (the best token in the
    tail), three-valued ties across chunks, and rows that are -inf but for a few tokens."""
    module = importlib.import_module("sv_kernels.triton_ops.token_logprobs")
    monkeypatch.setattr(module, "_chunk_width", lambda *_args: 64)
    vocab = 2500  # 40 chunks, the last one partial
    if case == "random":
        logits = randn(gen, 3, vocab, dtype=torch.float32, scale=4.0)
        logits[0, -1] = logits[0].max() + 2
    elif case == "ties":
        logits = randint(gen, 0, 3, 3, vocab).float()
        logits[2, :] = logits[2].clamp(max=1.0)
        logits[2, [2100, 1100, 50]] = 2.0
    else:
        logits = torch.full((3, vocab), -math.inf, device=DEVICE)
        logits[0, [7, 1500, 2048]] = torch.tensor([1.0, 3.0, 1.0], device=DEVICE)
        logits[1, 2499] = 0.5
        logits[2, : vocab // 2] = randn(gen, vocab // 2, dtype=torch.float32)
    ids = randint(gen, 0, vocab, 3)
    for k in (1, 7, 20):
        assert_equals_reference(triton_ops.token_logprobs(logits, ids, k), logits, ids, k)


def test_kernel_bf16_and_strided_logits(gen: torch.Generator) -> None:
    """BF16 logits scored in FP32; a row stride wider than the vocabulary (a sliced buffer)."""
    wide = randn(gen, 3, 3200, dtype=torch.bfloat16, scale=4.0)
    logits = wide[:, :3000]
    ids = torch.tensor([0, 7, 2999], device=logits.device)
    assert_equals_reference(triton_ops.token_logprobs(logits, ids, 4), logits, ids, 4)


def test_kernel_empty_batch() -> None:
    logits = torch.zeros(0, 100, device=DEVICE)
    got = triton_ops.token_logprobs(logits, torch.zeros(0, dtype=torch.int64, device=DEVICE), 5)
    assert [tuple(t.shape) for t in got] == [(0,), (0, 5), (0, 5)]


@gpu_test
def test_kernel_in_a_cuda_graph(gen: torch.Generator) -> None:
    """Captured once, replayed on new logits and ids: the engine's log-probability graphs."""
    logits = torch.empty(64, 128256, device="cuda")
    ids = torch.zeros(64, dtype=torch.int64, device="cuda")
    graph, out = graphs.capture(lambda: ops.token_logprobs(logits, ids, ops.MAX_LOGPROBS))
    for _ in range(2):
        logits.copy_(randn(gen, 64, 128256, dtype=torch.float32, scale=4.0))
        ids.copy_(randint(gen, 0, 128256, 64))
        graph.replay()
        assert_equals_reference(out, logits, ids, ops.MAX_LOGPROBS)


@pytest.mark.parametrize(("batch", "vocab", "k"), SHAPES)
def test_two_stage_topk_equals_reference(
    gen: torch.Generator, batch: int, vocab: int, k: int
) -> None:
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=4.0)
    logits[0, -1] = logits[0].max() + 2  # the best token in the tail
    ids = randint(gen, 0, vocab, batch)
    got = device.two_stage_topk(logits, ids, k)
    want = reference.token_logprobs(logits, ids, k)
    assert torch.allclose(got[0], want[0], atol=1e-5)
    assert torch.allclose(got[1], want[1], atol=1e-5)
    assert torch.equal(got[2], want[2])
    if k:
        assert int(got[2][0, 0]) == vocab - 1


def test_two_stage_topk_bf16_logits_scored_in_fp32(gen: torch.Generator) -> None:
    logits = randn(gen, 2, 3000, dtype=torch.bfloat16, scale=4.0)
    ids = torch.tensor([0, 7], device=logits.device)
    got = device.two_stage_topk(logits, ids, 4)
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
