# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""y = x @ W^T for a single row x: the decode step of one sequence.

At batch 1 a linear layer is a matrix-vector product: every weight is read once and used for
one multiply-add, so the op is bound by memory bandwidth alone. cuBLAS runs it on tensor-core
GEMM tiles padded to 8 rows, with a split-K reduction for the tall matrices, and reaches about
3/4 of the copy bandwidth on Llama 3.2 1B's shapes. This kernel streams W with plain FMAs:
program p owns BLOCK_N consecutive output features (rows of W), walks K in BLOCK_K slices with
16-byte loads, accumulates in FP32 and reduces once at the end.

Whether it beats cuBLAS depends on the shape and the chip, so nothing assumes it does:
`linear_tuning.tune_gemv` times both (and each tile of `candidates`) for each weight shape the
model has and returns a `LinearPlan` per weight; its caller keeps them and passes each to
`ops.linear`.

Quantized weights (FP8 e4m3 or int8, see `sv_kernels.quantized`) stream through the same
kernel: it loads 1-byte values, converts them in registers and multiplies each row's sum by
that row's scale at the end, so a batch-1 step reads half the bytes of BF16. Four things differ
for them, each for bandwidth: they have their own candidate tiles (`QUANTIZED_CONFIGS`: more
rows per program, wider slices, and narrow slices on one or two warps that spend fewer
instructions per weight), they are loaded 8 per thread so that x needs no trip through shared
memory (`_dot_rows`), with BF16 activations they multiply in packed FP16 pairs (`_half2_dot`:
the hardware's e4m3 -> f16 conversion gives two values an instruction, and int8 reaches FP16
through byte permutes), and with FP32 activations int8 converts through FP32 bit patterns
instead of the quarter-rate int-to-float instruction (`_int8_to_f32`).

`swiglu=True` gives the gate/up projection a SwiGLU epilogue: a program takes gate rows and the
matching up rows and writes silu(gate) * up, which saves the decode step one launch per layer
(16 fewer kernels at batch 1: 856 -> 831 us per step on the H200, 2026-11-30).

The q/k/v projection has an epilogue of its own, RoPE and the KV-cache write, in
`qkv_rope_cache` (the same dot products; 16 fewer kernels at batch 1: 809 -> 780 us per step
on the H200, 2026-12-02).

`bias` (Qwen2's q/k/v projection) is added to the FP32 dot products before they are rounded,
as cuBLAS's bias epilogue does: no separate add kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..linear_plan import (
    GemvTile,
)
from ..quantized import LinearWeight, QuantizedWeight
from ._common import INTERPRET, cdiv, unit_last_stride, use_pdl, wait_for_prior_kernels

# Compiled kernels build int8's FP32 bit patterns with byte permutes (`_int8_to_f32`); the
# interpreter, which runs no inline PTX, with integer ops that give the same values.
_BYTE_PERMUTE: tl.constexpr = tl.constexpr(not INTERPRET)


@triton.jit
def _int8_to_f32(w):
    """int8 weights as FP32, exactly, without an int-to-float conversion (which on Hopper runs
    at a quarter of the FP32 rate, 16 per SM per clock, where 4.3 TB/s of 1-byte weights needs
    ~17 a clock).

    The byte b (two's complement v) XOR 0x80 is v + 128 in 0..255; placed in the low mantissa
    bits of 2^23 (0x4B000000) it reads as the float 2^23 + 128 + v, and subtracting
    2^23 + 128 leaves v exactly. Compiled, four weights share one XOR, and one byte permute
    (`prmt`) a weight places the byte under the exponent: ~1.25 instructions a weight before
    the FP32 add, where sign-extending each byte and adding 0x4B000080 took two."""
    if _BYTE_PERMUTE:
        biased = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 t, e;
            xor.b32 t, $4, 0x80808080;
            mov.b32 e, 0x4B000000;
            prmt.b32 $0, t, e, 0x7540;
            prmt.b32 $1, t, e, 0x7541;
            prmt.b32 $2, t, e, 0x7542;
            prmt.b32 $3, t, e, 0x7543;
            }
            """,
            constraints="=r,=r,=r,=r,r",
            args=[w],
            dtype=tl.float32,
            is_pure=True,
            pack=4,
        )
    else:
        biased = (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True)
    return biased - 8388736.0


@triton.jit
def _to_f32(w, INT8: tl.constexpr):
    """Weights (BF16/FP32, FP8 e4m3 or int8) as FP32, exactly."""
    if INT8:
        return _int8_to_f32(w)
    return w.to(tl.float32)


@triton.jit
def _dot_rows(
    x_ptr,
    w_ptr,
    rows,
    row_mask,
    K,
    stride_wn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    ONE_BYTE: tl.constexpr,
    INT8: tl.constexpr,
):
    """y[i] = sum_k x[k] * W[rows[i], k] in FP32, for the BLOCK_N rows `rows` of W.

    The first two BLOCK_K slices of weights are loaded before waiting for the kernel that
    writes x: under PDL those loads run under the previous kernels' tails (weights are never
    written in a step). Two slices measured 867 -> 856 us per batch-1 decode step against one
    (H200, 2026-11-30); at K = 2048 with 1024-wide slices that is the whole row.

    ONE_BYTE (FP8 / int8 weights): each thread loads its weights 8 at a time (8-byte loads),
    not 16. x is BF16, so Triton loads it 8 per thread (16 bytes); with 16 weights per thread
    the two tiles have different layouts and every slice of x went through shared memory (a
    store, two barriers, loads) before the first multiply, and took 56 registers instead of 35
    at (2, 1024, 4) (ptxas, sm_90): fewer programs per SM, fewer bytes in flight. A warp's
    8-byte loads still read 256 contiguous bytes per instruction."""
    # 1-byte weights with BF16 (or FP16) activations multiply in packed FP16 (`_half2_dot`);
    # FP32 activations, which FP16 would round, and BF16 weights in FP32.
    HALF2: tl.constexpr = ONE_BYTE and x_ptr.dtype.element_ty != tl.float32
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    cols0 = tl.arange(0, BLOCK_K)
    if ONE_BYTE:
        cols0 = tl.max_contiguous(cols0, 8)
    cols1 = BLOCK_K + cols0
    mask0 = row_mask[:, None] & (cols0 < K)[None, :]
    mask1 = row_mask[:, None] & (cols1 < K)[None, :]
    w0 = tl.load(w_rows + cols0[None, :], mask=mask0, other=0.0)
    w1 = tl.load(w_rows + cols1[None, :], mask=mask1, other=0.0)
    wait_for_prior_kernels(USE_PDL)
    x0 = tl.load(x_ptr + cols0, mask=cols0 < K, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + cols1, mask=cols1 < K, other=0.0).to(tl.float32)
    acc = slice_products(w0, x0, HALF2, INT8, BLOCK_N, BLOCK_K)
    acc += slice_products(w1, x1, HALF2, INT8, BLOCK_N, BLOCK_K)
    for k0 in range(2 * BLOCK_K, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        if ONE_BYTE:
            cols = tl.max_contiguous(cols, 8)
        col_mask = cols < K
        x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += slice_products(w, x, HALF2, INT8, BLOCK_N, BLOCK_K)
    return row_sums(acc, HALF2)


@triton.jit
def slice_products(
    w, x, HALF2: tl.constexpr, INT8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    """One K slice's share of the rows' dot products, to add to the accumulator: w [BLOCK_N,
    BLOCK_K] (as loaded), x [BLOCK_K] (FP32). HALF2: in packed FP16 (`_half2_dot`), else each
    product in FP32. `row_sums` turns the accumulated shares into the dot products."""
    # (one return: Triton wants one type from both, and the two shares differ in shape)
    return _half2_dot(w, x, INT8, BLOCK_N, BLOCK_K) if HALF2 else _to_f32(w, INT8) * x[None, :]


@triton.jit
def row_sums(acc, HALF2: tl.constexpr):
    """The dot products [BLOCK_N] (FP32) from `slice_products`' accumulated shares."""
    if HALF2:
        return tl.sum(acc, axis=1) * X_UNSCALE
    return tl.sum(acc, axis=1)


# x is scaled by 2^-8 before it meets the weights in FP16 (and the row sums by 2^8 after), so
# that a product of a 1-byte weight (|w| <= 448 for e4m3, 127 for int8) and an activation
# stays finite in FP16 up to |x| ~ 37,000, and a lane's four such products up to ~9,000
# (activations past ~4,600 in all 8 columns of a group, each against its row's largest
# weight, would overflow the group's sum: normed activations and SwiGLU outputs peak in
# single channels). Activations below 2^-6 become FP16 subnormals, resolved to 2^-16.
X_SCALE: tl.constexpr = tl.constexpr(2.0**-8)
X_UNSCALE: tl.constexpr = tl.constexpr(2.0**8)


@triton.jit
def _int8_to_f16(w):
    """int8 weights as FP16, exactly: the byte b (two's complement v) XOR 0x80 is v + 128;
    under the FP16 exponent of 1024 (0x64) it reads as 1024 + 128 + v, and one packed
    subtraction of 1152 leaves v. Four weights: one XOR, two byte permutes, two HSUB2."""
    if _BYTE_PERMUTE:
        return tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 t, e, bias;
            xor.b32 t, $2, 0x80808080;
            mov.b32 e, 0x64646464;
            mov.b32 bias, 0x64806480;
            prmt.b32 $0, t, e, 0x5140;
            prmt.b32 $1, t, e, 0x7362;
            sub.f16x2 $0, $0, bias;
            sub.f16x2 $1, $1, bias;
            }
            """,
            constraints="=r,=r,r",
            args=[w],
            dtype=tl.float16,
            is_pure=True,
            pack=4,
        )
    return w.to(tl.float16)


@triton.jit
def _half2_dot(w, x, INT8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """sum_k w[:, k] * x[k] * 2^-8 in groups of 8 columns: [BLOCK_N, BLOCK_K // 8] (FP32).

    The multiply-adds run on packed FP16 pairs (HFMA2: two weights an instruction, where the
    FP32 path widens each weight and spends an FFMA on it): e4m3 converts to FP16 pairs in one
    instruction, each thread's even and odd columns of a group of 8 (its 8-byte load) run as
    the two lanes of a pair, four products long, and the lanes' sum is widened to FP32 once a
    group. The FP16 roundings cost ~1.7e-3 of the result's norm against FP64 (FP32 sums:
    7e-8; run 225, every 1B matrix, activations of scale 0.01 to 100), about a BF16 output's
    own rounding (2^-9 = 1.95e-3); the 1B teacher-forced logits' errors against the FP32
    oracle, which are the weights' quantization (int8 0.087, fp8 0.25), did not move in the
    fourth digit (runs 224-225). ptxas, sm_90, gate/up's (4, 512, 2) loop: 122 -> 95
    instructions for 32 weights (fp8), 147 -> 119 (int8)."""
    xs = (x * X_SCALE).to(tl.float16)
    w16 = _int8_to_f16(w) if INT8 else w.to(tl.float16)
    products = tl.reshape(w16 * xs[None, :], (BLOCK_N, BLOCK_K // 8, 4, 2))
    pairs = tl.sum(products, axis=2)
    return tl.sum(pairs, axis=2).to(tl.float32)


@triton.jit
def _paired_halves(y, HALF_BLOCK: tl.constexpr):
    """Split y [2 * HALF_BLOCK] (FP32) into its first and second halves."""
    halves = tl.reshape(y, (2, HALF_BLOCK))
    which = tl.arange(0, 2)[:, None]
    return (
        tl.sum(tl.where(which == 0, halves, 0.0), axis=0),
        tl.sum(tl.where(which == 1, halves, 0.0), axis=0),
    )


@triton.jit
def block_rows(block, N, BLOCK_N: tl.constexpr, GATED: tl.constexpr):
    """The rows of W that row block `block` owns, and their mask. GATED (the SwiGLU epilogue,
    W = [gate; up], N = 2I rows): BLOCK_N / 2 gate rows and the up rows of the same features,
    I rows further down."""
    if GATED:
        HALF_BLOCK: tl.constexpr = BLOCK_N // 2
        r = tl.arange(0, BLOCK_N)
        features = block * HALF_BLOCK + r % HALF_BLOCK
        rows = features + (r // HALF_BLOCK) * (N // 2)
        row_mask = features < N // 2
    else:
        rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
        row_mask = rows < N
    return rows, row_mask


@triton.jit
def store_swiglu_block(y, out_ptr, block, N, BLOCK_N: tl.constexpr):
    """The SwiGLU epilogue: y [BLOCK_N] (FP32) holds `block_rows(block, GATED=True)`'s dot
    products, gate then up; store silu(gate) * up for the block's BLOCK_N / 2 features. Gate
    and up are rounded to the output dtype first, as the unfused path stores them, so that
    fused and unfused give the same bits (see `swiglu`)."""
    HALF_BLOCK: tl.constexpr = BLOCK_N // 2
    gate, up = _paired_halves(y.to(out_ptr.dtype.element_ty).to(tl.float32), HALF_BLOCK)
    out_features = block * HALF_BLOCK + tl.arange(0, HALF_BLOCK)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(
        out_ptr + out_features,
        (silu * up).to(out_ptr.dtype.element_ty),
        mask=out_features < N // 2,
    )


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    scale_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    GATED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    ONE_BYTE: tl.constexpr,
    INT8: tl.constexpr,
):
    rows, row_mask = block_rows(tl.program_id(0), N, BLOCK_N, GATED)
    y = _dot_rows(
        x_ptr, w_ptr, rows, row_mask, K, stride_wn, BLOCK_N, BLOCK_K, USE_PDL, ONE_BYTE, INT8
    )
    if SCALED:  # a quantized weight: row r stands for data[r] * scale[r]
        y = y * tl.load(scale_ptr + rows, mask=row_mask, other=0.0)
    if GATED:
        store_swiglu_block(y, out_ptr, tl.program_id(0), N, BLOCK_N)
    else:
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        # Rounded to x's dtype first, then to the output's: `linear(x, w).to(out.dtype)`.
        out = y.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows, out, mask=row_mask)


# (BLOCK_N, BLOCK_K, num_warps) candidates; the tuner keeps the fastest per shape.
# On the H200 the narrowest, longest tiles won on every Llama 3.2 1B shape (2 x 1024, 4 warps:
# many programs in flight, each streaming two long rows), so the list leans that way.
CONFIGS: tuple[GemvTile, ...] = (
    (2, 1024, 4),
    (2, 2048, 4),
    (2, 2048, 8),
    (2, 512, 2),
    (4, 1024, 8),
    (4, 512, 4),
    (8, 512, 8),
)


# The candidates for 1-byte weights (FP8 / int8). With BF16's winner (2, 1024, 4) a program
# streams half BF16's bytes in the same time (the same grid of programs, each waiting about one
# DRAM latency), which is how the quantized decode step read half the bytes at half the
# bandwidth. What bounds a batch-1 GEMV first is the weight bytes in flight per SM: programs
# per SM (registers: an FP32 accumulator per loaded weight, plus x in FP32) times the bytes each
# program has requested. ptxas (sm_90, 8-byte loads) for the wide tiles below gives 32-72
# registers and 48-72 KB in flight per SM at K = 2048 (BF16's (2, 1024, 4): 40 registers, 96
# KB); the wider slices are for down's K = 8192, where 1024-wide slices leave six of eight to
# the loop. Past that, for the large matrices, the instructions per weight: see the narrow
# tiles at the end of the list (41-78 registers, no spills).
QUANTIZED_CONFIGS: tuple[GemvTile, ...] = (
    (4, 1024, 4),  # BF16's winner's bytes per program: 4 rows x 2048
    (2, 1024, 4),  # BF16's winner as it is
    (8, 512, 4),
    (8, 1024, 8),
    (2, 2048, 4),
    (2, 2048, 8),
    (4, 2048, 8),
    (2, 4096, 8),  # down: a whole 8192-wide row in the two slices loaded up front
    # Narrow slices and few warps: each thread walks K over 8 columns of its rows, so the
    # rows' cross-thread sums (shuffles, and shared memory across warps) come once per 128-512
    # weights a thread instead of once per 64. A 1-byte weight costs ~2.5 instructions (one
    # e4m3 -> f16 conversion per two, the widening to FP32, the FMA); at 4.3 TB/s an SM must
    # take ~16.5 weights a clock, and the wide tiles above spent ~8 instructions a weight in
    # all (ptxas, sm_90: 528 a thread for 64 weights at (4, 1024, 4)), past the 128 a clock its
    # schedulers issue. The tuner took (4, 512, 2) for fp8's gate/up (11.6 -> 10.1 us) and LM
    # head (67 -> 62), (4, 256, 1) for int8's (13.2 -> 11.3, 79 -> 66; the old tiles' times
    # from earlier runs): decode-b1 fp8 1,681 -> 1,785 tok/s, int8 1,524 -> 1,629
    # (BENCHMARKS.md runs 174 and 179). Four more narrow tiles, (2, 256, 1), (8, 256, 2),
    # (16, 256, 4) and (4, 128, 1), were never the fastest at any 1B matrix in fp8 or int8
    # (run 181) and only lengthened a quantized model's first tuning: dropped.
    (4, 256, 1),
    (4, 512, 2),
    # With the packed FP16 multiply-adds (`_half2_dot`), a thread keeps one FP32 sum per row
    # and 8 columns rather than 8, so 8 rows fit two warps at 60 registers: int8's gate/up
    # and both LM heads took it on an H100 (run 224), by 1% or less.
    (8, 512, 2),
)


def candidates(w: LinearWeight) -> tuple[GemvTile, ...]:
    """The tiles the tuner times for weight w: 1-byte weights have their own list."""
    return QUANTIZED_CONFIGS if isinstance(w, QuantizedWeight) else CONFIGS


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    config: GemvTile | None = None,
    swiglu: bool = False,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [1, K] @ w[N, K]^T (+ bias [N]) -> [1, N] in x's dtype. `config` = (BLOCK_N, BLOCK_K,
    num_warps).

    scale [N] (FP32): w holds quantized values (FP8 e4m3 or int8) and row n stands for
    w[n] * scale[n]; the result is x @ (w * scale)^T, each dot product in FP32.

    out_dtype: the result as `gemv(x, w).to(out_dtype)` gives it (rounded to x's dtype first),
    written by the kernel itself: the LM head's FP32 logits without a conversion kernel.

    swiglu=True: w is a packed [gate; up] projection [2I, K] and the result is
    silu(gate) * up [1, I], computed in the same kernel (the same bits as `swiglu(gemv(...))`).
    """
    n, k = w.shape
    block_n, block_k, warps = config or CONFIGS[0]
    if swiglu and (n % 2 or block_n < 2):
        raise KernelError(
            f"gemv(swiglu=True): w must have an even row count ([gate; up]) and the tile "
            f"BLOCK_N >= 2; got {n} rows and BLOCK_N {block_n}"
        )
    x, w = x.contiguous(), unit_last_stride(w)
    if swiglu and out_dtype not in (None, x.dtype):
        raise KernelError("gemv(swiglu=True) writes x's dtype; out_dtype must be None")
    if swiglu and bias is not None:
        raise KernelError("gemv(swiglu=True) takes no bias")
    out = torch.empty((1, n // 2 if swiglu else n), dtype=out_dtype or x.dtype, device=x.device)
    pdl = use_pdl(x.device)
    grid = (cdiv(n // 2, block_n // 2) if swiglu else cdiv(n, block_n),)
    if scale is not None and (scale.shape != (n,) or scale.dtype != torch.float32):
        raise KernelError(f"gemv: scale must be FP32 [{n}], got {scale.dtype} {list(scale.shape)}")
    _gemv_kernel[grid](
        x,
        w,
        out if bias is None else bias.contiguous(),  # unread without a bias
        w if scale is None else scale,  # any pointer when unscaled: never read
        out,
        n,
        k,
        w.stride(0),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        USE_PDL=pdl,
        GATED=swiglu,
        HAS_BIAS=bias is not None,
        SCALED=scale is not None,
        ONE_BYTE=w.element_size() == 1,
        INT8=w.dtype == torch.int8,
        num_warps=warps,
        launch_pdl=pdl,
    )
    return out
