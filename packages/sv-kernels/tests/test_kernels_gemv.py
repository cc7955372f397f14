"""The Triton batch-1 GEMV against the reference linear, and the measured cuBLAS/Triton choice."""

from __future__ import annotations

import pytest
import torch
from kernels_testing import GPU, assert_close, gpu_test, randn
from sv_kernels import KernelError, ops, reference, triton_ops
from sv_kernels.triton_ops.gemv import CONFIGS

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
    assert_close(out, reference.linear(x, w), f"gemv {config}")


@gpu_test
def test_tuned_linear_dispatch_and_graph_capture(gen: torch.Generator) -> None:
    """After tuning, ops.linear on one row uses whatever won, gives the reference's result, and
    captures in a CUDA graph (no tuning or host sync inside the call)."""
    weights = [
        randn(gen, n, k, dtype=BF16) for n, k in ((3072, 2048), (2048, 8192), (128256, 2048))
    ]
    report = ops.tune_linear(weights)
    assert set(report) == {(3072, 2048), (2048, 8192), (128256, 2048)}
    x = randn(gen, 1, 2048, dtype=BF16)
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    ops.linear(static_x, weights[0])  # warm-up outside capture
    with torch.cuda.graph(graph):
        out = ops.linear(static_x, weights[0])
    static_x.copy_(randn(gen, 1, 2048, dtype=BF16))
    graph.replay()
    assert_close(out, reference.linear(static_x, weights[0]), "graphed linear")
    # more than one row always goes to cuBLAS
    two = randn(gen, 2, 2048, dtype=BF16)
    assert torch.equal(ops.linear(two, weights[0]), reference.linear(two, weights[0]))


# --- GEMV with a fused prologue: rms_norm (+ residual) or swiglu in front -----------------


@pytest.mark.parametrize("config", [CONFIGS[0], (4, 512, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize(
    ("n", "k"),
    [
        (5, 100),
        (37, 1500),  # K spans several BLOCK_K slices, the last one ragged
        pytest.param(3072, 2048, marks=GPU),  # qkv
        pytest.param(16384, 2048, marks=GPU),  # gate/up
    ],
)
def test_gemv_rms_norm_matches_norm_then_linear(
    gen: torch.Generator,
    config: tuple[int, int, int],
    dtype: torch.dtype,
    with_residual: bool,
    n: int,
    k: int,
) -> None:
    h = randn(gen, 1, k, dtype=dtype)
    residual = randn(gen, 1, k, dtype=dtype) if with_residual else None
    norm_w = randn(gen, k, dtype=dtype)
    w = randn(gen, n, k, dtype=dtype)
    y, s = triton_ops.gemv_rms_norm(h, norm_w, 1e-5, residual, w, config)
    ref_y, ref_s = reference.rms_norm_linear(h, norm_w, 1e-5, residual, w)
    assert torch.equal(s, ref_s), "the residual sum is one rounding of an FP32 add: exact"
    assert y.shape == (1, n) and y.dtype == dtype
    assert_close(y, ref_y, f"gemv_rms_norm {config}")


@pytest.mark.parametrize("config", [CONFIGS[0], (4, 512, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("n", "k"),
    [(5, 100), (37, 1500), pytest.param(2048, 8192, marks=GPU)],  # the last: down
)
def test_gemv_swiglu_matches_swiglu_then_linear(
    gen: torch.Generator, config: tuple[int, int, int], dtype: torch.dtype, n: int, k: int
) -> None:
    gate_up = randn(gen, 1, 2 * k, dtype=dtype) * 3  # reach well into silu's curved part
    w = randn(gen, n, k, dtype=dtype)
    y = triton_ops.gemv_swiglu(gate_up, w, config)
    assert y.shape == (1, n) and y.dtype == dtype
    assert_close(y, reference.swiglu_linear(gate_up, w), f"gemv_swiglu {config}")


def test_fused_linear_ops_check_their_arguments() -> None:
    x, norm_w, w = torch.zeros(1, 8), torch.zeros(8), torch.zeros(4, 8)
    with pytest.raises(KernelError, match=r"rms_norm_linear: weight has 6 along dim 1"):
        ops.rms_norm_linear(x, norm_w, 1e-5, None, torch.zeros(4, 6))
    with pytest.raises(KernelError, match=r"rms_norm_linear: residual \[1, 7\]"):
        ops.rms_norm_linear(x, norm_w, 1e-5, torch.zeros(1, 7), w)
    with pytest.raises(KernelError, match=r"swiglu_linear: gate_up must be a tensor \[..., 2I\]"):
        ops.swiglu_linear(torch.zeros(1, 7), w)
    with pytest.raises(KernelError, match=r"swiglu_linear: weight has 8 along dim 1"):
        ops.swiglu_linear(torch.zeros(1, 8), w)  # gate_up [1, 8] feeds K = 4 features


def test_fused_linear_ops_on_cpu_are_the_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    h, r, nw = (torch.randn(3, 16, generator=gen) for _ in range(3))
    nw = nw[0]
    w = torch.randn(5, 16, generator=gen)
    y, s = ops.rms_norm_linear(h, nw, 1e-5, r, w)
    ref_y, ref_s = reference.rms_norm_linear(h, nw, 1e-5, r, w)
    assert torch.equal(y, ref_y) and torch.equal(s, ref_s)
    # and the reference is the composition it claims to be
    normed, ref_s2 = reference.rms_norm(h, nw, 1e-5, r)
    assert torch.equal(ref_y, reference.linear(normed, w)) and torch.equal(ref_s2, s)
    gate_up = torch.randn(3, 32, generator=gen)
    assert torch.equal(ops.swiglu_linear(gate_up, w), reference.swiglu_linear(gate_up, w))


@gpu_test
def test_fused_batch1_ops_dispatch_and_capture(gen: torch.Generator) -> None:
    """After tuning, one-row rms_norm_linear / swiglu_linear take the fused kernels where the
    GEMV won, match the reference, and capture in a CUDA graph."""
    qkv, down = randn(gen, 3072, 2048, dtype=BF16), randn(gen, 2048, 8192, dtype=BF16)
    ops.tune_linear([qkv, down])
    h, r, nw = (
        randn(gen, 1, 2048, dtype=BF16),
        randn(gen, 1, 2048, dtype=BF16),
        randn(gen, 2048, dtype=BF16),
    )
    gate_up = randn(gen, 1, 16384, dtype=BF16)
    ops.rms_norm_linear(h, nw, 1e-5, r, qkv)  # warm-up outside capture
    ops.swiglu_linear(gate_up, down)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, s = ops.rms_norm_linear(h, nw, 1e-5, r, qkv)
        z = ops.swiglu_linear(gate_up, down)
    h.copy_(randn(gen, 1, 2048, dtype=BF16))
    gate_up.copy_(randn(gen, 1, 16384, dtype=BF16))
    graph.replay()
    ref_y, ref_s = reference.rms_norm_linear(h, nw, 1e-5, r, qkv)
    assert torch.equal(s, ref_s)
    assert_close(y, ref_y, "graphed rms_norm_linear")
    assert_close(z, reference.swiglu_linear(gate_up, down), "graphed swiglu_linear")
