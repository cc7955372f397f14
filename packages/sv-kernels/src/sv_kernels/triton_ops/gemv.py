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
`tune_gemv` times both (and a few tile shapes) for each weight shape the model has, and
`gemv_config` tells the caller what won. The model asks only outside CUDA-graph capture.

Two prologues fold the op that produces x into the GEMV, because at batch 1 that op is a
launch of its own for a few KB of work (about 2 us each, 48 of them per decode step):
  - RMSNORM: x = rms_norm(h + residual) * norm_weight, and program 0 also writes h + residual
    (the new residual stream). Every program needs the whole row's sum of squares first, so
    it reads h and the residual twice (a first pass for the sum); they are a few KB from L2.
  - SWIGLU: x = silu(gate) * up, read from the packed gate/up projection.
Both round x exactly where the separate kernels round their outputs, so the fused and the
unfused step give the same x (see `reference.rms_norm`, `reference.swiglu`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv

PLAIN, RMSNORM, SWIGLU = 0, 1, 2  # the PROLOGUE constexpr: how x is made


@triton.jit
def _residual_sum(h_ptr, res_ptr, cols, col_mask, HAS_RESIDUAL: tl.constexpr):
    """s = h + residual (FP32 add, rounded to h's dtype: it is the residual stream), as FP32."""
    s = tl.load(h_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        s += tl.load(res_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    return s.to(h_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    res_ptr,
    norm_w_ptr,
    sum_out_ptr,
    eps,
    N,
    K,
    stride_wn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PROLOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    rstd = 0.0
    if PROLOGUE == 1:  # RMSNORM: the row's mean square first (x_ptr holds h)
        squares = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_mask = cols < K
            s = _residual_sum(x_ptr, res_ptr, cols, col_mask, HAS_RESIDUAL)
            squares += s * s
            if pid == 0:
                tl.store(sum_out_ptr + cols, s.to(sum_out_ptr.dtype.element_ty), mask=col_mask)
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        if PROLOGUE == 1:
            s = _residual_sum(x_ptr, res_ptr, cols, col_mask, HAS_RESIDUAL)
            normed = (s * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
            nw = tl.load(norm_w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            x = (nw * normed).to(x_ptr.dtype.element_ty).to(tl.float32)
        elif PROLOGUE == 2:  # SWIGLU: x_ptr holds [gate (K) | up (K)]
            gate = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            up = tl.load(x_ptr + K + cols, mask=col_mask, other=0.0).to(tl.float32)
            silu = gate / (1.0 + tl.exp(-gate))
            x = (silu * up).to(x_ptr.dtype.element_ty).to(tl.float32)
        else:
            x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_mask)


# (BLOCK_N, BLOCK_K, num_warps) candidates; the tuner keeps the fastest per shape.
# On the H200 the narrowest, longest tiles won on every Llama 3.2 1B shape (2 x 1024, 4 warps:
# many programs in flight, each streaming two long rows), so the list leans that way.
CONFIGS: tuple[tuple[int, int, int], ...] = (
    (2, 1024, 4),
    (2, 2048, 4),
    (2, 2048, 8),
    (2, 512, 2),
    (4, 1024, 8),
    (4, 512, 4),
    (8, 512, 8),
)

# (N, K, dtype) -> the winning config, or None where cuBLAS won.
_CHOICE: dict[tuple[int, int, torch.dtype], tuple[int, int, int] | None] = {}


def gemv(
    x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int] | None = None
) -> torch.Tensor:
    """x [1, K] @ w[N, K]^T -> [1, N] in x's dtype. `config` = (BLOCK_N, BLOCK_K, num_warps)."""
    x = x.contiguous()
    out = torch.empty((1, w.shape[0]), dtype=x.dtype, device=x.device)
    _launch(x, w, out, config, PLAIN, x.shape[1])
    return out


def gemv_rms_norm(
    h: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    w: torch.Tensor,
    config: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rms_norm(h, norm_weight, eps, residual)` then `@ w^T`, for one row h [1, K].

    Returns (y [1, N], s [1, K]) where s = h + residual is the new residual stream (h itself
    when residual is None), as `reference.rms_norm` returns it.
    """
    h = h.contiguous()
    out = torch.empty((1, w.shape[0]), dtype=h.dtype, device=h.device)
    total = torch.empty_like(h)
    res = residual.contiguous() if residual is not None else h
    _launch(
        h,
        w,
        out,
        config,
        RMSNORM,
        h.shape[1],
        res,
        norm_weight.contiguous(),
        total,
        eps,
        has_residual=residual is not None,
    )
    return out, total


def gemv_swiglu(
    gate_up: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int] | None = None
) -> torch.Tensor:
    """`swiglu(gate_up)` [1, 2K] -> [1, K], then `@ w[N, K]^T` -> [1, N]."""
    gate_up = gate_up.contiguous()
    out = torch.empty((1, w.shape[0]), dtype=gate_up.dtype, device=gate_up.device)
    _launch(gate_up, w, out, config, SWIGLU, gate_up.shape[1] // 2)
    return out


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    config: tuple[int, int, int] | None,
    prologue: int,
    k: int,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    total: torch.Tensor | None = None,
    eps: float = 0.0,
    has_residual: bool = False,
) -> None:
    n = w.shape[0]
    block_n, block_k, warps = config or CONFIGS[0]
    if w.stride(1) != 1:
        w = w.contiguous()
    _gemv_kernel[(cdiv(n, block_n),)](
        x,
        w,
        out,
        residual if residual is not None else x,  # unused unless the prologue reads them
        norm_weight if norm_weight is not None else x,
        total if total is not None else out,
        eps,
        n,
        k,
        w.stride(0),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PROLOGUE=prologue,
        HAS_RESIDUAL=has_residual,
        num_warps=warps,
    )


def gemv_config(w: torch.Tensor) -> tuple[int, int, int] | None:
    """The tuned config for w's shape, None if cuBLAS won or the shape was never tuned."""
    return _CHOICE.get((w.shape[0], w.shape[1], w.dtype))


def tune_gemv(weights: list[torch.Tensor]) -> dict[tuple[int, int], str]:
    """Time cuBLAS and every config on each distinct weight shape; remember the winners.

    Returns shape -> a short description of the choice, for logs. Must not run while a CUDA
    graph is being captured (it synchronizes).
    """
    from triton.testing import do_bench

    report: dict[tuple[int, int], str] = {}
    for w in weights:
        key = (w.shape[0], w.shape[1], w.dtype)
        if key in _CHOICE or w.dim() != 2:
            continue
        x = torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device)
        cublas = do_bench(lambda w=w, x=x: torch.nn.functional.linear(x, w), return_mode="median")
        best, best_ms = None, cublas
        for config in CONFIGS:
            ms = do_bench(lambda w=w, x=x, c=config: gemv(x, w, c), return_mode="median")
            if ms < best_ms:
                best, best_ms = config, ms
        _CHOICE[key] = best
        name = "cuBLAS" if best is None else f"triton gemv {best}"
        report[(w.shape[0], w.shape[1])] = (
            f"{name}: {best_ms * 1e3:.1f} us (cuBLAS {cublas * 1e3:.1f} us)"
        )
    return report
