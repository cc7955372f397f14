"""The Triton batch-1 GEMV against the reference linear, and the measured cuBLAS/Triton choice."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from kernels_testing import GPU, TOLERANCE, assert_close, gpu_test, randn
from sv_kernels import KernelError, ops, reference, triton_ops, tuning_cache
from sv_kernels.linear_plan import GemvTile, LinearPlan, TunedLinear
from sv_kernels.ops import linear_layers
from sv_kernels.triton_ops.gemv import CONFIGS
from sv_kernels.tuning_cache import TunedShape, TuningCache

BF16 = torch.bfloat16


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("n", "k"),
    [
        (1, 16),
        (37, 100),  # neither dim a multiple of any tile
        (64, 1024),
        pytest.param(3072, 2048, marks=GPU),  # Llama 3.2 1B qkv
        pytest.param(2048, 8192, marks=GPU),  # down
        pytest.param(16384, 2048, marks=GPU),  # gate/up
        pytest.param(128256, 2048, marks=GPU),  # LM head
    ],
)
def test_gemv_matches_linear(
    gen: torch.Generator, config: tuple[int, int, int], dtype: torch.dtype, n: int, k: int
) -> None:
    x = randn(gen, 1, k, dtype=dtype)
    w = randn(gen, n, k, dtype=dtype)
    out = triton_ops.gemv(x, w, config)
    assert out.shape == (1, n) and out.dtype == dtype
    assert not torch.isnan(out).any()
    assert_dot_products_close(out, x, w, f"gemv {config}")


def assert_dot_products_close(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, what: str
) -> None:
    """`out` = x @ w.T against an FP64 product, relative to sum |x| |w| per output: a dot
    product's rounding error scales with that, not with the result, which cancellation can make
    arbitrarily small (one output of 16 terms once measured 7e-5 "relative error" that way in
    FP32)."""
    exact = reference.linear(x.double(), w.double())
    scale = reference.linear(x.double().abs(), w.double().abs())
    err = float((out.double() - exact).norm() / scale.norm())
    assert err <= TOLERANCE[x.dtype], f"{what}: error {err:.3g} of sum |x||w|"


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("inter", "k"),
    [(1, 16), (37, 100), (64, 1024), pytest.param(8192, 2048, marks=GPU)],  # last: Llama 1B
)
def test_gemv_swiglu_epilogue_equals_the_two_ops(
    gen: torch.Generator, config: tuple[int, int, int], dtype: torch.dtype, inter: int, k: int
) -> None:
    """The fused epilogue computes the same dot products in the same order and rounds gate and
    up to the output dtype as the unfused path stores them: the same bits."""
    x = randn(gen, 1, k, dtype=dtype)
    gate_up = randn(gen, 2 * inter, k, dtype=dtype)
    fused = triton_ops.gemv(x, gate_up, config, swiglu=True)
    assert fused.shape == (1, inter) and fused.dtype == dtype
    gate_and_up = triton_ops.gemv(x, gate_up, config)
    unfused = triton_ops.swiglu(gate_and_up)
    assert torch.equal(fused, unfused), f"{config}: max diff {(fused - unfused).abs().max()}"
    # and against the references: the dot products scaled as dot products (one output of 16
    # terms can cancel to almost nothing), the epilogue element by element
    assert_dot_products_close(gate_and_up, x, gate_up, f"gemv {config} gate and up")
    assert_close(fused, reference.swiglu(gate_and_up), "swiglu epilogue")


@pytest.mark.parametrize("config", CONFIGS[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("n", "k"),
    [(37, 100), (64, 1024), pytest.param(1152, 896, marks=GPU)],  # last: Qwen2.5 qkv
)
def test_gemv_bias_epilogue(
    gen: torch.Generator, config: tuple[int, int, int], dtype: torch.dtype, n: int, k: int
) -> None:
    """x @ w.T + b against an FP64 oracle (the bias is exact there), and through ops.linear's
    one-row dispatch the same as the kernel called directly."""
    x = randn(gen, 1, k, dtype=dtype)
    w = randn(gen, n, k, dtype=dtype)
    bias = randn(gen, n, dtype=dtype)
    out = triton_ops.gemv(x, w, config, bias=bias)
    assert out.shape == (1, n) and out.dtype == dtype
    without = out - bias.double()  # in FP64, so the check is of the dot products alone
    assert_dot_products_close(without, x, w, f"gemv {config} with a bias")
    plan = LinearPlan(one_row_gemv=config)
    if x.is_cuda:
        assert torch.equal(ops.linear(x, w, plan=plan, bias=bias), out)
    else:  # ops sends CPU tensors to the reference whatever the plan
        want = torch.nn.functional.linear(x.double(), w.double(), bias.double())
        assert_close(ops.linear(x, w, plan=plan, bias=bias), want.to(dtype), "ops.linear bias")


def test_linear_rejects_a_bias_of_the_wrong_size(gen: torch.Generator) -> None:
    x, w = randn(gen, 2, 8, dtype=torch.float32), randn(gen, 5, 8, dtype=torch.float32)
    with pytest.raises(KernelError, match="bias has 4 along dim 0, expected 5"):
        ops.linear(x, w, bias=randn(gen, 4, dtype=torch.float32))


@pytest.mark.parametrize("config", CONFIGS[:3])
@pytest.mark.parametrize(("n", "k"), [(37, 100), pytest.param(128256, 2048, marks=GPU)])
def test_gemv_fp32_output_equals_converting_afterwards(
    gen: torch.Generator, config: tuple[int, int, int], n: int, k: int
) -> None:
    """The LM head's FP32 logits straight from the kernel: the bits of `gemv(...).float()`."""
    x = randn(gen, 1, k, dtype=BF16)
    w = randn(gen, n, k, dtype=BF16)
    direct = triton_ops.gemv(x, w, config, out_dtype=torch.float32)
    assert direct.dtype == torch.float32
    assert torch.equal(direct, triton_ops.gemv(x, w, config).float())
    x_cpu, w_cpu = x.cpu(), w.cpu()  # and the ops-level fallback (cuBLAS / CPU) converts after
    want = reference.linear(x_cpu, w_cpu).float()
    assert torch.equal(ops.linear(x_cpu, w_cpu, out_dtype=torch.float32), want)


@gpu_test
def test_linear_fp32_output_beyond_one_row_comes_from_the_accumulator(
    gen: torch.Generator,
) -> None:
    """Several rows (cuBLAS): FP32 logits straight from the GEMM, at least as close to the exact
    product as BF16 logits widened afterwards, and within FP32-accumulation error of it."""
    x = randn(gen, 5, 2048, dtype=BF16)
    w = randn(gen, 4096, 2048, dtype=BF16)
    got = ops.linear(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (5, 4096)
    exact = x.double() @ w.double().T
    widened = reference.linear(x, w).float()
    assert (got - exact).abs().max() <= (widened - exact).abs().max()
    assert torch.allclose(got.double(), exact, rtol=1e-4, atol=1e-3)


def test_gemv_swiglu_rejects_an_odd_row_count(gen: torch.Generator) -> None:
    x = randn(gen, 1, 16, dtype=torch.float32)
    with pytest.raises(KernelError, match="even row count"):
        triton_ops.gemv(x, randn(gen, 5, 16, dtype=torch.float32), swiglu=True)


@gpu_test
def test_tuned_linear_dispatch_and_graph_capture(gen: torch.Generator) -> None:
    """With its tuned plan, ops.linear on one row runs whatever won, gives the reference's
    result, and captures in a CUDA graph (no tuning or host sync inside the call); on two rows
    it runs the few-row tile the tuner chose, or cuBLAS."""
    weights = [
        randn(gen, n, k, dtype=BF16) for n, k in ((3072, 2048), (2048, 8192), (128256, 2048))
    ]
    tuned = ops.tune_linear(weights)
    assert len(tuned) == 3 and all(t.summary.endswith("measured") for t in tuned), tuned
    plan = tuned[0].plan
    x = randn(gen, 1, 2048, dtype=BF16)
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    ops.linear(static_x, weights[0], plan=plan)  # warm-up outside capture
    with torch.cuda.graph(graph):
        out = ops.linear(static_x, weights[0], plan=plan)
    static_x.copy_(randn(gen, 1, 2048, dtype=BF16))
    graph.replay()
    assert_close(out, reference.linear(static_x, weights[0]), "graphed linear")
    # two rows: the few-row kernel where the tuner chose it for this shape, else cuBLAS
    two = randn(gen, 2, 2048, dtype=BF16)
    got = ops.linear(two, weights[0], plan=plan)
    if plan.few_rows is not None:
        assert torch.equal(got, triton_ops.few_rows_linear(two, weights[0], plan.few_rows))
    else:
        assert torch.equal(got, reference.linear(two, weights[0]))
    assert_dot_products_close(got, two, weights[0], "two rows")


# The tuner and its timing.
TUNING_MODULE = importlib.import_module("sv_kernels.linear_tuning")


def _tune(
    weights: list[torch.Tensor],
    path: Path | None,
    retune: bool = False,
    heard: list[str] | None = None,
) -> list[TunedLinear]:
    progress = None if heard is None else heard.append
    cache = None if path is None else TuningCache(path, retune)
    return TUNING_MODULE.tune_gemv(weights, cache, progress)  # type: ignore[no-any-return]


def _fake_timing(
    monkeypatch: pytest.MonkeyPatch, winner: list[GemvTile | None]
) -> list[tuple[int, int]]:
    """Replace the tuner's timing (this runs on the CPU): cuBLAS 2 us, `winner[0]` 1 us.
    Returns the list of shapes timed, filled as the tuner times them."""
    timed: list[tuple[int, int]] = []

    def fake_timing(w: torch.Tensor) -> tuple[float, GemvTile | None, float]:
        timed.append((w.shape[0], w.shape[1]))
        return 0.002, winner[0], 0.001

    monkeypatch.setattr(TUNING_MODULE, "_time_candidates", fake_timing)
    monkeypatch.setattr(TUNING_MODULE, "tuning_fingerprint", lambda device: "test GPU")
    return timed


def test_tuner_keeps_its_choices_for_the_next_process(
    gen: torch.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the timing faked: a later tuning takes the kept choices and times nothing;
    retune=True times again and replaces them; a kept choice that is not one of this code's
    candidates is timed again."""
    winner: list[GemvTile | None] = [CONFIGS[1]]
    timed = _fake_timing(monkeypatch, winner)
    weights = [randn(gen, 48, 32, dtype=BF16), randn(gen, 32, 32, dtype=BF16)]
    weights.append(randn(gen, 48, 32, dtype=BF16))  # a shape seen twice is timed once
    path = tmp_path / "tuning.json"

    heard: list[str] = []
    first = _tune(weights, path, heard=heard)
    assert timed == [(48, 32), (32, 32)]
    assert heard == [f"timing the batch-1 GEMV tiles against cuBLAS (kept in {path})"]
    assert first[0].summary == f"triton gemv {CONFIGS[1]}: 1.0 us (cuBLAS 2.0 us), measured"
    assert first[0] == first[2] and len(first) == 3
    second = _tune(weights, path, heard=heard)
    assert len(timed) == 2, "kept shapes must not be timed again"
    assert len(heard) == 1, "nothing timed, nothing to announce"
    assert second[0].summary.endswith("kept from the tuning cache")
    assert second[0].plan == LinearPlan(one_row_gemv=CONFIGS[1])

    winner[0] = None  # cuBLAS wins the re-measurement
    third = _tune(weights, path, retune=True)
    assert len(timed) == 4 and third[0].plan == LinearPlan(one_row_gemv=None)
    kept = tuning_cache.load(path, "test GPU")
    assert {tuned.choice for tuned in kept.values()} == {None}

    tuning_cache.store(path, "test GPU", {"32x32 torch.bfloat16": TunedShape((3, 3, 3), 1, 1)})
    _tune(weights, path)
    assert timed[4:] == [(32, 32)], "a kept choice that is no candidate is measured again"


def test_two_tunings_in_one_process_keep_their_own_plans(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two owners of the same weight shape (two model runners) tuned in one process, to
    different winners: each gets its own plan, the second tuning times afresh instead of
    reusing the first's, and ops.linear with each plan runs that plan's kernel (the dispatch
    taken as on CUDA; the GEMV runs under the Triton interpreter) with the reference's result."""
    winner: list[GemvTile | None] = [CONFIGS[1]]
    timed = _fake_timing(monkeypatch, winner)
    w = randn(gen, 48, 32, dtype=torch.float32)
    plan_a = _tune([w], None)[0].plan
    winner[0] = None
    plan_b = _tune([w], None)[0].plan
    assert timed == [(48, 32), (48, 32)], "the second tuning must not see the first's result"
    assert plan_a == LinearPlan(one_row_gemv=CONFIGS[1]) and plan_b == LinearPlan()

    launched: list[GemvTile | None] = []
    gemv = triton_ops.gemv

    def recording_gemv(
        x: torch.Tensor, w: torch.Tensor, config: GemvTile | None = None, **kw: object
    ) -> torch.Tensor:
        launched.append(config)
        return gemv(x, w, config, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_ops, "gemv", recording_gemv)
    monkeypatch.setattr(linear_layers, "on_cuda", lambda t: True)
    x = randn(gen, 1, 32, dtype=torch.float32)
    for plan in (plan_a, plan_b, plan_a):
        assert_close(ops.linear(x, w, plan=plan), reference.linear(x, w), f"linear {plan}")
    assert launched == [CONFIGS[1], CONFIGS[1]], "plan b (cuBLAS) must not run the GEMV"
    gate_up = randn(gen, 64, 32, dtype=torch.float32)
    want = reference.swiglu(reference.linear(x, gate_up))
    assert_close(ops.linear_swiglu(x, gate_up, plan=plan_a), want, "fused swiglu")
    assert launched[-1] == CONFIGS[1]


@gpu_test
def test_real_tuning_is_kept_for_the_next_process(gen: torch.Generator, tmp_path: Path) -> None:
    """On the GPU: real timings, kept under this GPU's fingerprint, are taken as they are."""
    weights = [randn(gen, 3072, 2048, dtype=BF16), randn(gen, 2048, 2048, dtype=BF16)]
    path = tmp_path / "tuning.json"
    first = _tune(weights, path)
    assert all(t.summary.endswith("measured") for t in first), first

    def no_timing(w: torch.Tensor) -> None:
        raise AssertionError("a kept shape was timed again")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(TUNING_MODULE, "_time_candidates", no_timing)
        second = _tune(weights, path)
    assert [t.plan for t in second] == [t.plan for t in first]
    assert [t.summary.split(", ")[0] for t in second] == [t.summary.split(", ")[0] for t in first]
