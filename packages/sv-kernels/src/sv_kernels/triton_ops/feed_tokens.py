# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""A step's input token ids, with the ones the host has not seen yet taken from the device.

When the engine launches step N+1 before step N's sampled tokens have reached the host, the
tokens step N+1 feeds for those sequences exist only on the GPU. The host passes a placeholder
and, for that entry, the row of step N's sampled ids to read instead; this kernel (one program
per tile of entries, first in the decode graph) writes the ids the model actually embeds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, use_pdl, wait_for_prior_kernels

# One tile size and an unspecialized length: a prefill step's token count changes every step,
# and each new specialization would be a compile (~0.5 s) in the middle of serving.
_TILE = 1024


@triton.jit(do_not_specialize=["n"])
def _feed_tokens_kernel(
    token_ids_ptr,
    source_rows_ptr,
    sampled_ptr,
    out_ptr,
    n,
    TILE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    offs = tl.program_id(0) * TILE + tl.arange(0, TILE)
    inside = offs < n
    given = tl.load(token_ids_ptr + offs, mask=inside)
    source = tl.load(source_rows_ptr + offs, mask=inside, other=-1)
    fed = tl.load(sampled_ptr + source, mask=inside & (source >= 0), other=0)
    ids = tl.where(source >= 0, fed.to(given.dtype), given)
    tl.store(out_ptr + offs, ids, mask=inside)


def feed_tokens(
    token_ids: torch.Tensor, source_rows: torch.Tensor, sampled: torch.Tensor
) -> torch.Tensor:
    """token_ids [T] with entry i replaced by sampled[source_rows[i]] where source_rows[i] >= 0;
    see `reference.feed_tokens`."""
    out = torch.empty_like(token_ids)
    n = token_ids.shape[0]
    if n == 0:
        return out
    pdl = use_pdl(token_ids.device)
    _feed_tokens_kernel[(cdiv(n, _TILE),)](
        token_ids.contiguous(),
        source_rows.contiguous(),
        sampled,
        out,
        n,
        TILE=_TILE,
        USE_PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
    return out
