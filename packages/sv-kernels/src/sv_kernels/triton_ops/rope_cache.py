# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""RoPE on q and k fused with the paged KV-cache write, in one kernel.

Grid (token tiles, 1 + query-head blocks). A program owns TILE_T consecutive tokens and works
on [TILE_T, heads, D/2] tiles: all its loads and stores are issued at once (no loop over
tokens, no per-token branch), and the positions, slots and cos/sin rows of the tile arrive in
one load each. Program (b, 0) rotates the tile's key heads and writes them and the value heads
into the tokens' cache slots (a token whose slot is negative is padding: masked out); programs
(b, 1..) rotate blocks of query heads into a new tensor. Splitting the query heads over several
programs keeps the work per program about even (Hq*D vs 2*Hkv*D elements).

TILE_T trades programs for bytes in flight: a decode batch (one token per sequence, a few
hundred tokens) keeps TILE_T = 1 so that it still spreads over every SM; a long prompt uses
larger tiles, which makes fewer, fatter programs.

`rope_cache_epilogue` is the same rotation and cache write as the last step of a q/k/v matmul
(the batch-1 GEMV in `qkv_rope_cache`, the few-row kernel), on a tile of its sums; `RopeCache`
carries its arguments.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference import FP8_KV_MAX
from ._common import cdiv, next_pow2, num_sms, unit_last_stride, use_pdl, wait_for_prior_kernels

# Token tiles are grown while the grid keeps at least this many programs per SM. Measured on
# the H200 (graph-timed, run of 2026-11-30): at 2,048 tokens one token per program did best
# (0.70 of copy bandwidth), at 8,192 two to four (0.81; one-token programs with 4 warps: 0.70).
_MIN_PROGRAMS_PER_SM = 32
_MAX_TILE_T = 8
# Two warps: a program moves only a few KB; more warps per program measured slower.
_NUM_WARPS = 2
_FP8_MAX = tl.constexpr(FP8_KV_MAX)


@triton.jit
def _load_halves(
    src_ptr,
    offsets,
    mask,
    row_scale,
    col_scale_ptr,
    cols,
    DTYPE: tl.constexpr,
    HALF: tl.constexpr,
    SCALED: tl.constexpr,
):
    """The two halves of a [tokens, heads, D/2] tile at `offsets` (its columns of the q/k/v
    projection: `cols`), in FP32. SCALED: src is an FP8 matmul's unscaled FP32 product (a
    `ScaledProduct`); each value is (p * its token's scale) * its column's, rounded to DTYPE,
    which is what `reference.scale_product` hands the unfused path."""
    x1 = tl.load(src_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + offsets + HALF, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        c1 = tl.load(col_scale_ptr + cols, mask=mask, other=0.0)
        c2 = tl.load(col_scale_ptr + cols + HALF, mask=mask, other=0.0)
        x1 = ((x1 * row_scale) * c1).to(DTYPE).to(tl.float32)
        x2 = ((x2 * row_scale) * c2).to(DTYPE).to(tl.float32)
    return x1, x2


@triton.jit
def _rotate(x1, x2, cos, sin):
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _saturate(x):
    """Clamp to e4m3's largest finite value: past it a cast would give NaN (no infinity)."""
    return tl.minimum(tl.maximum(x, -_FP8_MAX), _FP8_MAX)


@triton.jit
def _rope_cache_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    kv_scales_ptr,
    row_scale_ptr,
    col_scale_ptr,
    q_out_ptr,
    num_tokens,
    num_q_heads,
    num_kv_heads,
    num_positions,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_kc_page,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_page,
    stride_vc_slot,
    stride_vc_head,
    stride_qo_t,
    stride_qo_h,
    PAGE_SIZE: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    TILE_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    SCALED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    part = tl.program_id(1)
    tokens = tl.program_id(0).to(tl.int64) * TILE_T + tl.arange(0, TILE_T)
    t_mask = tokens < num_tokens
    DTYPE: tl.constexpr = q_out_ptr.dtype.element_ty  # q's, and the rotated k's before the cache
    HEAD_DIM: tl.constexpr = 2 * HALF
    row_scale = 1.0
    if SCALED:
        row_scale = tl.load(row_scale_ptr + tokens, mask=t_mask, other=0.0)[:, None, None]
    # The columns of a head's first half in the q/k/v projection, per (token, head, pair).
    no_cols = tl.zeros([TILE_T, 1, 1], tl.int32)
    positions = tl.load(positions_ptr + tokens, mask=t_mask, other=0).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < HALF
    # A position outside the table cannot be reported without a host sync; it reads cos = sin
    # = 0 (a zero rotation) instead of faulting. The model bounds positions by the table size.
    in_table = t_mask & (positions >= 0) & (positions < num_positions)
    angle_offsets = positions[:, None] * stride_cos + d[None, :]
    angle_mask = in_table[:, None] & d_mask[None, :]
    cos = tl.load(cos_ptr + angle_offsets, mask=angle_mask, other=0.0)[:, None, :]
    sin = tl.load(sin_ptr + angle_offsets, mask=angle_mask, other=0.0)[:, None, :]

    if part == 0:
        slots = tl.load(slots_ptr + tokens, mask=t_mask, other=-1).to(tl.int64)
        write = t_mask & (slots >= 0)  # a negative slot is padding: nothing to write
        kv_heads = tl.arange(0, BLOCK_HKV)
        kv_mask = (
            write[:, None, None] & (kv_heads < num_kv_heads)[None, :, None] & d_mask[None, None, :]
        )
        kv = kv_heads[None, :, None]
        k_offsets = tokens[:, None, None] * stride_kt + kv * stride_kh + d[None, None, :]
        k_cols = no_cols + (num_q_heads + kv) * HEAD_DIM + d[None, None, :]
        k1, k2 = _load_halves(
            k_ptr, k_offsets, kv_mask, row_scale, col_scale_ptr, k_cols, DTYPE, HALF, SCALED
        )
        k1, k2 = _rotate(k1, k2, cos, sin)
        # Round to k's dtype first (the rotated k), then to the cache's, as the reference does.
        k1 = k1.to(DTYPE)
        k2 = k2.to(DTYPE)
        if FP8_CACHE:  # x / scale of its head, saturated (see reference.quantize_kv)
            head_ok = kv_heads < num_kv_heads
            k_scale = tl.load(kv_scales_ptr + kv_heads, mask=head_ok, other=1.0)[None, :, None]
            v_scale = tl.load(kv_scales_ptr + num_kv_heads + kv_heads, mask=head_ok, other=1.0)
            v_scale = v_scale[None, :, None]
            k1 = _saturate(k1.to(tl.float32) / k_scale)
            k2 = _saturate(k2.to(tl.float32) / k_scale)
        k1 = k1.to(k_cache_ptr.dtype.element_ty)
        k2 = k2.to(k_cache_ptr.dtype.element_ty)
        pages = tl.where(write, slots // PAGE_SIZE, 0)
        in_page = tl.where(write, slots % PAGE_SIZE, 0)
        kc_offsets = (pages * stride_kc_page + in_page * stride_kc_slot)[:, None, None]
        kc_offsets += kv * stride_kc_head + d[None, None, :]
        tl.store(k_cache_ptr + kc_offsets, k1, mask=kv_mask)
        tl.store(k_cache_ptr + kc_offsets + HALF, k2, mask=kv_mask)

        v_offsets = tokens[:, None, None] * stride_vt + kv * stride_vh + d[None, None, :]
        vc_offsets = (pages * stride_vc_page + in_page * stride_vc_slot)[:, None, None]
        vc_offsets += kv * stride_vc_head + d[None, None, :]
        v_cols = no_cols + (num_q_heads + num_kv_heads + kv) * HEAD_DIM + d[None, None, :]
        v1, v2 = _load_halves(
            v_ptr, v_offsets, kv_mask, row_scale, col_scale_ptr, v_cols, DTYPE, HALF, SCALED
        )
        if FP8_CACHE:
            v1 = _saturate(v1 / v_scale)
            v2 = _saturate(v2 / v_scale)
        tl.store(v_cache_ptr + vc_offsets, v1.to(v_cache_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(v_cache_ptr + vc_offsets + HALF, v2.to(v_cache_ptr.dtype.element_ty), mask=kv_mask)
    else:
        q_heads = (part - 1) * BLOCK_HQ + tl.arange(0, BLOCK_HQ)
        qh = q_heads[None, :, None]
        q_mask = (
            t_mask[:, None, None] & (q_heads < num_q_heads)[None, :, None] & d_mask[None, None, :]
        )
        q_offsets = tokens[:, None, None] * stride_qt + qh * stride_qh + d[None, None, :]
        q_cols = no_cols + qh * HEAD_DIM + d[None, None, :]
        q1, q2 = _load_halves(
            q_ptr, q_offsets, q_mask, row_scale, col_scale_ptr, q_cols, DTYPE, HALF, SCALED
        )
        q1, q2 = _rotate(q1, q2, cos, sin)
        out = q_out_ptr + tokens[:, None, None] * stride_qo_t + qh * stride_qo_h + d[None, None, :]
        tl.store(out, q1.to(q_out_ptr.dtype.element_ty), mask=q_mask)
        tl.store(out + HALF, q2.to(q_out_ptr.dtype.element_ty), mask=q_mask)


class RopeCache:
    """What a q/k/v projection's RoPE epilogue takes besides the projection (see
    `rope_cache_write`), as kernel arguments: `args(q)`, the one tuple `rope_cache_epilogue`
    unpacks (a kernel takes it as one argument), and `constexprs()`. `RopeCache.none(out)`
    stands in for a kernel run without the epilogue (pointers never read)."""

    def __init__(
        self,
        num_q_heads: int,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_scales: torch.Tensor | None = None,
    ) -> None:
        if cos.stride(0) != sin.stride(0) or cos.stride(1) != 1 or sin.stride(1) != 1:
            cos, sin = cos.contiguous(), sin.contiguous()
        self.num_q_heads = num_q_heads
        self.positions, self.slot_mapping = positions.contiguous(), slot_mapping.contiguous()
        self.cos, self.sin, self.k_cache, self.v_cache = cos, sin, k_cache, v_cache
        self.kv_scales = kv_scales

    @property
    def head_dim(self) -> int:
        return int(self.k_cache.shape[3])

    def args(self, q: torch.Tensor) -> tuple[object, ...]:
        k_cache, v_cache = self.k_cache, self.v_cache
        return (
            self.positions,
            self.cos,
            self.sin,
            self.slot_mapping,
            q,
            k_cache,
            v_cache,
            self.kv_scales if self.kv_scales is not None else self.slot_mapping,
            self.cos.stride(0),
            self.cos.shape[0],
            q.stride(0),
            *k_cache.stride()[:3],
            *v_cache.stride()[:3],
        )

    def constexprs(self) -> dict[str, object]:
        return {
            "NUM_Q_HEADS": self.num_q_heads,
            "NUM_KV_HEADS": self.k_cache.shape[2],
            "HEAD_DIM": self.head_dim,
            "PAGE_SIZE": self.k_cache.shape[1],
            "FP8_CACHE": self.kv_scales is not None,
        }

    @staticmethod
    def none(out: torch.Tensor) -> tuple[tuple[object, ...], dict[str, object]]:
        """Arguments for a kernel launched without the epilogue: `out` for every pointer."""
        args: tuple[object, ...] = (out,) * 8 + (0,) * 9
        constexprs: dict[str, object] = {
            "NUM_Q_HEADS": 1,
            "NUM_KV_HEADS": 1,
            "HEAD_DIM": 2,
            "PAGE_SIZE": 1,
            "FP8_CACHE": False,
        }
        return args, constexprs


@triton.jit
def rope_cache_epilogue(
    y1,
    y2,
    m,
    m_mask,
    head,
    j,
    rope_cache,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    FP8_CACHE: tl.constexpr,
):
    """Finish a tile of the packed [q; k; v] projection: y1, y2 [BLOCK_M, P] (FP32, rounded to
    x's dtype) are features j [P] and j + D/2 of one `head` for the tokens m [BLOCK_M] (m_mask:
    real ones). A query head's pairs are rotated and stored to q_out [M, Hq, D]; a key head's
    rotated, rounded to q's dtype and written to the tokens' cache slots; a value head's
    written as they are. Rounding and saturation as `rope_cache_write`'s. `rope_cache`: the
    pointers and strides of `RopeCache.args`, as one tuple."""
    (
        positions_ptr,
        cos_ptr,
        sin_ptr,
        slots_ptr,
        q_out_ptr,
        k_cache_ptr,
        v_cache_ptr,
        kv_scales_ptr,
        stride_cos,
        num_positions,
        stride_qm,
        stride_kc_page,
        stride_kc_slot,
        stride_kc_head,
        stride_vc_page,
        stride_vc_slot,
        stride_vc_head,
    ) = rope_cache
    HALF: tl.constexpr = HEAD_DIM // 2
    if head < NUM_Q_HEADS + NUM_KV_HEADS:  # q or k: rotate
        positions = tl.load(positions_ptr + m, mask=m_mask, other=0).to(tl.int64)
        # Outside the table: cos = sin = 0, as `rope_cache_write` reads it.
        in_table = (m_mask & (positions >= 0) & (positions < num_positions))[:, None]
        angles = positions[:, None] * stride_cos + j[None, :]
        cos = tl.load(cos_ptr + angles, mask=in_table, other=0.0)
        sin = tl.load(sin_ptr + angles, mask=in_table, other=0.0)
        y1, y2 = y1 * cos - y2 * sin, y2 * cos + y1 * sin
    if head < NUM_Q_HEADS:
        q_out = q_out_ptr + m[:, None] * stride_qm + head * HEAD_DIM + j[None, :]
        tl.store(q_out, y1.to(q_out_ptr.dtype.element_ty), mask=m_mask[:, None])
        tl.store(q_out + HALF, y2.to(q_out_ptr.dtype.element_ty), mask=m_mask[:, None])
    else:
        slots = tl.load(slots_ptr + m, mask=m_mask, other=-1).to(tl.int64)
        write = (m_mask & (slots >= 0))[:, None]  # a negative slot is padding: not written
        page = tl.where(slots >= 0, slots // PAGE_SIZE, 0)[:, None]
        in_page = tl.where(slots >= 0, slots % PAGE_SIZE, 0)[:, None]
        if head < NUM_Q_HEADS + NUM_KV_HEADS:
            kv_head = head - NUM_Q_HEADS
            k_slot = k_cache_ptr + page * stride_kc_page + in_page * stride_kc_slot
            k_slot += kv_head * stride_kc_head + j[None, :]
            # The rotated k is rounded to x's (q's) dtype first, as the unfused path stores it.
            y1 = y1.to(q_out_ptr.dtype.element_ty).to(tl.float32)
            y2 = y2.to(q_out_ptr.dtype.element_ty).to(tl.float32)
            _write_slot(k_slot, y1, y2, write, kv_scales_ptr + kv_head, HALF, FP8_CACHE)
        else:
            kv_head = head - NUM_Q_HEADS - NUM_KV_HEADS
            v_slot = v_cache_ptr + page * stride_vc_page + in_page * stride_vc_slot
            v_slot += kv_head * stride_vc_head + j[None, :]
            v_scale = kv_scales_ptr + NUM_KV_HEADS + kv_head
            _write_slot(v_slot, y1, y2, write, v_scale, HALF, FP8_CACHE)


@triton.jit
def _write_slot(cache, y1, y2, mask, scale_ptr, HALF: tl.constexpr, FP8_CACHE: tl.constexpr):
    """Store a pair's halves at `cache` and `cache + HALF`; an FP8 cache takes y / its head's
    scale, saturated (see reference.quantize_kv)."""
    if FP8_CACHE:
        kv_scale = tl.load(scale_ptr)
        y1 = _saturate(y1 / kv_scale)
        y2 = _saturate(y2 / kv_scale)
    tl.store(cache, y1.to(cache.dtype.element_ty), mask=mask)
    tl.store(cache + HALF, y2.to(cache.dtype.element_ty), mask=mask)


def choose_tile_tokens(num_tokens: int, parts: int, sms: int) -> int:
    """Tokens per program: the largest power of two up to _MAX_TILE_T that still leaves
    _MIN_PROGRAMS_PER_SM programs per SM."""
    tile_t = 1
    while (
        tile_t < _MAX_TILE_T and cdiv(num_tokens, 2 * tile_t) * parts >= _MIN_PROGRAMS_PER_SM * sms
    ):
        tile_t *= 2
    return tile_t


def rope_cache_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_scales: torch.Tensor | None = None,
    *,
    product_scales: tuple[torch.Tensor, torch.Tensor, torch.dtype] | None = None,
    tile_tokens: int | None = None,
    num_warps: int = _NUM_WARPS,
) -> torch.Tensor:
    """RoPE on q [T, Hq, D] and k [T, Hkv, D], rotated k and v written to their cache slots.

    Returns the rotated q. q, k and v may be strided views (e.g. slices of a fused QKV output)
    as long as their last dim is contiguous. See `reference.rope_cache_write`; an FP8 cache
    takes `kv_scales` [2, Hkv].
    `product_scales` (row scales [T, 1], column scales [Hq*D + 2*Hkv*D], dtype): q, k and v
    are views of an FP8 matmul's unscaled FP32 product (`ScaledProduct`), scaled and rounded
    to dtype as they are read, so the projection needs no scaling kernel of its own; q comes
    back in dtype.
    `tile_tokens` (a power of two) forces the tokens per program, which `choose_tile_tokens`
    picks otherwise; tests and the kernel benchmark use it.
    """
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    positions, slot_mapping = positions.contiguous(), slot_mapping.contiguous()
    cos, sin = unit_last_stride(cos), unit_last_stride(sin)
    if cos.stride(0) != sin.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = head_dim // 2
    out_dtype = q.dtype if product_scales is None else product_scales[2]
    q_out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=out_dtype, device=q.device)
    row_scale, col_scale = product_scales[:2] if product_scales is not None else (q, q)
    if num_tokens == 0:
        return q_out
    block_hkv = next_pow2(num_kv_heads)
    # About as many query elements per program as key + value elements in program 0.
    block_hq = min(next_pow2(num_q_heads), next_pow2(2 * num_kv_heads))
    parts = 1 + cdiv(num_q_heads, block_hq)
    if tile_tokens is None:
        tile_tokens = choose_tile_tokens(num_tokens, parts, num_sms(q.device))
    tile_tokens = next_pow2(tile_tokens)
    grid = (cdiv(num_tokens, tile_tokens), parts)
    pdl = use_pdl(q.device)
    _rope_cache_kernel[grid](
        q,
        k,
        v,
        positions,
        cos,
        sin,
        k_cache,
        v_cache,
        slot_mapping,
        kv_scales if kv_scales is not None else slot_mapping,  # unread without an FP8 cache
        row_scale,  # these two unread without product_scales
        col_scale,
        q_out,
        num_tokens,
        num_q_heads,
        num_kv_heads,
        cos.shape[0],
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        q_out.stride(0),
        q_out.stride(1),
        PAGE_SIZE=k_cache.shape[1],
        HALF=half,
        BLOCK_HALF=next_pow2(half),
        TILE_T=tile_tokens,
        BLOCK_HQ=block_hq,
        BLOCK_HKV=block_hkv,
        FP8_CACHE=kv_scales is not None,
        SCALED=product_scales is not None,
        USE_PDL=pdl,
        num_warps=num_warps,
        launch_pdl=pdl,
    )
    return q_out
