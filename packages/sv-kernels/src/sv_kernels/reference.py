"""Plain-torch reference implementations of every op.

These define what each op computes. The CPU backend runs them as they are (but for the few in
`sv_kernels.cpu_ops`, tested against these); every Triton kernel in `sv_kernels.triton_ops`
has the same signature and is tested against its twin here.

Shapes use these letters:
  T  tokens in a step (all sequences packed one after another)
  B  sequences in a step
  H  hidden size,  I  MLP intermediate size,  V  vocabulary size
  Hq query heads,  Hkv key/value heads,  D  head dim
  P  physical pages in the KV pool,  S  tokens per page (16)

The paged KV cache of one layer is a pair of tensors `k_cache`, `v_cache` of shape [P, S, Hkv, D].
Token position `pos` of a sequence lives in page `block_table[pos // S]` at offset `pos % S`;
its "slot" is `page * S + offset`. Every op takes the caches through their strides: the pool
the model allocates on a GPU (`kv_pages`) is stored head by head within each page.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .quantized import MAX_VALUE, LinearWeight, QuantizedWeight, dequantize, dequantize_rows


def kv_pages(
    leading: tuple[int, ...],
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    by_head: bool | None = None,
) -> Tensor:
    """A zeroed K or V pool [*leading, P, S, Hkv, D]; `by_head` stores it [*leading, P, Hkv, S, D].

    Indexed as every op expects, by page, slot, head. Stored by head, one KV head's S tokens of
    a page are one contiguous run of S * D values (2 KiB in BF16 at D = 64) instead of S runs of
    D values a head apart. The GPU's decode attention reads a (sequence, KV head) pair's pages,
    and on the H200 it streams them faster that way (BENCHMARKS.md, run 132): FP8 pages, 256
    sequences of 1k tokens, 130.2 -> 117.0 us; BF16 134.0 -> 128.5; FP8 1 x 32k 20.0 -> 18.6.
    The CPU ops gather whole pages of every head at once, and there the plain order is faster
    (the default model's int8 decode: 1.77 s of CPU time for 64 tokens against 1.90 s by head).
    By default, by head on CUDA only.
    """
    if by_head is None:
        by_head = torch.device(device).type == "cuda"
    if not by_head:
        return torch.zeros(
            (*leading, num_pages, page_size, num_kv_heads, head_dim), dtype=dtype, device=device
        )
    storage = torch.zeros(
        (*leading, num_pages, num_kv_heads, page_size, head_dim), dtype=dtype, device=device
    )
    return storage.transpose(-3, -2)


def embedding(ids: Tensor, weight: LinearWeight) -> Tensor:
    """Gather rows of `weight` [V, H] for `ids` [T] -> [T, H] (a quantized matrix's rows
    dequantized, in its dtype)."""
    if isinstance(weight, QuantizedWeight):
        return dequantize_rows(weight, ids)
    return weight.index_select(0, ids.long())


def linear(x: Tensor, weight: LinearWeight, bias: Tensor | None = None) -> Tensor:
    """x [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N]. A quantized weight is dequantized to
    x's dtype first: that is what every quantized kernel computes."""
    if isinstance(weight, QuantizedWeight):
        weight = dequantize(weight, x.dtype)
    return torch.nn.functional.linear(x, weight, bias)


def quantize_rows_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Each row of x [T, K] as FP8 e4m3 values and its FP32 scale [T, 1] (absmax / 448, at
    least 1e-12 / 448): x ~= values * scale, the activations of an FP8 tensor-core matmul."""
    x32 = x.float()
    scale = x32.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / MAX_VALUE["fp8"]
    return (x32 / scale).to(torch.float8_e4m3fn), scale


def scale_product(
    product: Tensor, row_scale: Tensor, col_scale: Tensor, dtype: torch.dtype
) -> Tensor:
    """An FP32 product [T, N] times its rows' scales [T, 1] and then its columns' [N], in FP32,
    rounded once to dtype: the per-token and per-channel scales of an FP8 matmul run with unit
    scales (`quantized_ops.scaled_mm_tensorwise`)."""
    return ((product * row_scale) * col_scale[None, :]).to(dtype)


def rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """RMSNorm fused with the residual add.

    With `residual`: s = x + residual; returns (rms_norm(s) * weight, s).
    Without: returns (rms_norm(x) * weight, x).
    The sum and the reduction are in FP32; `s` is stored in x's dtype (it is the residual stream).
    The normalized value is rounded to x's dtype before the weight multiply, as HF Llama does.
    """
    s32 = x.float() if residual is None else x.float() + residual.float()
    s = s32.to(x.dtype)
    var = s.float().pow(2).mean(-1, keepdim=True)
    normed = (s.float() * torch.rsqrt(var + eps)).to(x.dtype)
    return weight * normed, s


def swiglu(gate_up: Tensor) -> Tensor:
    """silu(gate) * up on a packed [T, 2I] projection (gate = first half, up = second half)."""
    inter = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :inter], gate_up[..., inter:]
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate_up.dtype)


def apply_rope(x: Tensor, positions: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate `x` [T, heads, D] by the angles of `positions` [T].

    `cos`/`sin` are [max_positions, D/2] FP32 tables (see `rope_tables`). Dimension i is paired
    with i + D/2 (the "rotate half" layout of Hugging Face checkpoints).
    """
    half = x.shape[-1] // 2
    c = cos[positions.long()].unsqueeze(1)  # [T, 1, D/2]
    s = sin[positions.long()].unsqueeze(1)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return out.to(x.dtype)


# An FP8 (e4m3) KV cache stores x / scale, saturated to the format's largest finite value
# (e4m3fn has no infinity: an overflowing cast would be NaN), with one FP32 scale per KV head
# for K and one for V (`kv_scales` [2, Hkv]); reading multiplies the scale back.
FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_KV_MAX = 448.0


def quantize_kv(x: Tensor, scales: Tensor) -> Tensor:
    """x [T, Hkv, D] -> e4m3 of x / scales[h], saturated."""
    scaled = x.float() / scales.float()[None, :, None]
    return scaled.clamp(-FP8_KV_MAX, FP8_KV_MAX).to(FP8_KV_DTYPE)


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
    """Apply RoPE to q [T, Hq, D] and k [T, Hkv, D]; write rotated k and v [T, Hkv, D] to the cache.

    Token t is written at slot `slot_mapping[t]` (page * S + offset); a negative slot means "do not
    write" (padding). Returns the rotated q as a new tensor; k and v are not modified. An FP8
    cache takes `kv_scales` [2, Hkv] (see `quantize_kv`); the rotated k is rounded to k's dtype
    first, as for any cache.
    """
    q_rot = apply_rope(q, positions, cos, sin)
    k_rot = apply_rope(k, positions, cos, sin)
    page_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    pages, offsets = slots // page_size, slots % page_size
    if kv_scales is None:
        k_cache[pages, offsets] = k_rot[valid].to(k_cache.dtype)
        v_cache[pages, offsets] = v[valid].to(v_cache.dtype)
    else:
        k_cache[pages, offsets] = quantize_kv(k_rot[valid], kv_scales[0])
        v_cache[pages, offsets] = quantize_kv(v[valid], kv_scales[1])
    return q_rot


def gather_kv(
    cache: Tensor,
    block_table: Tensor,
    length: int,
    first_page: int = 0,
    scales: Tensor | None = None,
) -> Tensor:
    """Read positions first_page * S .. length-1 of one sequence from a paged cache
    [length - first_page * S, Hkv, D] (reference use only); an FP8 cache is read back as FP32
    times its per-head `scales` [Hkv]."""
    page_size = cache.shape[1]
    num_pages = (length + page_size - 1) // page_size
    pages = block_table[first_page:num_pages].long()
    rows = cache[pages].reshape((num_pages - first_page) * page_size, *cache.shape[2:])
    kv = rows[: length - first_page * page_size]
    return kv if scales is None else kv.float() * scales.float()[None, :, None]


def _attend(
    q: Tensor, k: Tensor, v: Tensor, scale: float, q_start: int, sliding_window: int | None
) -> Tensor:
    """Causal attention of q [Tq, Hq, D] at positions q_start.. over k, v [Tk, Hkv, D] (FP32
    softmax); with a sliding window W, the query at p sees only keys p - W < k <= p."""
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)  # [Tk, Hq, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    q_pos = torch.arange(q.shape[0], device=q.device) + q_start
    k_pos = torch.arange(k.shape[0], device=q.device)
    hidden = k_pos[None, :] > q_pos[:, None]
    if sliding_window is not None:
        hidden |= k_pos[None, :] <= q_pos[:, None] - sliding_window
    scores = scores.masked_fill(hidden[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, vf).to(q.dtype)


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
    """One query token per sequence: q [B, Hq, D] attends to positions 0..seq_lens[b]-1 of its pages.

    block_tables [B, max_pages] int32, seq_lens [B] int32 (the query is the token at seq_lens[b]-1,
    whose K/V is already in the cache). Returns [B, Hq, D]. `kv_scales`: an FP8 cache's. With
    `sliding_window` W only the last W positions are attended, and only their pages are read:
    the table entries of pages wholly before them may name pages given back (any page id).
    """
    out = torch.empty_like(q)
    k_scales, v_scales = (None, None) if kv_scales is None else (kv_scales[0], kv_scales[1])
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        first = _first_visible_page(n - 1, sliding_window, k_cache.shape[1])
        k = gather_kv(k_cache, block_tables[b], n, first, k_scales)
        v = gather_kv(v_cache, block_tables[b], n, first, v_scales)
        start = first * k_cache.shape[1]
        out[b] = _attend(q[b : b + 1], k, v, scale, n - 1 - start, sliding_window)[0]
    return out


def first_visible_key(first_query: int, sliding_window: int | None) -> int:
    """The first position a query at `first_query` or later can see."""
    return 0 if sliding_window is None else max(0, first_query - sliding_window + 1)


def _first_visible_page(first_query: int, sliding_window: int | None, page_size: int) -> int:
    """The first page a query at `first_query` or later can see."""
    return first_visible_key(first_query, sliding_window) // page_size


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
    """Causal attention for several sequences packed into one varlen batch, K/V from the paged cache.

    Sequence b's queries are q[cu_seqlens_q[b] : cu_seqlens_q[b+1]]; they are the LAST q_len tokens
    of its context, i.e. positions seq_lens[b] - q_len .. seq_lens[b] - 1. Keys/values are positions
    0..seq_lens[b]-1 read from the cache (the new tokens' K/V were written there first), so a prefix
    already in the cache (prefix caching, chunked prefill) is attended to as well. `max_seqlen_q`
    bounds q_len (used by the kernel for its grid). Returns [T, Hq, D]. `kv_scales`: an FP8
    cache's. `sliding_window` as in `paged_decode_attention`: only the pages the first query
    can see are read. `decode_tail` (seq_lens, block_tables): the batch's last sequences, each
    feeding one token, given apart so that the CUDA kernels may run them as decodes; the result
    is the same, so the reference does not read it.
    """
    del max_seqlen_q, decode_tail
    out = torch.empty_like(q)
    k_scales, v_scales = (None, None) if kv_scales is None else (kv_scales[0], kv_scales[1])
    cu = cu_seqlens_q.tolist()
    for b in range(len(cu) - 1):
        lo, hi = cu[b], cu[b + 1]
        if hi == lo:
            continue
        n = int(seq_lens[b])
        q_start = n - (hi - lo)
        first = _first_visible_page(q_start, sliding_window, k_cache.shape[1])
        k = gather_kv(k_cache, block_tables[b], n, first, k_scales)
        v = gather_kv(v_cache, block_tables[b], n, first, v_scales)
        start = first * k_cache.shape[1]
        out[lo:hi] = _attend(q[lo:hi], k, v, scale, q_start - start, sliding_window)
    return out


def decode_metadata(
    block_tables: Tensor, table_rows: Tensor, positions: Tensor, page_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """What attention needs for a decode step, one token per sequence.

    Sequence b sits in row table_rows[b] of the runner's block tables [S, max_pages] and feeds
    the token at positions[b]. Returns its block-table row [B, max_pages], the cache slot its
    token's K/V goes to (page * page_size + offset) [B], and its context length after the step
    (positions + 1) [B], all in block_tables' integer dtype.
    """
    rows = block_tables.index_select(0, table_rows.long())
    pos = positions.to(block_tables.dtype)
    pages = rows.gather(1, (pos // page_size).long().unsqueeze(1)).squeeze(1)
    return rows, pages * page_size + pos % page_size, pos + 1


def feed_tokens(token_ids: Tensor, source_rows: Tensor, sampled: Tensor) -> Tensor:
    """A step's input ids with the pending ones filled in from the device.

    Entry i is sampled[source_rows[i]] where source_rows[i] >= 0 (a token the previous step
    sampled and the host has not seen yet), else token_ids[i]. Same shape and dtype as token_ids.
    """
    pending = source_rows >= 0
    fed = sampled[source_rows.clamp(min=0).long()].to(token_ids.dtype)
    return torch.where(pending, fed, token_ids)


def apply_token_bitmask(logits: Tensor, bitmask: Tensor, rows: Tensor) -> None:
    """Constrain rows of logits [B, V] to a grammar's allowed tokens, in place.

    bitmask [N, ceil(V / 32)] int32: token t is allowed in row rows[i] when bit t % 32 of
    bitmask[i, t // 32] is set (the layout xgrammar and llguidance fill). Disallowed tokens'
    logits become -inf; rows not named in `rows` [N] are untouched.
    """
    vocab = logits.shape[1]
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.int().unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :vocab]
    index = rows.long()
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def argmax(logits: Tensor) -> Tensor:
    """Greedy choice per row of logits [B, V] -> [B] int64 (the lowest index among ties)."""
    return torch.argmax(logits.float(), dim=-1)


# --- Sampling -------------------------------------------------------------------------------
#
# Sampling must be reproducible from a per-request seed and identical on both backends, so the
# random numbers do not come from a framework generator. Each draw hashes (seed, step, column)
# with a small integer hash and turns it into a uniform number in (0, 1); the sample is then the
# Gumbel-max over the surviving (top-k / top-p) columns: argmax(x - log(-log(u))), where
# x = (logit - the row's largest logit) / T.
#
# Why from the row's largest: the noise (between -2.8 and 16.6) must stay visible beside x. FP32
# keeps about 7 digits, so logits near 1e30 (a huge logit_bias) would all round to one value
# and tie, and a tiny T overflows (10 / 1e-38 = inf), so the lowest column among the overflowed
# would win, not the largest logit. Measured from the largest, the likely tokens sit near 0, where
# the noise is exact, and only tokens far below it lose digits or reach -inf (probability ~0).

_MASK32 = 0xFFFFFFFF


def _hash32(x: Tensor) -> Tensor:
    """A 32-bit integer mixer (the "lowbias32" finalizer), on int64 tensors holding uint32 values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    x = x ^ (x >> 16)
    return x


def uniform_noise(seeds: Tensor, steps: Tensor, vocab: int) -> Tensor:
    """Uniform (0, 1) FP32 noise [B, V], a pure function of (seed, step, column)."""
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    h = _hash32(seeds.long()[:, None] & _MASK32)
    h = _hash32(h ^ (steps.long()[:, None] & _MASK32))
    h = _hash32(h ^ cols[None, :])
    # 23 high bits k -> u = (k + 0.5) / 2^23 in (0, 1). With k < 2^23, k + 0.5 is exact in FP32,
    # so u is never 0 or 1 and log(-log(u)) is finite. (24 bits would not be: for k >= 2^23 the
    # + 0.5 rounds, and k = 2^24 - 1 rounds up to u = 1.0, i.e. +inf Gumbel noise.)
    return ((h >> 9).float() + 0.5) * (1.0 / 8388608.0)


def _sampling_offset(logits: Tensor, greedy: Tensor) -> Tensor:
    """What a row's logits [B, V] (FP32) are measured from before the temperature: the largest
    logit of a sampled row, 0 for a greedy row and for a row whose largest is not finite (all
    -inf: masked; +inf: (inf - inf) would be NaN). [B] f32."""
    top = logits.max(dim=-1).values
    return torch.where(greedy | ~torch.isfinite(top), torch.zeros_like(top), top)


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
    steps: Tensor,
) -> Tensor:
    """Sample one token per row of logits [B, V].

    temperature [B] f32 (0 means greedy for that row), top_k [B] int32 (0 = off), top_p [B] f32
    (>= 1.0 = off; <= 0 keeps only the largest logit), seeds [B] int64 (per request), steps [B]
    int64 (the request's output index, so every step draws fresh noise). Returns [B] int64.
    """
    x = logits.float()
    vocab = x.shape[-1]
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    x = (x - _sampling_offset(x, greedy)[:, None]) / t[:, None]
    # top-k: keep values >= the k-th largest (ties at the boundary are kept).
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab)).long()
    sorted_x, _ = torch.sort(x, dim=-1, descending=True)
    kth = sorted_x.gather(1, (k - 1)[:, None])
    keep = x >= kth
    # top-p over the top-k survivors: keep the smallest prefix of the sorted distribution whose
    # mass reaches p; a column survives if the mass strictly before its value is < p.
    probs_sorted = torch.softmax(sorted_x.masked_fill(sorted_x < kth, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs_sorted, dim=-1) - probs_sorted
    cutoff_idx = (mass_before < top_p.float()[:, None]).sum(dim=-1, keepdim=True) - 1
    cutoff_val = sorted_x.gather(1, cutoff_idx.clamp(min=0))
    # top_p >= 1 is "off": without this guard the tail whose FP32 cumulative mass rounds to 1.0
    # (up to ~1e-7 of the mass) would still be cut, so "off" would not keep every token.
    top_p_on = top_p.float()[:, None] < 1.0
    keep &= (x >= cutoff_val) | ~top_p_on
    u = uniform_noise(seeds, steps, vocab)
    gumbel = -torch.log(-torch.log(u))
    scores = torch.where(keep, x + gumbel, torch.full_like(x, float("-inf")))
    sampled = torch.argmax(scores, dim=-1)
    return torch.where(greedy, argmax(logits), sampled)


# --- Log-probabilities ------------------------------------------------------------------------


def token_logprobs(logits: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Log-probabilities of logits [B, V] under log_softmax in FP32: of the token `ids[b]` of
    each row ([B] f32), and the k most likely tokens of each row, most likely first
    (values [B, k] f32, ids [B, k] int64). 0 <= k <= V."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, ids.long()[:, None])[:, 0]
    top_values, top_ids = torch.topk(logprobs, k, dim=-1)
    return chosen, top_values, top_ids


# --- Logit processing (before sampling) ------------------------------------------------------
#
# vLLM's order and semantics: additive biases (logit_bias, min_tokens' banned stop ids) on the
# raw logits, then the repetition, frequency and presence penalties, then (after temperature)
# min_p. Every function returns a new FP32 tensor; the raw logits stay as they were (the
# log-probabilities a request asks for are of those).


def apply_logit_bias(logits: Tensor, rows: Tensor, tokens: Tensor, values: Tensor) -> Tensor:
    """logits [B, V] + sparse biases: values[i] (f32, -inf bans) is added at (rows[i],
    tokens[i]); an entry repeated adds up."""
    out = logits.float().clone()
    out.index_put_((rows.long(), tokens.long()), values.float(), accumulate=True)
    return out


def apply_allowed_tokens(
    logits: Tensor, rows: Tensor, tokens: Tensor, restricted: Tensor
) -> Tensor:
    """logits [B, V] with -inf in every row of `restricted` [R] except at its allowed entries
    (rows[i], tokens[i]): vLLM's allowed_token_ids, a mask (other rows are untouched)."""
    banned = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    banned[restricted.long()] = True
    banned[rows.long(), tokens.long()] = False
    return logits.float().masked_fill(banned, float("-inf"))


def apply_penalties(
    logits: Tensor,
    output_counts: Tensor,
    prompt_mask: Tensor,
    presence: Tensor,
    frequency: Tensor,
    repetition: Tensor,
) -> Tensor:
    """vLLM's penalties on logits [B, V]. output_counts [B, V] int: how often each token was
    generated so far; prompt_mask [B, V] bool: tokens in the prompt; presence, frequency,
    repetition [B] f32 (off: 0, 0, 1).

    repetition (CTRL's): a token seen in the prompt or the output has a positive logit divided
    by it, a negative one multiplied. Then OpenAI's: logit -= count * frequency + (count > 0) *
    presence.

    A finite logit stays finite: a repetition penalty below 1 on a logit near FP32's largest (a
    huge logit_bias) would overflow to +inf, which has no softmax (the CUDA sampler's top-p mass
    of it is garbage: it drew column 0), and above 1 a very negative one would become -inf, a
    ban nobody asked for. They saturate at FP32's largest magnitude instead, where the sampler
    draws evenly among the tokens there."""
    x = logits.float()
    counts = output_counts.float()
    seen = prompt_mask | (output_counts > 0)
    rep = repetition.float()[:, None]
    largest = torch.finfo(torch.float32).max
    scaled = torch.where(x > 0, x / rep, x * rep)
    scaled = torch.where(torch.isfinite(x), scaled.clamp(-largest, largest), scaled)
    x = torch.where(seen, scaled, x)
    x = x - frequency.float()[:, None] * counts
    return x - presence.float()[:, None] * (output_counts > 0).float()


def apply_min_p(logits: Tensor, temperature: Tensor, min_p: Tensor) -> Tensor:
    """min_p [B] f32 (0 = off): drop (-inf) tokens whose probability at the row's temperature
    is below min_p times the most likely token's. p_i / p_max = exp((l_i - l_max) / T), so the
    cut is l_i < l_max + T * ln(min_p), on the untempered logits. Greedy rows (T <= 0) keep
    every token: the argmax survives any min_p."""
    x = logits.float()
    t = temperature.float()
    on = (min_p > 0) & (t > 0)
    cut = x.max(dim=-1).values + t * torch.log(min_p.float().clamp(min=1e-30))
    drop = on[:, None] & (x < cut[:, None])
    return x.masked_fill(drop, float("-inf"))
