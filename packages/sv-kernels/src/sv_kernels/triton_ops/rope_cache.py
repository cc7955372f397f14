# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""RoPE on q and k fused with the paged KV-cache write, in one kernel.

Grid (T, 1 + query-head blocks). Program (t, 0) rotates token t's key heads and writes them and
the value heads into the token's cache slot (skipping it when the slot is negative); programs
(t, 1..) rotate blocks of its query heads into a new tensor. Splitting the query heads over
several programs keeps the work per program about even (Hq*D vs 2*Hkv*D elements) and gives
small decode batches more programs in flight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, next_pow2, unit_last_stride


@triton.jit
def _rotate_heads(
    src_ptr, stride_h, heads, head_mask, cos, sin, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr
):
    """Load heads x D from `src_ptr` and rotate them: returns the two rotated halves (FP32)."""
    d = tl.arange(0, BLOCK_HALF)
    mask = head_mask[:, None] & (d < HALF)[None, :]
    offsets = heads[:, None] * stride_h + d[None, :]
    x1 = tl.load(src_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + offsets + HALF, mask=mask, other=0.0).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


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
    q_out_ptr,
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
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    position = tl.load(positions_ptr + token).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    # A position outside the table cannot be reported without a host sync; it reads cos = sin
    # = 0 (a zero rotation) instead of faulting. The model bounds positions by the table size.
    angle_mask = (d < HALF) & (position >= 0) & (position < num_positions)
    cos = tl.load(cos_ptr + position * stride_cos + d, mask=angle_mask, other=0.0)[None, :]
    sin = tl.load(sin_ptr + position * stride_cos + d, mask=angle_mask, other=0.0)[None, :]
    half_mask = (d < HALF)[None, :]

    if part == 0:
        slot = tl.load(slots_ptr + token).to(tl.int64)
        if slot >= 0:  # a negative slot is padding: nothing to write
            heads = tl.arange(0, BLOCK_HKV)
            head_mask = heads < num_kv_heads
            mask = head_mask[:, None] & half_mask
            k1, k2 = _rotate_heads(
                k_ptr + token * stride_kt, stride_kh, heads, head_mask, cos, sin, HALF, BLOCK_HALF
            )
            page = slot // PAGE_SIZE
            offset = slot % PAGE_SIZE
            kc = k_cache_ptr + page * stride_kc_page + offset * stride_kc_slot
            kc_offsets = heads[:, None] * stride_kc_head + d[None, :]
            # Round to k's dtype first (the rotated k), then to the cache's, as the reference does.
            k1 = k1.to(k_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
            k2 = k2.to(k_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
            tl.store(kc + kc_offsets, k1, mask=mask)
            tl.store(kc + kc_offsets + HALF, k2, mask=mask)

            v_src = v_ptr + token * stride_vt + heads[:, None] * stride_vh + d[None, :]
            vc = v_cache_ptr + page * stride_vc_page + offset * stride_vc_slot
            vc_offsets = heads[:, None] * stride_vc_head + d[None, :]
            v1 = tl.load(v_src, mask=mask, other=0.0).to(v_cache_ptr.dtype.element_ty)
            v2 = tl.load(v_src + HALF, mask=mask, other=0.0).to(v_cache_ptr.dtype.element_ty)
            tl.store(vc + vc_offsets, v1, mask=mask)
            tl.store(vc + vc_offsets + HALF, v2, mask=mask)
    else:
        heads = (part - 1) * BLOCK_HQ + tl.arange(0, BLOCK_HQ)
        head_mask = heads < num_q_heads
        mask = head_mask[:, None] & half_mask
        q1, q2 = _rotate_heads(
            q_ptr + token * stride_qt, stride_qh, heads, head_mask, cos, sin, HALF, BLOCK_HALF
        )
        out = q_out_ptr + token * stride_qo_t + heads[:, None] * stride_qo_h + d[None, :]
        tl.store(out, q1.to(q_out_ptr.dtype.element_ty), mask=mask)
        tl.store(out + HALF, q2.to(q_out_ptr.dtype.element_ty), mask=mask)


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
) -> torch.Tensor:
    """RoPE on q [T, Hq, D] and k [T, Hkv, D], rotated k and v written to their cache slots.

    Returns the rotated q. q, k and v may be strided views (e.g. slices of a fused QKV output)
    as long as their last dim is contiguous. See `reference.rope_cache_write`.
    """
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    positions, slot_mapping = positions.contiguous(), slot_mapping.contiguous()
    cos, sin = unit_last_stride(cos), unit_last_stride(sin)
    if cos.stride(0) != sin.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = head_dim // 2
    q_out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    block_hkv = next_pow2(num_kv_heads)
    # About as many query elements per program as key + value elements in program 0.
    block_hq = min(next_pow2(num_q_heads), next_pow2(2 * num_kv_heads))
    grid = (num_tokens, 1 + cdiv(num_q_heads, block_hq))
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
        q_out,
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
        BLOCK_HQ=block_hq,
        BLOCK_HKV=block_hkv,
        num_warps=4,
    )
    return q_out
