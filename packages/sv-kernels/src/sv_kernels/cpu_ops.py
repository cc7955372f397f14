"""The CPU's own versions of the ops a decode step runs besides its matrices.

`reference` says what each op computes, in the plainest torch; run eagerly on the CPU, its
many small ops are most of a batch-1 decode step: each torch call costs microseconds on the
host whatever its size, and a decode step's tensors are a few hundred values. These compute
the same values (the same FP32 arithmetic, or float rounding away) in fewer, larger calls:

- `paged_decode_attention`: one `index_select` of a sequence's pages for K and one for V,
  grouped-query attention as a batch of matrix products over the KV heads (q viewed as
  [Hkv, group, D]), where the reference copies K and V once per query head, masks and einsums;
  on one thread (its products are too small to share, see there).
- `rope_cache_write`: q and k rotated together in four calls (a roll swaps each head's
  halves), by cos/sin rows gathered once a step for all the layers (the positions and tables
  are the same), K and V written with `index_copy_` into the flattened pages, where the
  reference rotates each separately and scatters through boolean-mask indexing.
- `prefill_attention`: the same per sequence for a chunk of queries (a prompt's, or a
  speculating decode's verify run), with its causal mask applied once to the scores of all
  heads.
- `rms_norm` and `swiglu`: in FP32, bit for bit the reference without its casts (all no-ops
  there, each still a call); RMSNorm as torch's own, one call of the same arithmetic. Other
  dtypes take the reference.

`sv_kernels.ops` sends CPU tensors here; the tests hold each against its reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
from torch import Tensor

from . import reference

P = ParamSpec("P")
R = TypeVar("R")


def rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """`reference.rms_norm`. In FP32 its casts are no-ops and torch's own RMSNorm computes
    the same arithmetic bit for bit (its rounding to x's dtype before the weight multiply
    differs from HF's in 16-bit dtypes, which take the reference)."""
    fp32 = x.dtype == weight.dtype == torch.float32
    if not fp32 or (residual is not None and residual.dtype != torch.float32):
        return reference.rms_norm(x, weight, eps, residual)
    s = x if residual is None else x + residual
    return torch.nn.functional.rms_norm(s, (s.shape[-1],), weight, eps), s


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
    """`reference.rope_cache_write`, with q and k rotated as one tensor: x * (cos, cos) +
    swap_halves(x) * (-sin, sin), the reference's products and sums in another order (the same
    FP32 values)."""
    num_q_heads, half = q.shape[1], q.shape[2] // 2
    cos_rows, sin_rows = _rotation_rows(positions, cos, sin)
    qk = _as(torch.cat((q, k), dim=1), torch.float32)
    # roll by half a head swaps the halves: [x2, x1].
    rotated = torch.roll(qk, half, -1).mul_(sin_rows).add_(qk * cos_rows)
    rotated = _as(rotated, q.dtype)
    k_rot = rotated[:, num_q_heads:]
    if kv_scales is None:
        k_new, v_new = _as(k_rot, k_cache.dtype), _as(v, v_cache.dtype)
    else:
        k_new = reference.quantize_kv(k_rot, kv_scales[0])
        v_new = reference.quantize_kv(v, kv_scales[1])
    slots = slot_mapping.long()
    if min(slot_mapping.tolist(), default=0) < 0:  # padding rows: write only the others
        keep = (slots >= 0).nonzero().squeeze(1)
        slots, k_new, v_new = slots[keep], k_new[keep], v_new[keep]
    _write(k_cache, slots, k_new)
    _write(v_cache, slots, v_new)
    return rotated[:, :num_q_heads].contiguous()


# The last rows `_rotation_rows` gathered: (cos, sin, positions as a list, the two rows). A
# step rotates every layer's q and k at the same positions by the same tables, so the rows
# are gathered once a step instead of once a layer. The key is the tables themselves and the
# positions' values: a step's positions may come in a reused buffer, so that tensor's identity
# says nothing (and inference tensors keep no version counter).
_last_rows: list[tuple[Tensor, Tensor, list[int], Tensor, Tensor]] = []


def _rotation_rows(positions: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Each position's (cos, cos) and (-sin, sin) rows, [T, 1, D] FP32."""
    key = positions.tolist()
    if _last_rows:
        last_cos, last_sin, last_key, cos_rows, sin_rows = _last_rows[0]
        if last_cos is cos and last_sin is sin and last_key == key:
            return cos_rows, sin_rows
    c, s = cos.index_select(0, positions), sin.index_select(0, positions)
    cos_rows = torch.cat((c, c), dim=-1).unsqueeze(1)
    sin_rows = torch.cat((s.neg(), s), dim=-1).unsqueeze(1)
    _last_rows[:] = [(cos, sin, key, cos_rows, sin_rows)]
    return cos_rows, sin_rows


def _write(cache: Tensor, slots: Tensor, values: Tensor) -> None:
    """cache [P, S, Hkv, D] (any strides) at slots (page * S + offset) [T] int64 = values
    [T, Hkv, D]."""
    if cache.dtype == reference.FP8_KV_DTYPE:  # no FP8 kernel for either write: copy the bytes
        cache, values = cache.view(torch.uint8), values.view(torch.uint8)
    if cache.is_contiguous():  # the CPU pool (`reference.kv_pages`): ~2x faster than index_put_
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, values)
    else:
        page_size = cache.shape[1]
        cache.index_put_((slots // page_size, slots % page_size), values)


def on_threads(threads: int, op: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """op(*args, **kwargs) with torch on `threads` threads, its own count restored after (also
    on failure); nothing is set when the count is already that. A plain call, not a context
    manager: it runs around each matrix and attention of a CPU decode step, where a
    generator-based `with` costs about a microsecond more a call."""
    most = torch.get_num_threads()
    if threads == most:
        return op(*args, **kwargs)
    torch.set_num_threads(threads)
    try:
        return op(*args, **kwargs)
    finally:
        torch.set_num_threads(most)


def _on_one_thread(op: Callable[P, R]) -> Callable[P, R]:
    """`op` run with torch on one thread (`on_threads`)."""

    @functools.wraps(op)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return on_threads(1, op, *args, **kwargs)

    return run


@_on_one_thread
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
    """`reference.paged_decode_attention`: the query sees every position of its sequence (the
    last W under a sliding window W), so only those keys are read and nothing is masked.

    Run on one thread: a decode query's products are a few thousand multiply-adds per KV
    head, less than what a parallel region costs, and torch's batched matrix product opens one
    (MKL's) for them; on a machine whose cores are busy with other work, a region waits for a
    descheduled partner thread for up to a time slice. On the shared 2-core development
    machine, with one other busy process: 93-167 us mean per call on one thread, 0.4-5.6 ms
    on two (p99 4-46 ms); setting the thread count twice costs under a microsecond."""
    num_kv_heads, head_dim = k_cache.shape[2:]
    # Query head h reads KV head h // group: q as [Hkv, group, D] batches over the KV heads.
    qg = _as(q, torch.float32).reshape(q.shape[0], num_kv_heads, -1, head_dim)
    outs = []
    for b, n in enumerate(seq_lens.tolist()):
        if n == 0:  # a padding row sees no keys: zeros, as the reference's
            outs.append(torch.zeros_like(qg[b]))
            continue
        first_key = reference.first_visible_key(n - 1, sliding_window)
        k, v = _visible_kv(k_cache, v_cache, block_tables[b], first_key, n, kv_scales)
        scores = torch.bmm(qg[b], k.permute(1, 2, 0)).mul_(scale)  # [Hkv, group, keys]
        outs.append(torch.bmm(torch.softmax(scores, dim=-1), v.transpose(0, 1)))
    # One sequence (batch-1 decoding) needs no stacking: its [Hkv, group, D] is q's shape.
    out = outs[0] if len(outs) == 1 else torch.stack(outs)
    return _as(out.view(q.shape), q.dtype)


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
    decode_tail: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """`reference.prefill_attention`: sequence b's queries are the last q_len positions of its
    context, so the query at position p sees keys first..p (and none at or before p - W under
    a sliding window W); only the keys from the first query's first visible one are read."""
    del max_seqlen_q, decode_tail  # the same result: see `reference.prefill_attention`
    num_kv_heads, head_dim = k_cache.shape[2:]
    group = q.shape[1] // num_kv_heads
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for b, n in enumerate(seq_lens.tolist()[: len(cu) - 1]):
        lo, hi = cu[b], cu[b + 1]
        q_len = hi - lo
        if q_len == 0:
            continue
        first_query = n - q_len
        first_key = reference.first_visible_key(first_query, sliding_window)
        k, v = _visible_kv(k_cache, v_cache, block_tables[b], first_key, n, kv_scales)
        # Query head h reads KV head h // group: [Hkv, group * q_len, D] in (head, query) order.
        qg = q[lo:hi].float().view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        scores = torch.matmul(qg, k.permute(1, 2, 0).unsqueeze(1)).mul_(scale)
        hidden = _hidden_keys(first_query - first_key, q_len, n - first_key, sliding_window)
        if hidden is not None:
            scores.masked_fill_(hidden, float("-inf"))  # [q_len, keys] over every head
        o = torch.matmul(torch.softmax(scores, dim=-1), v.transpose(0, 1).unsqueeze(1))
        out[lo:hi] = _as(o.permute(2, 0, 1, 3).reshape(q_len, -1, head_dim), q.dtype)
    return out


def _visible_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    table_row: Tensor,
    first_key: int,
    length: int,
    kv_scales: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Positions first_key..length-1 of one sequence's K and V, as FP32 [keys, Hkv, D]: only
    the pages holding them are read (an FP8 cache times its per-head scales [2, Hkv])."""
    page_size = k_cache.shape[1]
    first_page = first_key // page_size
    pages = table_row[first_page : -(-length // page_size)]
    keys = slice(first_key - first_page * page_size, length - first_page * page_size)
    k_scales, v_scales = (None, None) if kv_scales is None else (kv_scales[0], kv_scales[1])
    return _read(k_cache, pages, keys, k_scales), _read(v_cache, pages, keys, v_scales)


def _hidden_keys(
    first_query: int, q_len: int, num_keys: int, sliding_window: int | None
) -> Tensor | None:
    """[q_len, num_keys] True where query i (at position first_query + i) must not see key j
    (positions counted from the first key read: a later position, or one at or before
    position - W); None when it sees them all."""
    if q_len == 1 and sliding_window is None:
        return None  # a single query is the last position: every key is visible
    q_pos = torch.arange(first_query, first_query + q_len)[:, None]
    k_pos = torch.arange(num_keys)[None, :]
    hidden = k_pos > q_pos
    if sliding_window is not None:
        hidden |= k_pos <= q_pos - sliding_window
    return hidden


def _read(cache: Tensor, pages: Tensor, keys: slice, scales: Tensor | None) -> Tensor:
    """Positions `keys` of the concatenated `pages` of a cache [P, S, Hkv, D], as FP32
    [len(keys), Hkv, D] (an FP8 cache times its per-head `scales`)."""
    rows = cache.index_select(0, pages).flatten(0, 1)[keys]
    return _as(rows, torch.float32) if scales is None else rows.float() * scales[:, None]


def swiglu(gate_up: Tensor) -> Tensor:
    """`reference.swiglu`; in FP32 without its no-op casts."""
    if gate_up.dtype != torch.float32:
        return reference.swiglu(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t in dtype; a same-dtype `.to` is a no-op that still costs a torch call."""
    return t if t.dtype == dtype else t.to(dtype)
