"""The 8-bit-weight matmul (`triton_ops.w8a16_matmul`): int8 and FP8 weights, 16-bit activations.

Oracle: x @ (data * scale)^T in FP64. Each output must be that value rounded once to x's dtype,
up to the FP32 sums' own rounding: within one half-step of the output type plus 2^-16 of the
sum of |x| |w| for its row (FP32 accumulation over K <= 8192 terms stays well inside that).
A kernel that rounded the weights to BF16 before multiplying (as dequantize + cuBLAS does) or
dropped a scale would fail the first part at these shapes.
"""

from __future__ import annotations

import pytest
import torch
from kernels_testing import DEVICE, GPU, gpu_test, randn
from sv_kernels import KernelError
from sv_kernels.quantized import QuantKind, quantize
from sv_kernels.triton_ops.w8a16 import default_tile, w8a16_matmul

KINDS: tuple[QuantKind, ...] = ("int8", "fp8")
# The unit roundoff of each output type: half a step, relative to the value.
HALF_STEP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def assert_rounded_once(
    out: torch.Tensor,
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor,
    out_dtype: torch.dtype | None = None,
) -> None:
    out_dtype = out_dtype or x.dtype
    w = data.double() * scale.double()[:, None]
    exact = x.double() @ w.t()
    magnitude = x.double().abs() @ w.abs().t()
    bound = HALF_STEP[out_dtype] * exact.abs() + 2.0**-16 * magnitude + 1e-30
    excess = (out.double() - exact).abs() / bound
    worst = int(excess.argmax())
    assert out.dtype == out_dtype and out.shape == exact.shape
    assert float(excess.max()) <= 1.0, (
        f"output {divmod(worst, out.shape[1])}: {float(out.flatten()[worst])} against "
        f"{float(exact.flatten()[worst])} (bound {float(bound.flatten()[worst]):.3g})"
    )


def weights(
    gen: torch.Generator, kind: QuantKind, n: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    q = quantize(randn(gen, n, k, dtype=torch.float32, scale=0.02), kind)
    return q.data, q.scale


DTYPES = (
    [torch.bfloat16, torch.float32] if DEVICE.type == "cpu" else [torch.bfloat16, torch.float16]
)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "n", "k"),
    [
        (2, 37, 100),  # every dimension partial: masked rows, features and K
        (17, 64, 300),
        (70, 130, 129),  # past one 64-row tile
        pytest.param(16, 3072, 2048, marks=GPU),  # Llama 3.2 1B q/k/v, a verify step
        pytest.param(256, 16384, 2048, marks=GPU),  # gate/up, a 256-row decode step
        pytest.param(256, 2048, 8192, marks=GPU),  # down
        pytest.param(2048, 2048, 2048, marks=GPU),  # o, a prompt
    ],
)
def test_w8a16_matches_the_fp64_oracle(
    gen: torch.Generator, kind: QuantKind, dtype: torch.dtype, rows: int, n: int, k: int
) -> None:
    data, scale = weights(gen, kind, n, k)
    x = randn(gen, rows, k, dtype=dtype)
    assert_rounded_once(w8a16_matmul(x, data, scale), x, data, scale)


@gpu_test
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [2, 16, 17, 64, 65, 256, 1000])
def test_w8a16_default_tiles_at_every_row_count(
    gen: torch.Generator, kind: QuantKind, rows: int
) -> None:
    data, scale = weights(gen, kind, 3072, 2048)
    x = randn(gen, rows, 2048, dtype=torch.bfloat16)
    assert_rounded_once(w8a16_matmul(x, data, scale, default_tile(rows)), x, data, scale)


@pytest.mark.parametrize("rows", [3, pytest.param(256, marks=GPU)])
def test_w8a16_writes_fp32_from_its_sums(gen: torch.Generator, rows: int) -> None:
    """FP32 out (the LM head's logits) of 16-bit x: the FP32 sums themselves, never rounded
    to x's type (the bound is 2^-24 of each value plus the sums' own error)."""
    data, scale = weights(gen, "fp8", 256, 512)
    x = randn(gen, rows, 512, dtype=torch.bfloat16)
    out = w8a16_matmul(x, data, scale, out_dtype=torch.float32)
    assert_rounded_once(out, x, data, scale, torch.float32)


def test_w8a16_every_int8_value_converts_exactly(gen: torch.Generator) -> None:
    # Row n holds every int8 value once (shifted by n), scale 1: each output is a plain dot
    # product of small integers, exact in every type.
    values = torch.arange(-128, 128, dtype=torch.int64, device=DEVICE)
    data = torch.stack([torch.roll(values, n) for n in range(8)]).to(torch.int8)
    x = torch.zeros(3, 256, dtype=torch.bfloat16, device=DEVICE)
    x[0, 0] = 1.0  # picks column 0 of each row
    x[1] = 1.0  # sums each row: -128
    x[2, 5] = -2.0
    out = w8a16_matmul(x, data, torch.ones(8, device=DEVICE)).double()
    expected = torch.stack([data[:, 0], data.sum(1), -2 * data[:, 5].to(torch.int64)]).double()
    assert torch.equal(out, expected.to(out.device))


def test_w8a16_reads_strided_operands(gen: torch.Generator) -> None:
    data, scale = weights(gen, "int8", 40, 96)
    wide = randn(gen, 5, 200, dtype=torch.bfloat16)
    x = wide[:, 50:146]  # rows 200 apart
    xt = randn(gen, 96, 5, dtype=torch.bfloat16).t()  # columns not contiguous
    spread = torch.zeros(80, device=DEVICE)
    spread[::2] = scale  # a scale vector of stride 2
    for xs in (x, xt):
        assert_rounded_once(w8a16_matmul(xs, data, spread[::2]), xs, data, scale)
    bytes_wide = torch.zeros(40, 150, dtype=torch.int8, device=DEVICE)
    bytes_wide[:, 10:106] = data
    assert_rounded_once(w8a16_matmul(x, bytes_wide[:, 10:106], scale), x, data, scale)


def test_w8a16_rejects_what_it_cannot_multiply() -> None:
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=DEVICE)
    data = torch.zeros(8, 64, dtype=torch.int8, device=DEVICE)
    scale = torch.ones(8, device=DEVICE)
    with pytest.raises(KernelError, match=r"x \[2, 32\] and weight \[8, 64\]"):
        w8a16_matmul(x[:, :32], data, scale)
    with pytest.raises(KernelError, match=r"torch\.float16, expected int8 or e4m3"):
        w8a16_matmul(x, data.half(), scale)
    with pytest.raises(KernelError, match=r"scale is torch.float32 \[7\], expected FP32 \[8\]"):
        w8a16_matmul(x, data, scale[:7])


def test_w8a16_no_rows() -> None:
    data = torch.zeros(8, 64, dtype=torch.int8, device=DEVICE)
    out = w8a16_matmul(torch.zeros(0, 64, device=DEVICE), data, torch.ones(8, device=DEVICE))
    assert out.shape == (0, 8)
