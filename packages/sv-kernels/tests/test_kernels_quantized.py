"""Quantized weights (FP8 e4m3, int8; one scale per row) in every kernel `ops.linear` may run.

Oracles: hand-computed quantization of small matrices, and for every kernel the plain-torch
reference (dequantize, then matmul) in FP64: the batch-1 Triton GEMV (plain and with its SwiGLU
epilogue; the interpreter on the CPU, compiled on a GPU, where the Llama 3.2 1B shapes run
too), torch's int8 CPU kernel and the FP8 tensor-core path (`torch._scaled_mm`, which torch
also runs on the CPU).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
from pathlib import Path

import pytest
import torch
from kernels_testing import DEVICE, GPU, assert_close, gpu_test, randn
from sv_kernels import (
    KernelError,
    ops,
    quantized,
    quantized_ops,
    reference,
    triton_ops,
    tuning_cache,
)
from sv_kernels.linear_plan import FEW_ROWS, MANY_ROWS, W8A16_MAX_ROWS, LinearPlan, QuantizedPath
from sv_kernels.ops import linear_layers
from sv_kernels.quantized import (
    FP8_SCALE_STEPS,
    FP8Rows,
    QuantizedWeight,
    QuantKind,
    ScaledProduct,
    dequantize,
    quantize,
)
from sv_kernels.rope_tables import rope_tables
from sv_kernels.triton_ops.gemv import CONFIGS, QUANTIZED_CONFIGS
from sv_kernels.tuning_cache import TuningCache

KINDS: tuple[QuantKind, ...] = ("fp8", "int8")
BF16 = torch.bfloat16


def test_int8_quantization_by_hand() -> None:
    w = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [-254.0, 127.0, 1.0]])
    q = quantize(w, "int8")
    # Row scales: absmax / 127; an all-zero row gets 1.
    assert torch.equal(q.scale, torch.tensor([2.0 / 127, 1.0, 2.0]))
    assert torch.equal(
        q.data, torch.tensor([[64, -127, 32], [0, 0, 0], [-127, 64, 0]]).to(torch.int8)
    )
    assert q.data.dtype == torch.int8 and q.dtype == torch.float32
    assert dequantize(q)[2].tolist() == [-254.0, 128.0, 0.0]


def test_fp8_quantization_by_hand() -> None:
    w = torch.tensor([[448.0, -1.0, 0.1], [3.5, 0.0, 7.0]], dtype=torch.bfloat16)
    q = quantize(w, "fp8")
    assert q.data.dtype == torch.float8_e4m3fn and q.dtype == torch.bfloat16
    assert torch.equal(q.scale, torch.tensor([1.0, 7.0 / 448]))
    # e4m3 holds 448, -1, 3.5*64=224 and 448 exactly; 0.1 rounds to 0.1015625 (13/128).
    assert q.data.float().tolist() == [[448.0, -1.0, 0.1015625], [224.0, 0.0, 448.0]]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_dequantize_rounds_each_fp32_product_once(
    gen: torch.Generator, kind: QuantKind, dtype: torch.dtype
) -> None:
    """Oracle: each stored value times its row's scale, in FP64 (exact for these operands'
    products: 8 and 24 significant bits), rounded to FP32 as the product is, then to `dtype`."""
    w = randn(gen, 48, 80, dtype=torch.float32) * 3
    q = quantize(w, kind)
    exact = q.data.to(torch.float64) * q.scale.to(torch.float64)[:, None]
    want = exact.to(torch.float32).to(dtype)
    got = dequantize(q, dtype)
    assert got.dtype == dtype and got.device == q.data.device
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("n", "k"),
    [
        (3, 5),
        (37, 1500),  # rows past a tile's 4, columns past its 1024
        pytest.param(16384, 2048, marks=GPU),  # Llama 3.2 1B gate/up
        pytest.param(2048, 8192, marks=GPU),  # down
    ],
)
def test_dequantize_kernel_rounds_each_fp32_product_once(
    gen: torch.Generator, kind: QuantKind, dtype: torch.dtype, n: int, k: int
) -> None:
    """The same oracle for the Triton kernel (`quantized_ops.dequantize` on CUDA)."""
    q = quantize(randn(gen, n, k, dtype=torch.float32) * 3, kind)
    exact = q.data.to(torch.float64) * q.scale.to(torch.float64)[:, None]
    got = triton_ops.dequantize(q, dtype)
    assert got.dtype == dtype and got.device == q.data.device
    assert torch.equal(got, exact.to(torch.float32).to(dtype))


def test_dequantize_kernel_reads_strided_data_and_scales(gen: torch.Generator) -> None:
    q = quantize(randn(gen, 12, 300, dtype=torch.float32), "int8")
    data = torch.zeros(12, 400, dtype=torch.int8, device=q.data.device)
    data[:, 50:350] = q.data
    scale = torch.zeros(24, device=q.scale.device)
    scale[::2] = q.scale
    strided = QuantizedWeight(data[:, 50:350], scale[::2], q.kind, q.dtype)
    assert torch.equal(triton_ops.dequantize(strided), dequantize(q))


def test_fp8_scale_is_the_least_error_candidate(gen: torch.Generator) -> None:
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    w = randn(cpu, 64, 256, dtype=torch.float32)
    w[5] = 0.0
    q = quantize(w, "fp8")
    absmax = w.abs().amax(dim=1)
    # A candidate: absmax / 448 * 2 ** (j / STEPS), j in 0..STEPS-1 (the zero row keeps 1).
    steps = torch.log2(q.scale / (absmax / 448)) * FP8_SCALE_STEPS
    rows = absmax > 0
    assert torch.allclose(steps[rows], steps[rows].round(), atol=1e-3)
    assert bool(((steps[rows] > -1e-3) & (steps[rows] < FP8_SCALE_STEPS - 1 + 1e-3)).all())
    assert float(q.scale[5]) == 1.0 and not q.data[5].float().any()
    # Never worse than mapping absmax onto 448 (the plain scheme, by hand), row by row, and
    # better on the whole.
    plain_scale = torch.where(rows, absmax / 448, torch.ones_like(absmax))[:, None]
    plain = (w / plain_scale).to(torch.float8_e4m3fn).float() * plain_scale
    err_plain = (plain - w).square().sum(dim=1)
    err = (dequantize(q) - w).square().sum(dim=1)
    assert bool((err <= err_plain).all())
    assert float(err.sum()) < 0.95 * float(err_plain.sum())  # 0.84-0.88 measured


def test_fp8_search_bounds_its_temporaries_by_rows(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows are searched in chunks of _SEARCH_ELEMENTS values (here 2 rows, the last chunk
    # short): the matrix must come out as its rows quantized one by one.
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    w = randn(cpu, 5, 16, dtype=torch.float32)
    monkeypatch.setattr(quantized, "_SEARCH_ELEMENTS", 32)
    whole = quantize(w, "fp8")
    for row in range(5):
        alone = quantize(w[row : row + 1], "fp8")
        assert torch.equal(alone.scale, whole.scale[row : row + 1])
        assert torch.equal(
            alone.data.view(torch.uint8), whole.data[row : row + 1].view(torch.uint8)
        )


@pytest.mark.parametrize("kind", KINDS)
def test_quantization_error_is_small(gen: torch.Generator, kind: QuantKind) -> None:
    w = randn(gen, 64, 256, dtype=torch.float32)
    err = float((dequantize(quantize(w, kind)) - w).norm() / w.norm())
    # int8: uniform rounding of 1/127 of the row max; e4m3: 3 mantissa bits (~2.5% rms).
    assert err < {"int8": 0.01, "fp8": 0.04}[kind]


def assert_matches_dequantized(
    out: torch.Tensor, x: torch.Tensor, w: QuantizedWeight, tol: float, what: str
) -> None:
    """out against x @ dequantize(w)^T in FP64, relative to sum |x| |w| per output."""
    full = dequantize(w, torch.float64)
    exact = x.double() @ full.t()
    scale = x.double().abs() @ full.abs().t()
    err = float((out.double() - exact).norm() / scale.norm())
    assert err <= tol, f"{what}: error {err:.3g} of sum |x||w|"


GEMV_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("n", "k"),
    [
        (1, 16),
        (37, 100),
        (64, 1024),
        pytest.param(3072, 2048, marks=GPU),  # Llama 3.2 1B qkv
        pytest.param(2048, 8192, marks=GPU),  # down
        pytest.param(128256, 2048, marks=GPU),  # LM head
    ],
)
def test_gemv_dequantizes_in_registers(
    gen: torch.Generator, kind: QuantKind, dtype: torch.dtype, n: int, k: int
) -> None:
    x = randn(gen, 1, k, dtype=dtype)
    w = quantize(randn(gen, n, k, dtype=dtype, scale=0.05), kind)
    out = triton_ops.gemv(x, w.data, (2, 64 if k < 1024 else 1024, 4), scale=w.scale)
    assert out.shape == (1, n) and out.dtype == dtype
    assert_matches_dequantized(out, x, w, GEMV_TOL[dtype], f"gemv {kind}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("inter", "k"), [(19, 100), (64, 256), pytest.param(8192, 2048, marks=GPU)]
)
def test_gemv_swiglu_dequantizes(gen: torch.Generator, kind: QuantKind, inter: int, k: int) -> None:
    dtype = torch.bfloat16
    x = randn(gen, 1, k, dtype=dtype)
    w = quantize(randn(gen, 2 * inter, k, dtype=dtype, scale=0.05), kind)
    out = triton_ops.gemv(x, w.data, (4, 64, 4), swiglu=True, scale=w.scale)
    # Oracle: gate and up from the FP64 product, rounded to BF16 as the kernel stores them.
    gate_up = (x.double() @ dequantize(w, torch.float64).t()).to(dtype)
    expected = reference.swiglu(gate_up)
    err = float((out.double() - expected.double()).norm() / expected.double().norm())
    assert out.shape == (1, inter) and err < 2e-2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 5, 17])  # 17: past the int8 kernel's rows, the reference
def test_ops_linear_on_the_cpu_matches_the_reference(
    gen: torch.Generator, kind: QuantKind, rows: int
) -> None:
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    x = randn(cpu, rows, 96, dtype=torch.float32)
    w = quantize(randn(cpu, 40, 96, dtype=torch.float32, scale=0.05), kind)
    out = ops.linear(x, w)
    assert out.dtype == torch.float32 and out.shape == (rows, 40)
    # int8 runs torch's int8 kernel on BF16 activations: BF16's rounding; fp8 the reference.
    assert_matches_dequantized(out, x, w, 1e-2 if kind == "int8" else 1e-6, f"linear {kind}")
    logits = ops.linear(x, w, out_dtype=torch.float64)
    assert logits.dtype == torch.float64


def test_int8_cpu_kernel_is_skipped_where_it_would_crash(gen: torch.Generator) -> None:
    # torch._weight_int8pack_mm segfaults when K % 8 != 0 (torch 2.13): the reference runs.
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    x = randn(cpu, 2, 17, dtype=torch.float32)
    w = quantize(randn(cpu, 7, 17, dtype=torch.float32), "int8")
    assert_matches_dequantized(ops.linear(x, w), x, w, 1e-6, "int8, K = 17")


def test_scaled_mm_quantizes_activations_per_token(gen: torch.Generator) -> None:
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    x = randn(cpu, 8, 64, dtype=torch.bfloat16)
    x[3] *= 100  # one token far larger than the others: per-token scales keep the rest exact
    w = quantize(randn(cpu, 32, 64, dtype=torch.bfloat16, scale=0.05), "fp8")
    out = quantized_ops.scaled_mm(x, w)
    assert out.dtype == torch.bfloat16 and out.shape == (8, 32)
    # e4m3 activations: ~2.5% rms per element, so ~4% of sum |x||w| at most.
    for row in range(8):
        assert_matches_dequantized(out[row : row + 1], x[row : row + 1], w, 4e-2, f"row {row}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU)])
def test_scaled_mm_writes_fp32_unrounded(gen: torch.Generator, device: str) -> None:
    """FP32 out (the LM head's logits) comes from the FP32 accumulator, not rounded to BF16
    and widened: against the product of the same e4m3 activations in FP32, the error is far
    below BF16's rounding (up to 2^-8 of a value; ~2.7e-3 of the largest here when rounded)."""
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    x = randn(cpu, 256, 512, dtype=torch.bfloat16).to(device)
    w = quantize(randn(cpu, 1024, 512, dtype=torch.bfloat16, scale=0.05).to(device), "fp8")
    xq, x_scale = reference.quantize_rows_fp8(x)
    expected = (xq.float() * x_scale) @ dequantize(w, torch.float32).t()
    plan = LinearPlan(quantized_many_rows="scaled_mm")

    def product(out_dtype: torch.dtype | None) -> torch.Tensor:
        # On CUDA through `ops.linear`'s routing; on the CPU it would take the reference.
        if device == "cuda":
            return ops.linear(x, w, out_dtype=out_dtype, plan=plan)
        return quantized_ops.scaled_mm(x, w, out_dtype)

    for out_dtype, bound in ((torch.float32, 5e-4), (None, 1e-2)):
        out = product(out_dtype)
        assert out.dtype == (out_dtype or torch.bfloat16)
        error = ((out.float() - expected).abs().max() / expected.abs().max()).item()
        assert error < bound, f"out_dtype {out_dtype}: {error:.2e} of the largest"
    rounded = product(None).float()
    assert ((rounded - expected).abs().max() / expected.abs().max()).item() > 5e-4


@pytest.mark.parametrize("rows", [1, 7, pytest.param(256, marks=GPU)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_scaled_mm_tensorwise_rounds_the_scaled_product_once(
    gen: torch.Generator, rows: int, out_dtype: torch.dtype
) -> None:
    """Unit scales in the matmul, then both scale vectors: each output is the FP64 product of
    the same e4m3 activations and weights, times both scales, rounded once to out_dtype (up to
    the sums' own error). Dropping either scale, or applying one twice, fails by far."""
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    x = randn(cpu, rows, 512, dtype=torch.bfloat16).to(DEVICE)
    x[0] *= 50  # rows of different sizes: each keeps its own scale
    w = quantize(randn(cpu, 1024, 512, dtype=torch.bfloat16, scale=0.05).to(DEVICE), "fp8")
    xq, x_scale = reference.quantize_rows_fp8(x)
    exact = (xq.double() * x_scale.double()) @ dequantize(w, torch.float64).t()
    magnitude = (xq.double() * x_scale.double()).abs() @ dequantize(w, torch.float64).abs().t()
    half_step = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-24
    # The sums' own error: FP32 on the CPU; on CUDA the FP8 tensor cores keep about 14 bits
    # of a partial sum before cuBLAS adds it into FP32 (DeepSeek-V3's report measured this).
    summed = 2.0**-16 if DEVICE.type == "cpu" else 2.0**-12
    bound = half_step * exact.abs() + summed * magnitude + 1e-30
    if DEVICE.type == "cuda":  # through ops.linear's routing, as the decoder calls it
        path: QuantizedPath = "scaled_mm_tensorwise"
        plan = LinearPlan(quantized_few_rows=path, quantized_many_rows=path)
        out = ops.linear(x, w, out_dtype=out_dtype, plan=plan)
    else:
        out = quantized_ops.scaled_mm_tensorwise(x, w, out_dtype)
    assert out.dtype == out_dtype and out.shape == exact.shape
    excess = float(((out.double() - exact).abs() / bound).max())
    assert excess <= 1.0, f"{excess:.3g} times the bound"


@pytest.mark.parametrize(("rows", "n"), [(1, 5), (3, 1030), pytest.param(256, 16384, marks=GPU)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_scale_product_is_the_reference_bit_for_bit(
    gen: torch.Generator, rows: int, n: int, dtype: torch.dtype
) -> None:
    product = randn(gen, rows, n, dtype=torch.float32, scale=1000.0)
    row_scale = torch.rand(rows, 1, generator=gen, device=DEVICE) / 448
    col_scale = torch.rand(n, generator=gen, device=DEVICE) / 448
    out = triton_ops.scale_product(product, row_scale, col_scale, dtype)
    want = reference.scale_product(product, row_scale, col_scale, dtype)
    assert out.dtype == dtype and torch.equal(out, want)
    # and the reference is what it says, on numbers worked by hand
    hand = reference.scale_product(
        torch.tensor([[3.0, -5.0], [7.0, 1.0]]),
        torch.tensor([[0.5], [2.0]]),
        torch.tensor([2.0, 0.25]),
        torch.float32,
    )
    assert hand.tolist() == [[3.0, -0.625], [28.0, 0.5]]


def test_scaled_mm_tensorwise_is_not_first_run_inside_a_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its unit scale is made on first use; made inside a CUDA graph capture, it would hold 1.0
    only once the graph ran, so that first use refuses by name instead."""
    monkeypatch.setattr(quantized_ops, "_UNIT_SCALES", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(KernelError, match="inside a CUDA graph capture"):
        quantized_ops._unit_scale(torch.device("cuda", 0))


def test_ops_linear_swiglu_and_embedding_take_quantized_weights(gen: torch.Generator) -> None:
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    x = randn(cpu, 3, 32, dtype=torch.float32)
    w = quantize(randn(cpu, 24, 32, dtype=torch.float32), "fp8")
    expected = reference.swiglu(x @ dequantize(w).t())
    assert torch.allclose(ops.linear_swiglu(x, w), expected, rtol=1e-5, atol=1e-5)
    ids = torch.tensor([3, 0, 23, 3])
    assert torch.equal(ops.embedding(ids, w), dequantize(w)[ids])


def test_ops_linear_rejects_bad_quantized_weights() -> None:
    x = torch.randn(2, 16)
    good = quantize(torch.randn(8, 16), "int8")
    cases = {
        "scale must be [N] = [8]": QuantizedWeight(
            good.data, good.scale[:4], "int8", torch.float32
        ),
        "int8 data must be torch.int8": QuantizedWeight(
            good.data.float(), good.scale, "int8", torch.float32
        ),
        "scale must be float32": QuantizedWeight(
            good.data, good.scale.double(), "int8", torch.float32
        ),
        "stands for torch.bfloat16": QuantizedWeight(good.data, good.scale, "int8", torch.bfloat16),
    }
    for message, weight in cases.items():
        with pytest.raises(KernelError, match=re.escape(message)):
            ops.linear(x, weight)
    with pytest.raises(KernelError, match="x has 15 features"):
        ops.linear(torch.randn(2, 15), good)


@gpu_test
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "k"), [(3072, 2048), (16384, 2048), (2048, 8192)])
def test_ops_linear_many_rows_on_the_gpu(
    gen: torch.Generator, kind: QuantKind, n: int, k: int
) -> None:
    x = randn(gen, 256, k, dtype=torch.bfloat16)
    w = quantize(randn(gen, n, k, dtype=torch.bfloat16, scale=0.02), kind)
    assert_matches_dequantized(ops.linear(x, w), x, w, 1e-2, f"{kind} dequantize + cuBLAS")
    # FP32 out: cuBLAS's FP32 sums of x and the BF16-dequantized weight, not rounded to BF16.
    out = ops.linear(x, w, out_dtype=torch.float32)
    expected = x.float() @ dequantize(w, x.dtype).float().t()
    assert out.dtype == torch.float32
    assert ((out - expected).abs().max() / expected.abs().max()).item() < 1e-4
    if kind == "fp8" and torch.cuda.get_device_capability() >= (8, 9):
        for path in ("scaled_mm", "scaled_mm_tensorwise"):
            out = ops.linear(x, w, plan=LinearPlan(quantized_many_rows=path))
            assert_matches_dequantized(out, x, w, 4e-2, f"fp8 {path}")
    out = ops.linear(x, w, plan=LinearPlan(quantized_many_rows="w8a16"))
    assert_matches_dequantized(out, x, w, 1e-2, f"{kind} w8a16")


def test_cuda_path_is_the_plans_path_for_the_row_band_where_that_path_fits() -> None:
    """The routing of a quantized CUDA call no GEMV tile takes, against a table written out
    by hand (the GPU test below checks that each path runs its own kernel)."""

    def weight(rows: int, storage: torch.dtype, kind: QuantKind) -> QuantizedWeight:
        return QuantizedWeight(torch.zeros(rows, 48, dtype=storage), torch.ones(rows), kind, BF16)

    fp8 = weight(32, torch.float8_e4m3fn, "fp8")
    int8 = weight(32, torch.int8, "int8")
    odd = weight(24, torch.float8_e4m3fn, "fp8")  # 24 rows: not a multiple of 16
    big = MANY_ROWS
    tw = "scaled_mm_tensorwise"
    cases: list[
        tuple[QuantizedWeight, QuantizedPath, QuantizedPath, QuantizedPath, int, torch.dtype, str]
    ] = [
        (fp8, "w8a16", "scaled_mm", tw, 1, BF16, "w8a16"),
        (fp8, "w8a16", "scaled_mm", tw, FEW_ROWS, BF16, "w8a16"),
        (fp8, "w8a16", "scaled_mm", tw, FEW_ROWS + 1, BF16, "scaled_mm"),
        (fp8, "w8a16", "scaled_mm", tw, big, BF16, "scaled_mm"),
        (fp8, "w8a16", "scaled_mm", tw, big + 1, BF16, tw),  # the prompt rows' band
        (fp8, "w8a16", tw, "scaled_mm", 5000, BF16, "scaled_mm"),
        (fp8, "scaled_mm", "w8a16", "w8a16", FEW_ROWS, BF16, "scaled_mm"),
        (fp8, "scaled_mm", "w8a16", "w8a16", big, BF16, "w8a16"),
        (fp8, "scaled_mm", "w8a16", "w8a16", big + 1, BF16, "cublas"),  # w8a16 stops at big
        (fp8, "cublas", "w8a16", "cublas", 2, BF16, "cublas"),
        (fp8, "w8a16", "cublas", "cublas", 2, torch.float16, "w8a16"),
        (fp8, "w8a16", "w8a16", "cublas", 2, torch.float32, "cublas"),  # 16-bit x only
        (int8, "scaled_mm", "scaled_mm", "scaled_mm", 2, BF16, "cublas"),  # FP8 tensor cores
        (int8, "w8a16", "w8a16", "scaled_mm", 300, BF16, "cublas"),  # are fp8's only
        (odd, "scaled_mm", "scaled_mm", "cublas", 2, BF16, "cublas"),  # nor shapes it refuses
        (fp8, "w8a16", tw, "cublas", big, BF16, tw),
        (int8, tw, "w8a16", "cublas", 2, BF16, "cublas"),
        (odd, "w8a16", tw, "cublas", big, BF16, "cublas"),
        (int8, "w8a16", "w8a16", "cublas", 100, BF16, "w8a16"),
    ]
    for w, few, many, prompt, rows, dtype, want in cases:
        plan = LinearPlan(
            quantized_few_rows=few, quantized_many_rows=many, quantized_prompt_rows=prompt
        )
        x = torch.zeros(rows, 48, dtype=dtype)
        got = quantized_ops.cuda_path(x, w, plan)
        where = f"plan ({few}, {many}, {prompt}), {rows} {dtype}"
        assert got == want, f"{w.kind} {list(w.shape)}, {where}"


@gpu_test
@pytest.mark.parametrize("kind", KINDS)
def test_quantized_calls_take_their_path_by_rows_and_plan(
    gen: torch.Generator, kind: QuantKind
) -> None:
    """Up to FEW_ROWS rows (one row too, with no GEMV tile) the plan's few-row path, up to
    MANY_ROWS its many-row path, above that its prompt-row path, except that w8a16 gives way
    to dequantize + cuBLAS past W8A16_MAX_ROWS. Each call's output must be bit for bit the
    expected path's own, for every pair of paths (the prompt band's path the few-row one's)."""
    w = quantize(randn(gen, 3072, 2048, dtype=torch.bfloat16, scale=0.02), kind)
    x = randn(gen, MANY_ROWS + 1, 2048, dtype=torch.bfloat16)
    paths = {
        "w8a16": lambda x: triton_ops.w8a16_matmul(x, w.data, w.scale),
        "scaled_mm": lambda x: quantized_ops.scaled_mm(x, w),
        "scaled_mm_tensorwise": lambda x: quantized_ops.scaled_mm_tensorwise(x, w),
        "cublas": lambda x: torch.nn.functional.linear(x, dequantize(w, x.dtype)),
    }
    names: list[QuantizedPath] = ["cublas", "w8a16"]
    if kind == "fp8" and torch.cuda.get_device_capability() >= (8, 9):
        names += ["scaled_mm", "scaled_mm_tensorwise"]
    for few, many in itertools.product(names, names):
        plan = LinearPlan(
            quantized_few_rows=few, quantized_many_rows=many, quantized_prompt_rows=few
        )
        for rows in (1, FEW_ROWS, FEW_ROWS + 1, MANY_ROWS, len(x)):
            path = few if rows <= FEW_ROWS or rows > MANY_ROWS else many
            if path == "w8a16" and rows > W8A16_MAX_ROWS:
                path = "cublas"
            out = ops.linear(x[:rows], w, plan=plan)
            assert torch.equal(out, paths[path](x[:rows])), f"plan {plan}, {rows} rows"


@gpu_test
@pytest.mark.parametrize("kind", KINDS)
def test_tuner_plans_quantized_weights(kind: QuantKind) -> None:
    w = quantize(torch.randn(3072, 2048, device=DEVICE, dtype=torch.bfloat16), kind)
    (tuned,) = ops.tune_linear([w])
    paths = ("cublas", "w8a16") + (("scaled_mm", "scaled_mm_tensorwise") if kind == "fp8" else ())
    assert tuned.plan.quantized_few_rows in paths, tuned.summary
    assert tuned.plan.quantized_many_rows in paths, tuned.summary
    assert tuned.plan.quantized_prompt_rows in paths[:1] + paths[2:], tuned.summary
    for rows in (1, 16, 256, 700):
        x = torch.randn(rows, 2048, device=DEVICE, dtype=torch.bfloat16)
        out = ops.linear(x, w, plan=tuned.plan)
        assert_matches_dequantized(out, x, w, 1e-2, f"tuned plan, {rows} rows")


# --- the 1-byte GEMV's own tiles (QUANTIZED_CONFIGS) --------------------------------------


def _odd_shapes(tile: tuple[int, int, int]) -> list[tuple[int, int]]:
    """An odd row count with K below one slice, and with K past the two slices loaded up front
    and not a multiple of the slice (the loop runs, its last slice partly masked)."""
    return [(37, 100), (5, 2 * tile[1] + 37)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tile", QUANTIZED_CONFIGS)
def test_every_quantized_tile_matches_the_dequantized_reference(
    gen: torch.Generator, kind: QuantKind, tile: tuple[int, int, int]
) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for n, k in _odd_shapes(tile):
            x = randn(gen, 1, k, dtype=dtype)
            w = quantize(randn(gen, n, k, dtype=dtype, scale=0.05), kind)
            out = triton_ops.gemv(x, w.data, tile, scale=w.scale)
            assert out.shape == (1, n) and out.dtype == dtype
            assert_matches_dequantized(out, x, w, GEMV_TOL[dtype], f"{kind} {tile} {n}x{k}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tile", QUANTIZED_CONFIGS)
def test_every_quantized_tile_swiglu_and_bias_epilogues(
    gen: torch.Generator, kind: QuantKind, tile: tuple[int, int, int]
) -> None:
    """The SwiGLU epilogue gives the bits of the plain GEMV then SwiGLU (and the FP64 oracle's
    values); a bias is added to the scaled dot products."""
    dtype = torch.bfloat16
    n, k = _odd_shapes(tile)[1]
    inter = n + 14  # 19 features: odd, and not a multiple of any tile's half
    x = randn(gen, 1, k, dtype=dtype)
    gate_up = quantize(randn(gen, 2 * inter, k, dtype=dtype, scale=0.05), kind)
    fused = triton_ops.gemv(x, gate_up.data, tile, swiglu=True, scale=gate_up.scale)
    plain = triton_ops.gemv(x, gate_up.data, tile, scale=gate_up.scale)
    assert torch.equal(fused, triton_ops.swiglu(plain)), f"{kind} {tile}: fused != unfused"
    assert_matches_dequantized(plain, x, gate_up, GEMV_TOL[dtype], f"{kind} {tile} gate_up")
    w = quantize(randn(gen, n, k, dtype=dtype, scale=0.05), kind)
    bias = randn(gen, n, dtype=dtype)
    with_bias = triton_ops.gemv(x, w.data, tile, bias=bias, scale=w.scale)
    assert_matches_dequantized(with_bias - bias.double(), x, w, GEMV_TOL[dtype], "bias")


def _every_value(kind: QuantKind) -> torch.Tensor:
    """All 256 int8 values, or the 254 finite e4m3 ones, as 32 rows of 8 (e4m3 pads with 0)."""
    if kind == "int8":
        return torch.arange(-128, 128, dtype=torch.int8).reshape(32, 8)
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = values[~values.float().isnan()]
    return torch.cat([finite, torch.zeros(2, dtype=torch.float8_e4m3fn)]).reshape(32, 8)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("tile", [QUANTIZED_CONFIGS[0], QUANTIZED_CONFIGS[-1], CONFIGS[0]])
def test_every_weight_value_converts_exactly(
    gen: torch.Generator, kind: QuantKind, dtype: torch.dtype, tile: tuple[int, int, int]
) -> None:
    """Each weight value's conversion (int8 through float bit patterns, e4m3 through the FP16
    pairs of BF16 activations): with x a one-hot row picking column j, output n is
    data[n, j] * scale[n] exactly (one product), rounded once to x's dtype."""
    values = _every_value(kind)
    scale = torch.rand(32, generator=torch.Generator().manual_seed(gen.initial_seed())) + 0.5
    w = QuantizedWeight(values.to(DEVICE), scale.to(DEVICE), kind, dtype)
    for j in range(8):
        x = torch.zeros(1, 8, dtype=dtype, device=DEVICE)
        x[0, j] = 1.0
        out = triton_ops.gemv(x, w.data, tile, scale=w.scale)
        expected = (values[:, j].float().to(DEVICE) * w.scale).to(dtype)
        assert torch.equal(out[0], expected), f"{kind} {dtype} column {j}"


@pytest.mark.parametrize("kind", KINDS)
def test_large_bf16_activations_stay_finite(gen: torch.Generator, kind: QuantKind) -> None:
    """BF16 activations meet 1-byte weights in FP16, scaled by 2^-8: four products of the
    largest weight and 2^13 summed in one FP16 lane (4 * 448 * 2^13 * 2^-8 = 57,344) stay
    finite and exact; unscaled they would pass FP16's 65,504."""
    biggest = 448.0 if kind == "fp8" else 127.0
    data = torch.full((4, 64), biggest).to(torch.float8_e4m3fn if kind == "fp8" else torch.int8)
    w = QuantizedWeight(data.to(DEVICE), torch.ones(4, device=DEVICE), kind, BF16)
    x = torch.zeros(1, 64, dtype=BF16, device=DEVICE)
    x[0, 0:8:2] = 2.0**13  # four even columns of one 8-column group: one FP16 lane's chain
    out = triton_ops.gemv(x, w.data, QUANTIZED_CONFIGS[0], scale=w.scale, out_dtype=torch.float32)
    assert torch.equal(out, torch.full_like(out, 4 * biggest * 2.0**13))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tile", QUANTIZED_CONFIGS)
@pytest.mark.parametrize(
    ("n", "k"),
    [
        pytest.param(3072, 2048, marks=GPU),  # Llama 3.2 1B qkv
        pytest.param(2048, 2048, marks=GPU),  # o
        pytest.param(16384, 2048, marks=GPU),  # gate/up
        pytest.param(2048, 8192, marks=GPU),  # down
        pytest.param(128256, 2048, marks=GPU),  # LM head
    ],
)
def test_quantized_tiles_at_llama_shapes(
    gen: torch.Generator, kind: QuantKind, tile: tuple[int, int, int], n: int, k: int
) -> None:
    x = randn(gen, 1, k, dtype=torch.bfloat16)
    w = quantize(randn(gen, n, k, dtype=torch.bfloat16, scale=0.02), kind)
    out = triton_ops.gemv(x, w.data, tile, scale=w.scale, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_matches_dequantized(out, x, w, 1e-2, f"{kind} {tile} {n}x{k}")
    if n == 16384:  # the gate/up matrix: its fused SwiGLU, the bits of the two ops
        fused = triton_ops.gemv(x, w.data, tile, swiglu=True, scale=w.scale)
        plain = triton_ops.gemv(x, w.data, tile, scale=w.scale)
        assert torch.equal(fused, triton_ops.swiglu(plain))


GEMV_MODULE = importlib.import_module("sv_kernels.triton_ops.gemv")
TUNING_MODULE = importlib.import_module("sv_kernels.linear_tuning")


def test_tuner_times_the_quantized_tiles_for_quantized_weights(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the graph timing faked (this runs on the CPU): a quantized weight is timed on
    QUANTIZED_CONFIGS, a BF16 one on CONFIGS, each gets its list's fastest tile, and every
    timed call computes the reference's product (the timed closures really run the tile)."""
    fake_ms = {tile: 1.0 + i for i, tile in enumerate(reversed(QUANTIZED_CONFIGS))}
    fake_ms.update({tile: 1.5 + i for i, tile in enumerate(CONFIGS)})
    timed: list[tuple[int, int, int] | None] = []

    def fake_graph_ms(calls: list[functools.partial[torch.Tensor]], count: int) -> float:
        call = calls[0]
        tile = call.args[2] if len(call.args) == 3 else None
        timed.append(tile)
        x, w = call.args[0], call.args[1]
        want = reference.linear(x, w)
        assert_close(call(), want, f"timed call {tile}", tol=1e-2)
        return 10.0 if tile is None else fake_ms[tile]

    monkeypatch.setattr(TUNING_MODULE, "graph_ms_per_call", fake_graph_ms)
    monkeypatch.setattr(TUNING_MODULE, "copies_to_overflow_l2", lambda w: [w])
    monkeypatch.setattr(TUNING_MODULE, "tuning_fingerprint", lambda device: "test GPU")
    monkeypatch.setattr(TUNING_MODULE, "_fp8_tensor_cores", lambda device: False)
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    plain = randn(cpu, 24, 40, dtype=torch.float32)
    quantized = quantize(plain, "int8")
    tuned = TUNING_MODULE.tune_gemv([quantized, plain])
    assert timed == [None, *QUANTIZED_CONFIGS, None, *CONFIGS]
    assert tuned[0].plan.one_row_gemv == QUANTIZED_CONFIGS[-1]  # 1.0 ms, the fastest
    assert tuned[1].plan.one_row_gemv == CONFIGS[0]
    assert GEMV_MODULE.candidates(quantized) == QUANTIZED_CONFIGS


def test_tuner_plans_a_path_per_row_band_and_keeps_them(
    gen: torch.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the graph timing faked (this runs on the CPU): an FP8 weight's paths are timed at
    FEW_ROWS, MANY_ROWS and PROMPT_ROWS rows (w8a16, which takes at most W8A16_MAX_ROWS rows,
    not at PROMPT_ROWS), each band's fastest goes into the plan, a later tuning takes them all
    from the cache, and a cache that lacks one band's choice (written before that band was
    tuned) has that band's paths timed and nothing else."""
    few, many, prompt = FEW_ROWS, MANY_ROWS, TUNING_MODULE.PROMPT_ROWS
    assert many == W8A16_MAX_ROWS < prompt
    fake_ms = {
        (few, "w8a16"): 1.0,
        (few, "scaled_mm"): 2.0,
        (many, "scaled_mm"): 1.0,
        (many, "scaled_mm_tensorwise"): 0.5,
        (many, "w8a16"): 2.0,
        (prompt, "scaled_mm"): 1.0,
        (prompt, "scaled_mm_tensorwise"): 2.0,
    }
    path_of = {call: path for path, call in quantized_ops.PATH_CALLS.items()}
    timed: list[tuple[int, str]] = []

    def fake_graph_ms(calls: list[functools.partial[torch.Tensor]], count: int) -> float:
        call = calls[0]
        rows, path = call.args[0].shape[0], path_of.get(call.func, "gemv tile")
        timed.append((rows, path))
        return fake_ms.get((rows, path), 3.0)  # 3.0: dequantize + cuBLAS, every GEMV tile

    monkeypatch.setattr(TUNING_MODULE, "graph_ms_per_call", fake_graph_ms)
    monkeypatch.setattr(TUNING_MODULE, "copies_to_overflow_l2", lambda w: [w])
    monkeypatch.setattr(TUNING_MODULE, "tuning_fingerprint", lambda device: "test GPU")
    monkeypatch.setattr(TUNING_MODULE, "_fp8_tensor_cores", lambda device: True)
    cpu = torch.Generator().manual_seed(gen.initial_seed())
    w = quantize(randn(cpu, 32, 48, dtype=torch.bfloat16), "fp8")
    cache = TuningCache(tmp_path / "tuning.json")

    (tuned,) = TUNING_MODULE.tune_gemv([w], cache)
    want = LinearPlan(
        quantized_few_rows="w8a16",
        quantized_many_rows="scaled_mm_tensorwise",
        quantized_prompt_rows="scaled_mm",
    )
    assert tuned.plan == want, tuned.summary
    bands = [(rows, path) for rows, path in timed if rows > 1]
    paths = ("cublas", "scaled_mm", "scaled_mm_tensorwise", "w8a16")
    expected = [(rows, path) for rows in (few, many) for path in paths]
    assert bands == expected + [(prompt, path) for path in paths[:3]]
    assert f"at {few} rows w8a16: 1000.0 us (dequantize + cuBLAS 3000.0 us)" in tuned.summary
    assert f"at {prompt} rows scaled_mm: 1000.0 us" in tuned.summary

    timed.clear()
    assert TUNING_MODULE.tune_gemv([w], cache)[0].plan == want
    assert timed == [], "kept choices must not be timed again"

    kept = tuning_cache.load(cache.path, "test GPU")
    few_key = next(key for key in kept if key.endswith(f", {few} rows"))
    del kept[few_key]
    cache.path.unlink()
    tuning_cache.store(cache.path, "test GPU", kept)
    assert TUNING_MODULE.tune_gemv([w], cache)[0].plan == want
    assert timed == [(few, path) for path in paths]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tokens", "vocab", "hidden"),
    [(1, 50, 96), (13, 300, 40), pytest.param(256, 128256, 2048, marks=GPU)],
)
def test_embedding_gathers_and_dequantizes_in_one_kernel(
    gen: torch.Generator, kind: QuantKind, dtype: torch.dtype, tokens: int, vocab: int, hidden: int
) -> None:
    """A quantized tied LM head's rows, gathered by the Triton kernel: the bits of the
    reference (`dequantize_rows`: value times row scale in FP32, rounded to the weight's dtype)."""
    w = quantize(randn(gen, vocab, hidden, dtype=dtype), kind)
    ids = torch.randint(0, vocab, (tokens,), device=DEVICE)
    ids[0] = vocab - 1  # the last row
    out = triton_ops.embedding(ids.to(torch.int32), w)
    assert out.dtype == dtype
    assert torch.equal(out, reference.embedding(ids, w))
    assert torch.equal(out.double(), dequantize(w, torch.float64)[ids.long()].to(dtype).double())


def test_ops_embedding_sends_a_quantized_matrix_on_cuda_to_the_kernel(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatch taken as on CUDA (the kernel runs under the interpreter here)."""
    launched: list[object] = []
    kernel = triton_ops.embedding

    def recording(ids: torch.Tensor, weight: object) -> torch.Tensor:
        launched.append(weight)
        return kernel(ids, weight)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_ops, "embedding", recording)
    monkeypatch.setattr(linear_layers, "on_cuda", lambda t: True)
    w = quantize(randn(gen, 40, 24, dtype=torch.float32), "int8")
    ids = torch.tensor([3, 0, 39, 3], device=DEVICE)
    assert torch.equal(ops.embedding(ids, w), reference.embedding(ids, w))
    assert launched == [w]


def _quantize_rows_case(x: torch.Tensor) -> None:
    values, scale = triton_ops.quantize_rows_fp8(x)
    want_values, want_scale = reference.quantize_rows_fp8(x)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (x.shape[0], 1)
    assert torch.equal(scale, want_scale)
    assert torch.equal(values.view(torch.uint8), want_values.view(torch.uint8))


@pytest.mark.parametrize(("rows", "k"), [(1, 17), (3, 64), (5, 300)])
def test_quantize_rows_fp8_is_the_reference_bit_for_bit(
    gen: torch.Generator, rows: int, k: int
) -> None:
    x = randn(gen, rows, k, dtype=torch.bfloat16)
    x[0] *= 1000  # rows of very different sizes, each with its own scale
    if rows > 1:
        x[1] = 0  # an all-zero row: the smallest scale, all values zero
    _quantize_rows_case(x)


@gpu_test
@pytest.mark.parametrize(("rows", "k"), [(1, 2048), (256, 2048), (256, 8192), (7, 14336)])
def test_quantize_rows_fp8_serving_shapes(gen: torch.Generator, rows: int, k: int) -> None:
    _quantize_rows_case(randn(gen, rows, k, dtype=torch.bfloat16))


def test_takes_fp8_rows_where_the_call_runs_on_the_fp8_tensor_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against a table written out by hand: FP8 rows for a quantized CUDA weight whose call
    takes scaled_mm or scaled_mm_tensorwise (not one row with a GEMV tile, not a band whose
    path is w8a16 or dequantize + cuBLAS, not int8, not a plain weight)."""
    monkeypatch.setattr(linear_layers, "on_cuda", lambda t: True)

    def weight(kind: QuantKind) -> QuantizedWeight:
        storage = torch.float8_e4m3fn if kind == "fp8" else torch.int8
        return QuantizedWeight(torch.zeros(32, 48, dtype=storage), torch.ones(32), kind, BF16)

    fp8, int8 = weight("fp8"), weight("int8")
    tw: QuantizedPath = "scaled_mm_tensorwise"
    plan = LinearPlan(
        one_row_gemv=(4, 1024, 4),
        quantized_few_rows="w8a16",
        quantized_many_rows=tw,
        quantized_prompt_rows="scaled_mm",
    )
    no_tile = LinearPlan(quantized_few_rows=tw)
    cases = [
        (fp8, plan, 1, False),  # the GEMV
        (fp8, no_tile, 1, True),
        (fp8, plan, FEW_ROWS, False),  # w8a16
        (fp8, plan, FEW_ROWS + 1, True),
        (fp8, plan, MANY_ROWS, True),
        (fp8, plan, 5000, True),
        (fp8, LinearPlan(quantized_many_rows="cublas"), 100, False),
        (int8, plan, 100, False),
    ]
    for w, p, rows, want in cases:
        assert ops.takes_fp8_rows(w, p, rows, BF16) is want, (w.kind, p, rows)
    assert not ops.takes_fp8_rows(torch.zeros(32, 48, dtype=BF16), plan, 100, BF16)
    monkeypatch.undo()
    assert not ops.takes_fp8_rows(fp8, plan, 100, BF16), "a CPU weight: the reference"


def test_fp8_rows_where_no_fp8_path_runs_raise(gen: torch.Generator) -> None:
    """The CPU norm's FP8 rows are the reference quantization of its output; a call that
    would not multiply them on the FP8 tensor cores names what is wrong."""
    x = randn(gen, 4, 48, dtype=torch.float32)
    norm = randn(gen, 48, dtype=torch.float32)
    rows, _ = ops.rms_norm(x, norm, 1e-5, fp8_rows=True)
    out, _ = ops.rms_norm(x, norm, 1e-5)
    values, scale = reference.quantize_rows_fp8(out)
    assert isinstance(rows, FP8Rows) and torch.equal(rows.scale, scale)
    assert torch.equal(rows.values.view(torch.uint8), values.view(torch.uint8))
    w = quantize(randn(gen, 32, 48, dtype=torch.float32), "fp8")
    with pytest.raises(KernelError, match="FP8 tensor-core path; this call's is the CPU"):
        ops.linear(rows, w)
    with pytest.raises(KernelError, match="FP8 rows are an FP8 matmul's input"):
        ops.linear(rows, randn(gen, 32, 48, dtype=torch.float32))
    bad = FP8Rows(rows.values, rows.scale[:2], rows.dtype)
    with pytest.raises(KernelError, match=r"scale must be \[T, 1\] = \[4, 1\]"):
        ops.linear(bad, w)
    with pytest.raises(KernelError, match="FP8 rows need x"):
        ops.rms_norm(x[None], norm, 1e-5, fp8_rows=True)
    product = randn(gen, 4, 48, dtype=torch.float32)
    scaled = ScaledProduct(product, torch.full((4, 1), 0.5), torch.full((48,), 0.25), x.dtype)
    out, s = ops.rms_norm(scaled, norm, 1e-5, x)
    want = ops.rms_norm(
        reference.scale_product(product, scaled.row_scale, scaled.col_scale, x.dtype), norm, 1e-5, x
    )
    assert torch.equal(out, want[0]) and torch.equal(s, want[1])
    with pytest.raises(KernelError, match="a scaled product needs a residual of its dtype"):
        ops.rms_norm(scaled, norm, 1e-5)
    with pytest.raises(KernelError, match=r"its column scales must be \[N\] = \[48\]"):
        ops.rms_norm(
            ScaledProduct(product, scaled.row_scale, scaled.row_scale, x.dtype), norm, 1e-5, x
        )
    gate_up = randn(gen, 4, 96, dtype=torch.float32)
    rows = ops.swiglu(gate_up, fp8_rows=True)
    values, scale = reference.quantize_rows_fp8(ops.swiglu(gate_up))
    assert isinstance(rows, FP8Rows) and torch.equal(rows.scale, scale)
    assert torch.equal(rows.values.view(torch.uint8), values.view(torch.uint8))
    with pytest.raises(KernelError, match="FP8 rows need gate_up"):
        ops.swiglu(gate_up[None], fp8_rows=True)


@gpu_test
@pytest.mark.parametrize("rows", [FEW_ROWS, MANY_ROWS, 2048])
def test_fp8_rows_multiply_as_the_activations_they_stand_for(
    gen: torch.Generator, rows: int
) -> None:
    """linear, linear_swiglu and qkv_rope_cache fed the norm's FP8 rows give, bit for bit,
    what they give fed its BF16 output, on both FP8 paths: the rows are what either path
    would have quantized."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89+")
    hidden = randn(gen, rows, 2048, dtype=torch.bfloat16)
    norm = randn(gen, 2048, dtype=torch.bfloat16)
    x, _ = ops.rms_norm(hidden, norm, 1e-5)
    fp8, _ = ops.rms_norm(hidden, norm, 1e-5, fp8_rows=True)
    assert isinstance(fp8, FP8Rows)
    qkv = quantize(randn(gen, 3072, 2048, dtype=torch.bfloat16, scale=0.02), "fp8")
    gate_up = quantize(randn(gen, 2 * 1024, 2048, dtype=torch.bfloat16, scale=0.02), "fp8")
    down = quantize(randn(gen, 2048, 1024, dtype=torch.bfloat16, scale=0.02), "fp8")
    for path in ("scaled_mm", "scaled_mm_tensorwise"):
        plan = LinearPlan(
            quantized_few_rows=path, quantized_many_rows=path, quantized_prompt_rows=path
        )
        assert ops.takes_fp8_rows(qkv, plan, rows, torch.bfloat16)
        assert torch.equal(ops.linear(fp8, qkv, plan=plan), ops.linear(x, qkv, plan=plan))
        got = ops.linear_swiglu(fp8, gate_up, plan=plan)
        assert torch.equal(got, ops.linear_swiglu(x, gate_up, plan=plan)), path
        # the SwiGLU's own FP8 rows into down: the unfused chain's bits
        mlp = ops.linear_swiglu(fp8, gate_up, plan=plan, fp8_rows=True)
        assert isinstance(mlp, FP8Rows)
        want = ops.linear(got, down, plan=plan)
        assert torch.equal(ops.linear(mlp, down, plan=plan), want), path
        # down's product with its scales left to the next norm (tensorwise only)
        deferred = ops.linear(mlp, down, plan=plan, defer_scales=True)
        assert isinstance(deferred, ScaledProduct) == (path == "scaled_mm_tensorwise"), path
        normed = ops.rms_norm(deferred, norm, 1e-5, hidden)
        for a, b in zip(normed, ops.rms_norm(want, norm, 1e-5, hidden), strict=True):
            assert torch.equal(a, b), path
        caches = []
        for source in (x, fp8):
            k_cache = torch.zeros(rows // 16 + 1, 16, 8, 64, device=DEVICE, dtype=torch.bfloat16)
            v_cache = torch.zeros_like(k_cache)
            cos, sin = rope_tables(64, 4096, 500000.0, device=DEVICE)
            positions = torch.arange(rows, device=DEVICE)
            q = ops.qkv_rope_cache(
                source, qkv, 32, positions, cos, sin, k_cache, v_cache, positions, plan=plan
            )
            caches.append((q, k_cache, v_cache))
        for a, b in zip(*caches, strict=True):
            assert torch.equal(a, b), path
    w8a16 = LinearPlan(quantized_few_rows="w8a16", quantized_many_rows="w8a16")
    if rows <= MANY_ROWS:
        with pytest.raises(KernelError, match="this call's is w8a16"):
            ops.linear(fp8, qkv, plan=w8a16)


@gpu_test
def test_a_fused_one_row_swiglu_asked_for_fp8_rows_quantizes_its_output(
    gen: torch.Generator,
) -> None:
    """The one-row GEMV + SwiGLU computes in one kernel; asked for FP8 rows it quantizes the
    same output after it (bits of `quantize_rows_fp8` of the fused kernel's output)."""
    x = randn(gen, 1, 2048, dtype=torch.bfloat16)
    gate_up = quantize(randn(gen, 2 * 1024, 2048, dtype=torch.bfloat16, scale=0.02), "fp8")
    plan = LinearPlan(one_row_gemv=QUANTIZED_CONFIGS[0])
    out = ops.linear_swiglu(x, gate_up, plan=plan)
    rows = ops.linear_swiglu(x, gate_up, plan=plan, fp8_rows=True)
    values, scale = reference.quantize_rows_fp8(out)
    assert isinstance(rows, FP8Rows) and torch.equal(rows.scale, scale)
    assert torch.equal(rows.values.view(torch.uint8), values.view(torch.uint8))
