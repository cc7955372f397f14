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
`tune_gemv` times both (and a few tile shapes) for each weight shape the model has and returns
a `LinearPlan` per weight; its caller keeps them and passes each to `ops.linear`.

Quantized weights (FP8 e4m3 or int8, see `sv_kernels.quantized`) stream through the same
kernel: it loads 1-byte values, converts them to FP32 in registers and multiplies each row's
sum by that row's scale at the end, so a batch-1 step reads half the bytes of BF16. Three
things differ for them, each for bandwidth: they have their own candidate tiles
(`QUANTIZED_CONFIGS`: more rows per program, wider slices, and narrow slices on one or two
warps that spend fewer instructions per weight), they are loaded 8 per thread so that
x needs no trip through shared memory (`_dot_rows`), and int8 converts through FP32 bit
patterns instead of the quarter-rate int-to-float instruction (`_int8_to_f32`). FP8 uses the
hardware's e4m3 -> f16 conversion (two values per instruction), then f16 -> f32.

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

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import tuning_cache
from ..errors import KernelError
from ..graphs import copies_to_overflow_l2, graph_ms_per_call
from ..linear_plan import (
    FEW_ROWS,
    MANY_ROWS,
    QUANTIZED_PATHS,
    GemvTile,
    LinearPlan,
    QuantizedPath,
    TunedLinear,
)
from ..quantized import LinearWeight, QuantizedWeight
from ..quantized_ops import (
    PATH_CALLS,
    W8A16_DTYPES,
    W8A16_MAX_ROWS,
    dequantized_linear,
    scaled_mm_fits,
)
from . import few_rows
from ._common import INTERPRET, cdiv, unit_last_stride, use_pdl, wait_for_prior_kernels
from .w8a16 import TILES as W8A16_TILES

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
    acc = _to_f32(w0, INT8) * x0[None, :] + _to_f32(w1, INT8) * x1[None, :]
    for k0 in range(2 * BLOCK_K, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        if ONE_BYTE:
            cols = tl.max_contiguous(cols, 8)
        col_mask = cols < K
        x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += _to_f32(w, INT8) * x[None, :]
    return tl.sum(acc, axis=1)


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


# Tuning replays each candidate from a CUDA graph, as the decode step runs it: timing eager
# calls measured the host's launch cost too, which on a slow host made cuBLAS (a cheaper launch
# from Python) "win" shapes where its kernel is the slower one. Each replay makes
# _TUNE_CALLS calls over enough copies of the weight to overflow L2, as a decode step, which
# streams 2.5 GB of weights, sees them: from DRAM.
_TUNE_CALLS = 20


def tune_gemv(
    weights: list[LinearWeight],
    cache: tuning_cache.TuningCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TunedLinear]:
    """Time cuBLAS and every candidate tile (`candidates`) on each distinct weight shape; one
    result per weight.

    cache: a `tuning_cache` file. Shapes it holds for this GPU and software (see
    `tuning_fingerprint`) are not timed again, unless `cache.retune`; shapes timed here are
    added to it. `progress` hears one line before the first shape that has to be timed (a few
    seconds in all). Weights of one shape share one result. Remembers nothing itself.

    A quantized weight is also timed on each path of `_quantized_paths` (dequantize + cuBLAS,
    the 8-bit-weight matmul, FP8 tensor cores) at each of TUNED_ROWS, for its plan's
    `quantized_few_rows`, `quantized_many_rows` and `quantized_prompt_rows` (each kept under a
    cache key of its own).

    Must not run while a CUDA graph is being captured (it synchronizes and captures graphs of
    its own).
    """
    if not weights:
        return []
    fingerprint = tuning_fingerprint(weights[0].device)
    kept = {}
    if cache is not None and not cache.retune:
        kept = tuning_cache.load(cache.path, fingerprint)
    measured: dict[str, tuning_cache.TunedShape] = {}
    by_shape: dict[str, TunedLinear] = {}

    def announce(what: str) -> None:  # one progress line, before the first timing of any kind
        if progress is not None and not measured:
            where = f" (kept in {cache.path})" if cache is not None else ""
            progress(f"timing {what} against cuBLAS{where}")

    for w in weights:
        shape = _shape_key(w)
        if shape in by_shape:  # a second matrix of a shape already done
            continue
        tuned = kept.get(shape)
        tiles = candidates(w)
        if tuned is not None and tuned.choice is not None and tuned.choice not in tiles:
            tuned = None  # not a candidate of this code (a hand-edited file): time it
        source = "kept from the tuning cache"
        if tuned is None:
            announce("the batch-1 GEMV tiles")
            cublas, best, best_ms = _time_candidates(w)
            tuned = measured[shape] = tuning_cache.TunedShape(best, best_ms * 1e3, cublas * 1e3)
            source = "measured"
        tile = None if tuned.choice is None else tiles[tiles.index(tuned.choice)]
        name = "cuBLAS" if tile is None else f"triton gemv {tile}"
        summary = f"{name}: {tuned.us:.1f} us (cuBLAS {tuned.cublas_us:.1f} us), {source}"
        paths: dict[int, QuantizedPath] = dict.fromkeys(TUNED_ROWS, "cublas")
        if isinstance(w, QuantizedWeight) and _quantized_paths(w, FEW_ROWS) != ["cublas"]:
            for rows in paths:
                key = f"{shape}, {rows} rows"
                timed = kept.get(key)
                if timed is None or _quantized_path(timed.choice) not in _quantized_paths(w, rows):
                    announce("the quantized weights' paths")
                    timed = measured[key] = _time_quantized_paths(w, rows)
                paths[rows] = _quantized_path(timed.choice)
                summary += (
                    f"; at {rows} rows {paths[rows]}: {timed.us:.1f} us "
                    f"(dequantize + cuBLAS {timed.cublas_us:.1f} us)"
                )
        plan = LinearPlan(
            one_row_gemv=tile,
            quantized_few_rows=paths[FEW_ROWS],
            quantized_many_rows=paths[MANY_ROWS],
            quantized_prompt_rows=paths[PROMPT_ROWS],
        )
        by_shape[shape] = TunedLinear(plan, summary)
    if cache is not None and measured:
        tuning_cache.store(cache.path, fingerprint, measured)
    return [by_shape[_shape_key(w)] for w in weights]


def _shape_key(w: LinearWeight) -> str:
    """A weight shape as the tuning cache names it: "3072x2048 torch.bfloat16", or for a
    quantized one "3072x2048 torch.float8_e4m3fn per-row scales -> torch.bfloat16"."""
    if isinstance(w, QuantizedWeight):
        return f"{w.shape[0]}x{w.shape[1]} {w.data.dtype} per-row scales -> {w.dtype}"
    return f"{w.shape[0]}x{w.shape[1]} {w.dtype}"


# The row counts at which a quantized weight's paths are timed, one per band of its plan: the
# most rows of the few-row and many-row bands, and for the prompt-row band a quarter of a
# step's default token budget (its choice held at 2,048 and 8,192 rows alike: BENCHMARKS.md
# run 152).
PROMPT_ROWS = 2048
TUNED_ROWS = (FEW_ROWS, MANY_ROWS, PROMPT_ROWS)


def _fp8_tensor_cores(device: torch.device) -> bool:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= (8, 9)


def _cublas(x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):
        return dequantized_linear(x, w)
    return torch.nn.functional.linear(x, w)


def _gemv_call(x: torch.Tensor, w: LinearWeight, config: GemvTile) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):
        return gemv(x, w.data, config, scale=w.scale)
    return gemv(x, w, config)


def _quantized_paths(w: QuantizedWeight, rows: int) -> list[QuantizedPath]:
    """The paths `ops.linear` can take for a call of w on its device with `rows` rows that no
    GEMV tile takes."""
    paths: list[QuantizedPath] = ["cublas"]
    if scaled_mm_fits(w) and _fp8_tensor_cores(w.device):
        paths += ["scaled_mm", "scaled_mm_tensorwise"]
    # the dtype of the activations it will meet, and no more rows than it takes
    if w.dtype in W8A16_DTYPES and rows <= W8A16_MAX_ROWS:
        paths.append("w8a16")
    return paths


def _quantized_path(choice: tuple[int, ...] | None) -> QuantizedPath:
    """A kept choice as a path: None is cuBLAS, (i,) the i-th of QUANTIZED_PATHS (an index
    past the list, from a hand-edited file, reads as cuBLAS and is timed again)."""
    if choice is None or len(choice) != 1 or not 0 < choice[0] < len(QUANTIZED_PATHS):
        return "cublas"
    return QUANTIZED_PATHS[choice[0]]


def _time_quantized_paths(w: QuantizedWeight, rows: int) -> tuning_cache.TunedShape:
    """Every path of `_quantized_paths(w, rows)` at `rows` rows: the fastest path's index in
    QUANTIZED_PATHS as the choice, None when dequantize + cuBLAS wins."""
    copies = copies_to_overflow_l2(w)
    x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
    times = {
        path: graph_ms_per_call(
            [functools.partial(PATH_CALLS[path], x, c) for c in copies], _TUNE_CALLS
        )
        for path in _quantized_paths(w, rows)
    }
    best = min(times, key=lambda path: times[path])
    choice = None if best == "cublas" else (QUANTIZED_PATHS.index(best),)
    return tuning_cache.TunedShape(choice, times[best] * 1e3, times["cublas"] * 1e3)


def tuning_fingerprint(device: torch.device) -> str:
    """What a kept tuning result is valid for: this GPU model, these torch and Triton versions
    and these candidate lists (their hash; the few-row tiles' too, kept in the same file)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    lists = (CONFIGS, QUANTIZED_CONFIGS, few_rows.CONFIGS, QUANTIZED_PATHS, W8A16_TILES)
    configs = hashlib.sha256(repr(lists).encode()).hexdigest()[:8]
    return (
        f"{torch.cuda.get_device_name(index)} (sm {major}.{minor}), torch {torch.__version__}, "
        f"triton {triton.__version__}, configs {configs}"
    )


@dataclass(frozen=True)
class GemvTimes:
    """One weight shape's batch-1 timings: cuBLAS (on the matrix dequantized, for a quantized
    weight) and every candidate tile, in ms per call."""

    cublas_ms: float
    tiles: dict[GemvTile, float]

    def best(self) -> tuple[GemvTile | None, float]:
        """The fastest tile and its ms, or (None, cuBLAS's ms) when no tile beats cuBLAS."""
        best: tuple[GemvTile | None, float] = (None, self.cublas_ms)
        for tile, ms in self.tiles.items():
            if ms < best[1]:
                best = (tile, ms)
        return best


def time_tiles(w: LinearWeight) -> GemvTimes:
    """Time cuBLAS and every candidate tile of `candidates(w)` on weight w, as the tuner does:
    graph replays over enough copies of w to overflow L2. Must not run while a CUDA graph is
    being captured."""
    copies = copies_to_overflow_l2(w)
    x = torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device)
    calls = [functools.partial(_cublas, x, c) for c in copies]
    cublas = graph_ms_per_call(calls, _TUNE_CALLS)
    tiles = {}
    for config in candidates(w):
        calls = [functools.partial(_gemv_call, x, c, config) for c in copies]
        tiles[config] = graph_ms_per_call(calls, _TUNE_CALLS)
    return GemvTimes(cublas, tiles)


def _time_candidates(w: LinearWeight) -> tuple[float, GemvTile | None, float]:
    """(cuBLAS ms, the best config or None if cuBLAS won, its ms) per call, for weight w (a
    quantized one: cuBLAS on it dequantized, as `ops.linear` would run it without a tile)."""
    times = time_tiles(w)
    best, best_ms = times.best()
    return times.cublas_ms, best, best_ms
