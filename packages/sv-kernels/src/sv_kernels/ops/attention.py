"""Attention and what feeds it: RoPE with the KV-cache write (`rope_cache_write`), the q/k/v
projection fused with them (`qkv_rope_cache`), paged decode and varlen prefill attention over
the cache (an FP8 one with its `kv_scales`; an optional sliding window), and a decode step's
metadata (`decode_metadata`: block-table rows, cache slots, context lengths).
"""

from __future__ import annotations

from typing import NamedTuple, NoReturn

import torch
from torch import Tensor

from .. import cpu_ops, quantized_ops, reference
from ..linear_plan import CUBLAS, FewRowsTile, GemvTile, LinearPlan
from ..quantized import FP8Rows, LinearWeight, QuantizedWeight, ScaledProduct
from .checks import (
    check_bias,
    check_device,
    check_dims,
    check_float,
    check_int,
    check_len,
    fail,
    few_rows,
    on_cpu,
    on_cuda,
    shape_str,
)
from .linear_layers import linear, rms_norm


def _check_cache(op: str, k_cache: Tensor, v_cache: Tensor) -> None:
    check_dims(op, "k_cache", k_cache, 4, "[P, S, Hkv, D]")
    check_float(op, "k_cache", k_cache)
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        fail(
            op,
            f"v_cache {shape_str(v_cache)} {v_cache.dtype} must match "
            f"k_cache {shape_str(k_cache)} {k_cache.dtype}",
        )
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(-1) != 1:
            fail(op, f"{name} must be contiguous along its last dim (D)")


def _check_kv_scales(op: str, k_cache: Tensor, kv_scales: Tensor | None) -> None:
    """An FP8 cache needs its scales [2, Hkv] (FP32); any other cache takes none."""
    fp8 = k_cache.dtype == reference.FP8_KV_DTYPE
    if kv_scales is None:
        if fp8:
            fail(op, f"an {k_cache.dtype} cache needs kv_scales [2, Hkv]")
        return
    if not fp8:
        fail(op, f"kv_scales are for an FP8 cache, but the cache is {k_cache.dtype}")
    check_dims(op, "kv_scales", kv_scales, 2, "[2, Hkv]")
    if tuple(kv_scales.shape) != (2, k_cache.shape[2]) or kv_scales.dtype != torch.float32:
        fail(
            op,
            f"kv_scales must be float32 [2, {k_cache.shape[2]}] (K's and V's scale per KV "
            f"head), got {kv_scales.dtype} {shape_str(kv_scales)}",
        )
    if not kv_scales.is_contiguous():
        fail(op, "kv_scales must be contiguous")


def _check_block_tables(op: str, block_tables: Tensor, batch: int) -> None:
    check_dims(op, "block_tables", block_tables, 2, "[B, max_pages]")
    check_int(op, "block_tables", block_tables)
    check_len(op, "block_tables", block_tables, 0, batch, "one row per sequence")


def _check_query_and_cache(
    op: str, q: Tensor, layout: str, k_cache: Tensor, v_cache: Tensor, kv_scales: Tensor | None
) -> None:
    """The query (3-D `layout`, floating point) and the paged cache it attends to, together."""
    check_dims(op, "q", q, 3, layout)
    check_float(op, "q", q)
    _check_cache(op, k_cache, v_cache)
    _check_kv_scales(op, k_cache, kv_scales)
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if head_dim != k_cache.shape[3]:
        fail(op, f"q has head dim {head_dim}, the cache {k_cache.shape[3]}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        fail(op, f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if q.dtype != k_cache.dtype and k_cache.dtype != reference.FP8_KV_DTYPE:
        fail(op, f"q is {q.dtype} but the cache is {k_cache.dtype}")


def _check_rope_inputs(
    op: str, num_tokens: int, head_dim: int, positions: Tensor, cos: Tensor, sin: Tensor
) -> None:
    """RoPE's inputs beside q and k: one position per token, cos/sin [max_positions, D/2]."""
    if head_dim % 2 != 0:
        fail(op, f"the head dim must be even for RoPE, got {head_dim}")
    check_dims(op, "positions", positions, 1, "[T]")
    check_int(op, "positions", positions)
    check_len(op, "positions", positions, 0, num_tokens, "one per token")
    for name, table in (("cos", cos), ("sin", sin)):
        check_dims(op, name, table, 2, "[max_positions, D/2]")
        check_float(op, name, table)
        check_len(op, name, table, 1, head_dim // 2, "half the head dim")
    if sin.shape != cos.shape:
        fail(op, f"sin {shape_str(sin)} must have cos's shape {shape_str(cos)}")


def _check_slots(op: str, num_tokens: int, slot_mapping: Tensor) -> None:
    check_dims(op, "slot_mapping", slot_mapping, 1, "[T]")
    check_int(op, "slot_mapping", slot_mapping)
    check_len(op, "slot_mapping", slot_mapping, 0, num_tokens, "one per token")


class _RopeCacheArgs(NamedTuple):
    """RoPE's and the cache write's arguments, in the order the kernels and references take
    them (`*args`); built once per op call and handed to its helpers as one value."""

    positions: Tensor
    cos: Tensor
    sin: Tensor
    k_cache: Tensor
    v_cache: Tensor
    slot_mapping: Tensor
    kv_scales: Tensor | None


def _check_rope_cache_args(
    op: str, num_tokens: int, args: _RopeCacheArgs, **inputs: Tensor | None
) -> None:
    """RoPE's and the cache write's arguments for `num_tokens` tokens, the caches already through
    `_check_cache`; `inputs` (the op's own tensors) must share their device."""
    _check_rope_inputs(op, num_tokens, args.k_cache.shape[3], args.positions, args.cos, args.sin)
    _check_kv_scales(op, args.k_cache, args.kv_scales)
    _check_slots(op, num_tokens, args.slot_mapping)
    check_device(op, **inputs, **args._asdict())


def rope_cache_write(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    kv_scales: Tensor | None = None,
) -> Tensor:
    op = "rope_cache_write"
    _check_cache(op, k_cache, v_cache)
    args = _RopeCacheArgs(positions, cos, sin, k_cache, v_cache, slot_mapping, kv_scales)
    return _rope_cache_write(op, q, k, v, args)


def _rope_cache_write(op: str, q: Tensor, k: Tensor, v: Tensor, args: _RopeCacheArgs) -> Tensor:
    """`rope_cache_write` with the caches already through `_check_cache`."""
    check_dims(op, "q", q, 3, "[T, Hq, D]")
    check_dims(op, "k", k, 3, "[T, Hkv, D]")
    check_dims(op, "v", v, 3, "[T, Hkv, D]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(op, name, t)
    num_tokens, head_dim = q.shape[0], q.shape[2]
    if k.shape[0] != num_tokens or k.shape[2] != head_dim or v.shape != k.shape:
        fail(op, f"q {shape_str(q)}, k {shape_str(k)}, v {shape_str(v)} disagree on T, Hkv or D")
    if args.k_cache.shape[2:] != k.shape[1:]:
        fail(op, f"cache heads x dim {shape_str(args.k_cache)[1:]} do not match k {shape_str(k)}")
    _check_rope_cache_args(op, num_tokens, args, q=q, k=k, v=v)
    if on_cuda(q):
        from .. import triton_ops

        return triton_ops.rope_cache_write(q, k, v, *args)
    if on_cpu(q):
        return cpu_ops.rope_cache_write(q, k, v, *args)
    return reference.rope_cache_write(q, k, v, *args)


def qkv_rope_cache(
    x: Tensor | FP8Rows,
    qkv: LinearWeight,
    num_q_heads: int,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    kv_scales: Tensor | None = None,
    *,
    plan: LinearPlan = CUBLAS,
    bias: Tensor | None = None,
    qk_norms: tuple[Tensor, Tensor, float] | None = None,
) -> Tensor:
    """Attention's inputs from the normed hidden state x [T, K]: q, k, v = `linear(x, qkv)`
    (+ bias) split into Hq, Hkv and Hkv heads of the cache's D, then `rms_norm` of q and k per
    head where `qk_norms` (q's weight, k's weight, eps: Qwen3) is given, then
    `rope_cache_write`. Returns the rotated q [T, Hq, D].

    Without q/k norms, a CUDA call runs as one kernel (`triton_ops.qkv_rope_cache`: the matmul
    rotates and writes its own outputs, rounded as the ops in turn round them) where the plan gives
    its kernel a tile that holds whole RoPE pairs: one row the GEMV's, 2 to 16 rows of an
    unquantized weight the few-row kernel's. Anything else runs the ops in turn.
    """
    op = "qkv_rope_cache"
    _check_cache(op, k_cache, v_cache)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    rows = (num_q_heads + 2 * num_kv_heads) * head_dim
    args = _RopeCacheArgs(positions, cos, sin, k_cache, v_cache, slot_mapping, kv_scales)
    tile: GemvTile | FewRowsTile | None = None
    if qk_norms is None and isinstance(x, Tensor) and on_cuda(x) and x.dim() == 2:
        if x.shape[0] == 1:
            tile = plan.one_row_gemv
        elif few_rows(x) and not isinstance(qkv, QuantizedWeight):
            tile = plan.few_rows
    if tile is not None and isinstance(x, Tensor):
        from .. import triton_ops

        if triton_ops.qkv_rope_fits(tile[0], head_dim):
            return _fused_qkv_rope_cache(op, x, qkv, tile, num_q_heads, rows, bias, args)
    # An FP8 product's scales are applied by the RoPE kernel as it reads q, k and v (one
    # scaling kernel fewer per layer); a bias or q/k norms need the scaled values first.
    out = linear(x, qkv, plan=plan, bias=bias, defer_scales=bias is None and qk_norms is None)
    product = out.product if isinstance(out, ScaledProduct) else out
    if product.dim() != 2 or product.shape[1] != rows:
        _fail_qkv_rows(op, qkv, num_q_heads, rows)
    heads = [num_q_heads, num_kv_heads, num_kv_heads]
    q, k, v = product.view(product.shape[0], -1, head_dim).split_with_sizes(heads, dim=1)
    if isinstance(out, ScaledProduct):  # only CUDA's scaled_mm_tensorwise defers its scales
        from .. import triton_ops

        _check_rope_cache_args(op, product.shape[0], args, product=product)
        scales = (out.row_scale, out.col_scale, out.dtype)
        return triton_ops.rope_cache_write(q, k, v, *args, product_scales=scales)
    if qk_norms is not None:
        q_norm, k_norm, eps = qk_norms
        q, _ = rms_norm(q, q_norm, eps)
        k, _ = rms_norm(k, k_norm, eps)
    return _rope_cache_write(op, q, k, v, args)


def _fused_qkv_rope_cache(
    op: str,
    x: Tensor,
    qkv: LinearWeight,
    tile: GemvTile | FewRowsTile,
    num_q_heads: int,
    rows: int,
    bias: Tensor | None,
    args: _RopeCacheArgs,
) -> Tensor:
    """`qkv_rope_cache` as one kernel, its inputs checked here (the unfused path leaves x,
    the weight and the bias to `linear`)."""
    check_float(op, "x", x)
    if isinstance(qkv, QuantizedWeight):
        quantized_ops.check_linear(op, x, qkv)
        weight, scale = qkv.data, qkv.scale
    elif qkv.dim() != 2 or qkv.shape[1] != x.shape[1] or qkv.dtype != x.dtype:
        fail(
            op,
            f"qkv {qkv.dtype} {shape_str(qkv)} must be [N, K] of x's {x.dtype}, K = {x.shape[1]}",
        )
    else:
        weight, scale = qkv, None
    if qkv.shape[0] != rows:
        _fail_qkv_rows(op, qkv, num_q_heads, rows)
    if bias is not None:
        check_bias(op, bias, qkv, x)
    _check_rope_cache_args(op, x.shape[0], args, x=x, qkv=weight, bias=bias)
    from .. import triton_ops

    return triton_ops.qkv_rope_cache(x, weight, tile, num_q_heads, *args, bias=bias, scale=scale)


def _fail_qkv_rows(op: str, qkv: LinearWeight, num_q_heads: int, rows: int) -> NoReturn:
    fail(
        op,
        f"qkv has {qkv.shape[0]} rows, expected (Hq + 2 Hkv) x D = {rows} for {num_q_heads} "
        "query heads and the cache's KV heads and head dim",
    )


def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    kv_scales: Tensor | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    op = "paged_decode_attention"
    _check_query_and_cache(op, q, "[B, Hq, D]", k_cache, v_cache, kv_scales)
    batch = q.shape[0]
    _check_block_tables(op, block_tables, batch)
    check_dims(op, "seq_lens", seq_lens, 1, "[B]")
    check_int(op, "seq_lens", seq_lens)
    check_len(op, "seq_lens", seq_lens, 0, batch, "one per sequence")
    _check_window(op, sliding_window)
    check_device(
        op,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        kv_scales=kv_scales,
    )
    attention = reference.paged_decode_attention  # the spec's signature: each twin has it
    if on_cuda(q):
        from .. import triton_ops

        attention = triton_ops.paged_decode_attention
    elif on_cpu(q):
        attention = cpu_ops.paged_decode_attention
    return attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        scale,
        kv_scales=kv_scales,
        sliding_window=sliding_window,
    )


def _check_window(op: str, sliding_window: int | None) -> None:
    if sliding_window is not None and (
        not isinstance(sliding_window, int)
        or isinstance(sliding_window, bool)
        or sliding_window < 1
    ):
        fail(op, f"sliding_window must be a host int >= 1 or None, got {sliding_window!r}")


class DecodeTail(NamedTuple):
    """The last sequences of a packed batch when each feeds one token, as a mixed step's
    decodes do: their context lengths [n] and block-table rows [n, max_pages], as tensors of
    their own (each 16-byte aligned, as a decode step's are, so the decode kernel runs the
    variant a decode graph compiled). `prefill_attention` may attend their rows with the decode
    kernel; the result is the same."""

    seq_lens: Tensor
    block_tables: Tensor


def _check_decode_tail(
    op: str, tail: DecodeTail, cu_seqlens_q: Tensor, seq_lens: Tensor, block_tables: Tensor
) -> None:
    check_dims(op, "decode_tail.seq_lens", tail.seq_lens, 1, "[n]")
    check_int(op, "decode_tail.seq_lens", tail.seq_lens)
    n = tail.seq_lens.shape[0]
    if n > seq_lens.shape[0]:
        fail(op, f"decode_tail names {n} sequences; the batch has {seq_lens.shape[0]}")
    check_dims(op, "decode_tail.block_tables", tail.block_tables, 2, "[n, max_pages]")
    check_int(op, "decode_tail.block_tables", tail.block_tables)
    check_len(op, "decode_tail.block_tables", tail.block_tables, 0, n, "one row per sequence")
    check_device(
        op,
        cu_seqlens_q=cu_seqlens_q,
        tail_seq_lens=tail.seq_lens,
        tail_block_tables=tail.block_tables,
    )
    if not on_cpu(cu_seqlens_q):
        return  # device values are never read here (see `sv_kernels.ops`)
    # On the CPU the values are at hand: hold the caller to the tail's promise.
    batch = seq_lens.shape[0]
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1])[batch - n :]
    if bool((q_lens != 1).any()):
        fail(op, f"decode_tail's {n} sequences must feed one token each, got {q_lens.tolist()}")
    width = tail.block_tables.shape[1]
    if not torch.equal(tail.seq_lens, seq_lens[batch - n :]) or not torch.equal(
        tail.block_tables, block_tables[batch - n :, :width]
    ):
        fail(op, "decode_tail must hold the seq_lens and block-table rows of the last sequences")


def prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens: Tensor,
    block_tables: Tensor,
    scale: float,
    max_seqlen_q: int,
    kv_scales: Tensor | None = None,
    sliding_window: int | None = None,
    decode_tail: DecodeTail | None = None,
) -> Tensor:
    op = "prefill_attention"
    _check_query_and_cache(op, q, "[T, Hq, D]", k_cache, v_cache, kv_scales)
    check_dims(op, "seq_lens", seq_lens, 1, "[B]")
    check_int(op, "seq_lens", seq_lens)
    batch = seq_lens.shape[0]
    check_dims(op, "cu_seqlens_q", cu_seqlens_q, 1, "[B + 1]")
    check_int(op, "cu_seqlens_q", cu_seqlens_q)
    check_len(op, "cu_seqlens_q", cu_seqlens_q, 0, batch + 1, "B + 1 offsets")
    _check_block_tables(op, block_tables, batch)
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        fail(op, f"max_seqlen_q must be a host int >= 0, got {max_seqlen_q!r}")
    _check_window(op, sliding_window)
    check_device(
        op,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        cu_seqlens_q=cu_seqlens_q,
        seq_lens=seq_lens,
        block_tables=block_tables,
        kv_scales=kv_scales,
    )
    if decode_tail is not None:
        _check_decode_tail(op, decode_tail, cu_seqlens_q, seq_lens, block_tables)
    attention = reference.prefill_attention  # the spec's signature: each twin has it
    if on_cuda(q):
        from .. import triton_ops

        attention = triton_ops.prefill_attention
    elif on_cpu(q):
        attention = cpu_ops.prefill_attention
    return attention(
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        seq_lens,
        block_tables,
        scale,
        max_seqlen_q,
        kv_scales=kv_scales,
        sliding_window=sliding_window,
        decode_tail=decode_tail,
    )


def decode_metadata(
    block_tables: Tensor, table_rows: Tensor, positions: Tensor, page_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(block-table rows, cache slots, context lengths) of a decode step: one token per
    sequence; see `reference.decode_metadata`. Positions must lie inside each row's pages."""
    op = "decode_metadata"
    check_dims(op, "block_tables", block_tables, 2, "[S, max_pages]")
    check_int(op, "block_tables", block_tables)
    check_dims(op, "table_rows", table_rows, 1, "[B]")
    check_int(op, "table_rows", table_rows)
    check_dims(op, "positions", positions, 1, "[B]")
    check_int(op, "positions", positions)
    check_len(op, "positions", positions, 0, table_rows.shape[0], "one per sequence")
    if page_size < 1:
        fail(op, f"page_size must be positive, got {page_size}")
    check_device(op, block_tables=block_tables, table_rows=table_rows, positions=positions)
    if on_cuda(block_tables):
        from .. import triton_ops

        return triton_ops.decode_metadata(block_tables, table_rows, positions, page_size)
    return reference.decode_metadata(block_tables, table_rows, positions, page_size)
