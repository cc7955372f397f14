"""Triton embedding, rms_norm, swiglu and rope_cache_write against their references."""

from __future__ import annotations

import pytest
import torch
from kernels_testing import DEVICE, GPU, assert_close, gpu_test, randint, randn
from sv_kernels import KernelError, reference, rope_tables, triton_ops
from sv_kernels.quantized import FP8Rows, ScaledProduct
from sv_kernels.reference import kv_pages
from sv_kernels.rope_tables import Llama3RopeScaling

DTYPES = [torch.float32, torch.bfloat16]
LLAMA3 = Llama3RopeScaling(32.0, 1.0, 4.0, 8192)


# --- embedding ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "vocab", "hidden"),
    [
        (1, 50, 96),
        (13, 300, 40),
        pytest.param(256, 128256, 2048, marks=GPU),
        pytest.param(8192, 128256, 2048, marks=GPU),
    ],
)
def test_embedding(
    gen: torch.Generator, dtype: torch.dtype, tokens: int, vocab: int, hidden: int
) -> None:
    weight = randn(gen, vocab, hidden, dtype=dtype)
    ids = randint(gen, 0, vocab, tokens)
    ids[0] = vocab - 1  # the last row, where an off-by-one would read past the table
    out = triton_ops.embedding(ids.to(torch.int32), weight)
    assert torch.equal(out, reference.embedding(ids, weight))


# --- rms_norm -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize(
    ("tokens", "hidden"),
    [
        (1, 96),
        (7, 64),
        (3, 1000),
        pytest.param(256, 2048, marks=GPU),
        pytest.param(8192, 2048, marks=GPU),
    ],
)
def test_rms_norm(
    gen: torch.Generator, dtype: torch.dtype, with_residual: bool, tokens: int, hidden: int
) -> None:
    x = randn(gen, tokens, hidden, dtype=dtype, scale=2.0)
    residual = randn(gen, tokens, hidden, dtype=dtype) if with_residual else None
    weight = randn(gen, hidden, dtype=dtype)
    out, s = triton_ops.rms_norm(x, weight, 1e-5, residual)
    ref_out, ref_s = reference.rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(s, ref_s), "the residual sum is one rounded add: it must be exact"
    assert_close(out, ref_out, "rms_norm")


def test_rms_norm_strided_rows_and_fp32_weight(gen: torch.Generator) -> None:
    """A row-strided view of x, 3-D input, and an FP32 weight (torch promotes the output)."""
    wide = randn(gen, 2, 5, 160, dtype=torch.bfloat16)
    x = wide[..., :96]  # rows 160 apart
    residual = randn(gen, 2, 5, 96, dtype=torch.bfloat16)
    weight = randn(gen, 96, dtype=torch.float32)
    out, s = triton_ops.rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_s = reference.rms_norm(x, weight, 1e-6, residual)
    assert out.dtype == torch.float32 and out.shape == (2, 5, 96)
    assert torch.equal(s, ref_s)
    assert_close(out, ref_out, "rms_norm strided", tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize(
    ("tokens", "hidden"),
    [(1, 96), (5, 1000), pytest.param(256, 2048, marks=GPU), pytest.param(2048, 2048, marks=GPU)],
)
def test_rms_norm_writes_fp8_rows_as_quantizing_its_output_would(
    gen: torch.Generator, dtype: torch.dtype, with_residual: bool, tokens: int, hidden: int
) -> None:
    """The norm's FP8 rows are the reference quantization (`reference.quantize_rows_fp8`) of
    the kernel's own 16-bit output, bit for bit, rows of very different sizes each with its
    scale; the residual sum is unchanged."""
    x = randn(gen, tokens, hidden, dtype=dtype, scale=2.0)
    residual = randn(gen, tokens, hidden, dtype=dtype) if with_residual else None
    weight = randn(gen, hidden, dtype=dtype)
    weight[0] = 300.0  # one channel far above the rest: the row's scale follows it
    out, s = triton_ops.rms_norm(x, weight, 1e-5, residual)
    rows, s8 = triton_ops.rms_norm(x, weight, 1e-5, residual, True)
    values, scale = reference.quantize_rows_fp8(out)
    assert isinstance(rows, FP8Rows) and rows.dtype == dtype
    assert torch.equal(s8, s)
    assert torch.equal(rows.scale, scale)
    assert torch.equal(rows.values.view(torch.uint8), values.view(torch.uint8))


@pytest.mark.parametrize("fp8_rows", [False, True])
@pytest.mark.parametrize(
    ("tokens", "hidden"), [(1, 96), (5, 1000), pytest.param(256, 2048, marks=GPU)]
)
def test_rms_norm_scales_a_scaled_product_as_scale_product_would(
    gen: torch.Generator, fp8_rows: bool, tokens: int, hidden: int
) -> None:
    """An FP8 matmul's unscaled product read with its row and column scales: the sum and the
    output of the norm of `reference.scale_product`'s result, bit for bit."""
    product = randn(gen, tokens, hidden, dtype=torch.float32, scale=300.0)
    row_scale = randn(gen, tokens, 1, dtype=torch.float32).abs() / 100
    col_scale = randn(gen, hidden, dtype=torch.float32).abs() / 100
    residual = randn(gen, tokens, hidden, dtype=torch.bfloat16)
    weight = randn(gen, hidden, dtype=torch.bfloat16)
    scaled = reference.scale_product(product, row_scale, col_scale, torch.bfloat16)
    want_out, want_s = triton_ops.rms_norm(scaled, weight, 1e-5, residual, fp8_rows)
    x = ScaledProduct(product, row_scale, col_scale, torch.bfloat16)
    out, s = triton_ops.rms_norm(x, weight, 1e-5, residual, fp8_rows)
    assert torch.equal(s, want_s)
    if fp8_rows:
        assert isinstance(out, FP8Rows) and isinstance(want_out, FP8Rows)
        assert torch.equal(out.scale, want_out.scale)
        out, want_out = out.values.view(torch.uint8), want_out.values.view(torch.uint8)
    assert torch.equal(out, want_out)
    with pytest.raises(KernelError, match="a scaled product needs a residual"):
        triton_ops.rms_norm(x, weight, 1e-5)


def test_rms_norm_fp8_rows_need_a_2d_x_and_its_dtype(gen: torch.Generator) -> None:
    x = randn(gen, 2, 3, 64, dtype=torch.bfloat16)
    with pytest.raises(KernelError, match="FP8 rows need x"):
        triton_ops.rms_norm(x, randn(gen, 64, dtype=torch.bfloat16), 1e-5, None, True)
    with pytest.raises(KernelError, match="FP8 rows need x"):
        triton_ops.rms_norm(x[0], randn(gen, 64, dtype=torch.float32), 1e-5, None, True)


# --- swiglu -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (1, 80),
        (5, 2 * 100),
        (2, 3, 2 * 64),
        pytest.param((256, 2 * 8192), marks=GPU),
        pytest.param((8192, 2 * 8192), marks=GPU),
    ],
)
def test_swiglu(gen: torch.Generator, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gate_up = randn(gen, *shape, dtype=dtype, scale=3.0)
    assert_close(triton_ops.swiglu(gate_up), reference.swiglu(gate_up), "swiglu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("tokens", "inter"),
    [
        (1, 40),
        (5, 300),
        pytest.param(256, 8192, marks=GPU),
        pytest.param(2048, 8192, marks=GPU),
    ],
)
def test_swiglu_writes_fp8_rows_as_quantizing_its_output_would(
    gen: torch.Generator, dtype: torch.dtype, tokens: int, inter: int
) -> None:
    """The SwiGLU's FP8 rows (a program per row) are the reference quantization of the
    kernel's own 16-bit output, bit for bit, with rows of very different sizes."""
    gate_up = randn(gen, tokens, 2 * inter, dtype=dtype, scale=3.0)
    gate_up[0, inter:] *= 50  # the up half only: a far larger gate would overflow exp
    rows = triton_ops.swiglu(gate_up, True)
    values, scale = reference.quantize_rows_fp8(triton_ops.swiglu(gate_up))
    assert isinstance(rows, FP8Rows) and rows.dtype == dtype
    assert torch.equal(rows.scale, scale)
    assert torch.equal(rows.values.view(torch.uint8), values.view(torch.uint8))
    with pytest.raises(KernelError, match="FP8 rows need gate_up"):
        triton_ops.swiglu(gate_up[None], True)


# --- rope_cache_write ---------------------------------------------------------------------


def _rope_case(
    gen: torch.Generator,
    tokens: int,
    hq: int,
    hkv: int,
    head_dim: int,
    dtype: torch.dtype,
    num_pages: int,
    max_positions: int,
    tile_tokens: int | None = None,
) -> None:
    page_size = 16
    cos, sin = rope_tables.rope_tables(head_dim, max_positions, 500000.0, LLAMA3, device=DEVICE)
    # q, k, v as strided views of one fused QKV projection, as the model produces them.
    qkv = randn(gen, tokens, hq + 2 * hkv, head_dim, dtype=dtype)
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    qkv_before = qkv.clone()
    positions = randint(gen, 0, max_positions, tokens)
    slots = torch.randperm(num_pages * page_size, generator=gen, device=DEVICE)[:tokens]
    slots[randint(gen, 0, tokens, max(1, tokens // 4))] = -1  # padding tokens: not written
    shape = (num_pages, page_size, hkv, head_dim)
    # The kernel writes a GPU pool's layout (by head), the reference a plain contiguous cache.
    ref_k_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    ref_v_cache = ref_k_cache.clone()
    k_cache = kv_pages((), *shape, dtype, DEVICE, by_head=True).copy_(ref_k_cache)
    v_cache = kv_pages((), *shape, dtype, DEVICE, by_head=True).copy_(ref_v_cache)

    q_rot = triton_ops.rope_cache_write(
        q, k, v, positions, cos, sin, k_cache, v_cache, slots, tile_tokens=tile_tokens
    )
    ref_q = reference.rope_cache_write(
        q, k, v, positions, cos, sin, ref_k_cache, ref_v_cache, slots
    )
    assert_close(q_rot, ref_q, "rotated q")
    assert torch.equal(qkv, qkv_before), "q, k and v must not be modified"
    written = torch.zeros(num_pages * page_size, dtype=torch.bool, device=DEVICE)
    written[slots[slots >= 0]] = True
    for name, cache, ref_cache in (("k", k_cache, ref_k_cache), ("v", v_cache, ref_v_cache)):
        flat, ref_flat = cache.reshape(-1, hkv, head_dim), ref_cache.view(-1, hkv, head_dim)
        assert flat[~written].isnan().all(), f"{name} cache: a slot outside slot_mapping changed"
        assert_close(flat[written], ref_flat[written], f"{name} cache slots")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "hq", "hkv", "head_dim"),
    [(1, 4, 4, 32), (9, 6, 2, 64), (5, 8, 2, 128), (6, 3, 1, 32)],
)
@pytest.mark.parametrize("tile_tokens", [None, 4])
def test_rope_cache_write(
    gen: torch.Generator,
    dtype: torch.dtype,
    tokens: int,
    hq: int,
    hkv: int,
    head_dim: int,
    tile_tokens: int | None,
) -> None:
    """Several tokens per program too (4 with 9, 5 and 6 tokens: a ragged last block)."""
    _rope_case(
        gen,
        tokens,
        hq,
        hkv,
        head_dim,
        dtype,
        num_pages=5,
        max_positions=20000,
        tile_tokens=tile_tokens,
    )


@gpu_test
@pytest.mark.parametrize("tokens", [256, 2048])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_cache_write_serving_shapes(
    gen: torch.Generator, tokens: int, dtype: torch.dtype
) -> None:
    for tile_tokens in (None, 1, 8):
        _rope_case(
            gen,
            tokens,
            32,
            8,
            64,
            dtype,
            num_pages=4096,
            max_positions=131072,
            tile_tokens=tile_tokens,
        )
