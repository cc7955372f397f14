"""The few-row (2-16 rows) split-K kernel against FP64 products, and ops.linear's dispatch to it."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from kernels_testing import DEVICE, GPU, HAS_CUDA, assert_close, gpu_test, randn
from sv_kernels import KernelError, ops, reference, triton_ops
from sv_kernels.graphs import capture
from sv_kernels.linear_plan import FEW_ROWS, FewRowsTile, LinearPlan
from sv_kernels.triton_ops.few_rows import CONFIGS, prepare_counters
from sv_kernels.tuning_cache import TunedShape, TuningCache
from test_kernels_gemv import assert_dot_products_close

BF16 = torch.bfloat16


@pytest.mark.parametrize("tile", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "n", "k"),
    [
        (2, 37, 100),  # neither dim a multiple of any tile, K shorter than the splits
        (5, 64, 1000),
        (FEW_ROWS, 48, 1536),
        (1, 16, 520),
        pytest.param(5, 3072, 2048, marks=GPU),  # Llama 3.2 1B qkv
        pytest.param(16, 2048, 8192, marks=GPU),  # down
        pytest.param(2, 16384, 2048, marks=GPU),  # gate/up
        pytest.param(9, 128256, 2048, marks=GPU),  # LM head
    ],
)
def test_few_rows_matches_linear(
    gen: torch.Generator, tile: FewRowsTile, dtype: torch.dtype, rows: int, n: int, k: int
) -> None:
    x = randn(gen, rows, k, dtype=dtype)
    w = randn(gen, n, k, dtype=dtype)
    prepare_counters(w, tile)
    out = triton_ops.few_rows_linear(x, w, tile)
    assert out.shape == (rows, n) and out.dtype == dtype
    assert not torch.isnan(out).any()
    assert_dot_products_close(out, x, w, f"few_rows {tile}")


@pytest.mark.parametrize("tile", [CONFIGS[0], (16, 128, 8, 4, 1), (32, 128, 4, 4, 3)])
def test_split_sums_do_not_depend_on_arrival_order(gen: torch.Generator, tile: FewRowsTile) -> None:
    """The last program of a tile adds the partials in split order: repeated calls give the same
    bits, and the counters are back at zero after each (a second call would otherwise finish
    tiles early, with partials missing)."""
    x = randn(gen, 7, 1024, dtype=torch.float32)
    w = randn(gen, 80, 1024, dtype=torch.float32)
    prepare_counters(w, tile)
    first = triton_ops.few_rows_linear(x, w, tile)
    for _ in range(3):
        assert torch.equal(triton_ops.few_rows_linear(x, w, tile), first)
    assert_dot_products_close(first, x, w, f"few_rows {tile}")


@pytest.mark.parametrize("tile", [(16, 256, 1, 4, 1), (32, 128, 4, 4, 3), (16, 128, 8, 4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "inter", "k"), [(3, 37, 100), (16, 64, 512), pytest.param(8, 8192, 2048, marks=GPU)]
)
def test_few_rows_swiglu_epilogue_equals_the_two_ops(
    gen: torch.Generator, tile: FewRowsTile, dtype: torch.dtype, rows: int, inter: int, k: int
) -> None:
    """Gate and up rounded to the output dtype, then silu(gate) * up: the bits of running
    `swiglu` on the kernel's plain output."""
    x = randn(gen, rows, k, dtype=dtype)
    gate_up = randn(gen, 2 * inter, k, dtype=dtype)
    prepare_counters(gate_up, tile, swiglu=True)
    fused = triton_ops.few_rows_linear(x, gate_up, tile, swiglu=True)
    assert fused.shape == (rows, inter) and fused.dtype == dtype
    prepare_counters(gate_up, tile)
    gate_and_up = triton_ops.few_rows_linear(x, gate_up, tile)
    assert_dot_products_close(gate_and_up, x, gate_up, f"few_rows {tile} gate and up")
    unfused = triton_ops.swiglu(gate_and_up)
    if HAS_CUDA:
        assert torch.equal(fused, unfused), f"{tile}: max diff {(fused - unfused).abs().max()}"
    else:  # the interpreter's dot is numpy's FP32 matmul (BF16 inputs too), whose summation
        # order follows the layout (the fused tile interleaves gate and up rows): the sums may
        # differ in their last bit and, now and then, round to different BF16 values (seed
        # 129913638); the GPU's order is per element
        assert_close(fused, unfused, "swiglu epilogue against the two ops")
    assert_close(fused, reference.swiglu(gate_and_up), "swiglu epilogue")


@pytest.mark.parametrize("tile", [(16, 256, 1, 4, 1), (16, 128, 4, 4, 3)])
def test_few_rows_bias_and_fp32_output(gen: torch.Generator, tile: FewRowsTile) -> None:
    """A bias is added to the FP32 sums before rounding; FP32 output is the x-dtype result
    widened (as the batch-1 GEMV writes the LM head's logits)."""
    x = randn(gen, 4, 300, dtype=BF16)
    w = randn(gen, 70, 300, dtype=BF16)
    bias = randn(gen, 70, dtype=BF16)
    prepare_counters(w, tile)
    out = triton_ops.few_rows_linear(x, w, tile, bias=bias)
    assert_dot_products_close(out - bias.double(), x, w, f"few_rows {tile} with a bias")
    wide = triton_ops.few_rows_linear(x, w, tile, out_dtype=torch.float32)
    assert wide.dtype == torch.float32
    assert torch.equal(wide, triton_ops.few_rows_linear(x, w, tile).float())


def test_few_rows_rejects_what_it_cannot_multiply(gen: torch.Generator) -> None:
    w = randn(gen, 32, 64, dtype=torch.float32)
    tile = CONFIGS[0]
    with pytest.raises(KernelError, match="1 to 16 rows of x, got 17"):
        triton_ops.few_rows_linear(randn(gen, 17, 64, dtype=torch.float32), w, tile)
    with pytest.raises(KernelError, match="x has 63 columns"):
        triton_ops.few_rows_linear(randn(gen, 2, 63, dtype=torch.float32), w, tile)
    with pytest.raises(KernelError, match="even row count"):
        triton_ops.few_rows_linear(
            randn(gen, 2, 64, dtype=torch.float32), w[:31], tile, swiglu=True
        )


@pytest.mark.skipif(HAS_CUDA, reason="the CPU side of the dispatch")
def test_cpu_calls_ignore_the_few_rows_tile(gen: torch.Generator) -> None:
    """A plan's tile is for CUDA calls: on the CPU ops.linear runs the reference."""
    x, w = randn(gen, 4, 64, dtype=torch.float32), randn(gen, 32, 64, dtype=torch.float32)
    plan = LinearPlan(few_rows=CONFIGS[0])
    assert torch.equal(ops.linear(x, w, plan=plan), reference.linear(x, w))


@gpu_test
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17])
def test_linear_dispatch_by_rows_and_graph_replays(gen: torch.Generator, rows: int) -> None:
    """ops.linear with a few-row tile: 2-16 rows run the kernel (bits as the kernel called
    directly), 1 and 17 rows cuBLAS (within BF16 of FP64). A graph of two split calls of one
    weight replayed several times gives the eager bits each time: the counters are reset by
    every kernel, in a graph too."""
    tile: FewRowsTile = (16, 128, 8, 4, 1)
    w = randn(gen, 2048, 2048, dtype=BF16)
    x = randn(gen, rows, 2048, dtype=BF16)
    plan = LinearPlan(few_rows=tile)
    prepare_counters(w, tile)
    out = ops.linear(x, w, plan=plan)
    assert_dot_products_close(out, x, w, f"ops.linear at {rows} rows")
    if 2 <= rows <= FEW_ROWS:
        assert torch.equal(out, triton_ops.few_rows_linear(x, w, tile))
        graph, (a, b) = capture(
            lambda: (ops.linear(x, w, plan=plan), ops.linear(2 * x, w, plan=plan))
        )
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize(DEVICE)
            assert torch.equal(a, out)
            assert torch.equal(b, triton_ops.few_rows_linear(2 * x, w, tile))


FEW_ROWS_MODULE = importlib.import_module("sv_kernels.triton_ops.few_rows")
TUNING_MODULE = importlib.import_module("sv_kernels.linear_tuning")


def test_few_row_tuner_keeps_its_choices_for_the_next_process(
    gen: torch.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timed once per shape, kept in the cache file beside the GEMV's entries; a later tuning
    reads it without timing; a kept choice that is no candidate (a hand edit) and `retune`
    are timed again; a winner's counters exist afterwards, so its calls can be captured."""
    timed: list[tuple[int, int]] = []
    winner: FewRowsTile = CONFIGS[1]

    def fake_timing(w: torch.Tensor) -> TunedShape:
        timed.append((w.shape[0], w.shape[1]))
        return TunedShape(winner, 1.0, 2.0)

    monkeypatch.setattr(TUNING_MODULE, "_time_few_rows_tiles", fake_timing)
    monkeypatch.setattr(FEW_ROWS_MODULE, "_COUNTERS", {})
    path = tmp_path / "tuning.json"
    weights = [randn(gen, 64, 32, dtype=BF16), randn(gen, 48, 32, dtype=BF16)]
    weights.append(weights[0].clone())  # a second matrix of the first shape: one timing
    first = TUNING_MODULE.tune_few_rows(weights, TuningCache(path), "test GPU")
    assert timed == [(64, 32), (48, 32)]
    assert [tile for tile, _ in first] == [winner] * 3
    assert first[0][1] == f"at 16 rows triton {winner}: 1.0 us (cuBLAS 2.0 us), measured"
    assert FEW_ROWS_MODULE._COUNTERS[weights[0].device].numel() >= 64 // winner[0]
    again = TUNING_MODULE.tune_few_rows(weights, TuningCache(path), "test GPU")
    assert timed == [(64, 32), (48, 32)], "kept shapes were timed again"
    assert all(summary.endswith("kept from the tuning cache") for _, summary in again)
    document = json.loads(path.read_text())
    entries = document["fingerprints"]["test GPU"]
    assert entries["64x32 torch.bfloat16, 16 rows"]["choice"] == list(winner)
    entries["64x32 torch.bfloat16, 16 rows"]["choice"] = [3, 3, 3, 3, 3]  # not a candidate
    path.write_text(json.dumps(document))
    TUNING_MODULE.tune_few_rows(weights, TuningCache(path), "test GPU")
    assert timed[2:] == [(64, 32)]
    TUNING_MODULE.tune_few_rows(weights, TuningCache(path, retune=True), "test GPU")
    assert timed[3:] == [(64, 32), (48, 32)]


def test_outgrown_counters_stay_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing the counters for a wider weight keeps the old buffer: graphs captured before
    hold its address."""
    monkeypatch.setattr(FEW_ROWS_MODULE, "_COUNTERS", {})
    monkeypatch.setattr(FEW_ROWS_MODULE, "_OUTGROWN", [])
    w = torch.zeros(16 * 2000, 8, device=DEVICE)
    small = FEW_ROWS_MODULE._counters(w.device, 10)
    prepare_counters(w, (16, 128, 4, 4, 1))
    grown = FEW_ROWS_MODULE._COUNTERS[w.device]
    assert grown.numel() >= 2000 and not torch.any(grown)
    outgrown = FEW_ROWS_MODULE._OUTGROWN
    assert len(outgrown) == 1 and outgrown[0] is small
