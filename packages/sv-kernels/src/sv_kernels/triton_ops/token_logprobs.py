# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""`reference.token_logprobs` without writing the [B, V] log-softmax: four launches.

1. Programs over (row, vocabulary chunk) keep each chunk's max m and its sum of exp(x - m).
2. One program per row takes the row's threshold t, the K-th largest of its chunks' maxima
   (those K maxima are K distinct logits >= t, so every logit of the row's top K is >= t too).
   Once per row: when every chunk's program took it from the maxima itself, those K rounds
   over the maxima, repeated in each of a row's 31 programs at batch 256, were most of the
   step's log-probability time.
3. The programs over (row, chunk) again. A chunk whose max is below t holds none of the top K
   and reads nothing more. The others run rounds of a leftmost argmax over their chunk, in
   registers, each taking the winner out of the running, while the winner is >= t (at most K
   rounds): the row costs about K rounds in all, not K per chunk (at batch 256, 31 chunks of
   4,096: 0.42 ms a step in K rounds each, BENCHMARKS.md run 69). A row of fewer than K
   chunks has no threshold (t is below every value) and takes K rounds in every chunk.
4. One program per row merges them: logsumexp = M + log(sum of s_c * exp(m_c - M)) with M the
   largest m_c, the chosen token's logit minus it, and the top K of the row (K rounds of a
   leftmost argmax over the chunks' candidates, stored chunk after chunk).

The rounds compare order-preserving int32 keys of the FP32 values (negative floats get their
magnitude bits flipped): a column outside the vocabulary, a candidate already taken and an
unused candidate slot get INT32_MIN, below every real value, -inf included, so a row that is
-inf but for a few tokens still returns k distinct ids. Ties go to the lower token id: within
a chunk the leftmost argmax takes it; across chunks the candidates are stored in chunk order,
so the leftmost equal candidate is again the lowest id (torch.topk, the reference, leaves tie
order unspecified; this is the order of a stable descending sort, and of `argmax`).

Shapes fix the launches and nothing is read back on the host: the call is captured in the
decode graphs' log-probability graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, next_pow2, num_sms, unit_last_stride, use_pdl, wait_for_prior_kernels

# Columns per first-stage program: about four programs per SM in all, within these bounds. A
# chunk costs K reductions over its columns, so the total work is the same at any width; wider
# chunks at large batches leave the merge fewer candidates.
_LEAST_CHUNK = 1024
_MOST_CHUNK = 4096
_INT32_MIN = tl.constexpr(-2147483648)  # below the key of every non-NaN float


@triton.jit
def _order_key(x):
    """FP32 -> int32 whose signed order is the float order (for non-NaN values)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _chunk_stats_kernel(
    logits_ptr,
    stride_row,
    vocab,
    num_chunks,
    max_ptr,
    sum_ptr,
    CHUNK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab, other=float("-inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk sums to 0, not NaN
    stat = row * num_chunks + chunk
    tl.store(max_ptr + stat, m)
    tl.store(sum_ptr + stat, tl.sum(tl.exp(x - shift), axis=0))


@triton.jit
def _row_threshold_kernel(
    num_chunks,
    max_ptr,
    threshold_ptr,
    BLOCK_C: tl.constexpr,
    K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    # The K-th largest chunk maximum, as an order key; with fewer than K chunks the K-th
    # round finds only the INT32_MIN padding, and nothing is pruned.
    c = tl.arange(0, BLOCK_C)
    maxima = tl.load(max_ptr + row * num_chunks + c, mask=c < num_chunks, other=0.0)
    ranked = tl.where(c < num_chunks, _order_key(maxima), _INT32_MIN)
    threshold = tl.full([], -2147483648, tl.int32)
    for _ in tl.static_range(K):
        threshold, picked = tl.max(ranked, axis=0, return_indices=True)
        ranked = tl.where(c == picked, _INT32_MIN, ranked)
    tl.store(threshold_ptr + row, threshold)


@triton.jit
def _logprob_chunks_kernel(
    logits_ptr,
    stride_row,
    vocab,
    num_chunks,
    max_ptr,
    threshold_ptr,
    key_ptr,
    id_ptr,
    CHUNK: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    threshold = tl.load(threshold_ptr + row)
    # Below the threshold the chunk's max, and so all of it, is out of the row's top K: its
    # logits are not read (masked loads fetch nothing) and it leaves only unused slots.
    qualifies = _order_key(tl.load(max_ptr + row * num_chunks + chunk)) >= threshold
    offsets = tl.arange(0, CHUNK)
    cols = chunk * CHUNK + offsets
    valid = (cols < vocab) & qualifies
    x = tl.load(logits_ptr + row * stride_row + cols, mask=valid, other=float("-inf"))
    key = tl.where(valid, _order_key(x.to(tl.float32)), _INT32_MIN)
    out = (row * num_chunks + chunk) * K
    taken = tl.full([], 0, tl.int32)
    best, at = tl.max(key, axis=0, return_indices=True, return_indices_tie_break_left=True)
    while (taken < K) & (best >= threshold):
        tl.store(key_ptr + out + taken, best)
        tl.store(id_ptr + out + taken, chunk * CHUNK + at)
        key = tl.where(offsets == at, _INT32_MIN, key)
        taken += 1
        best, at = tl.max(key, axis=0, return_indices=True, return_indices_tie_break_left=True)
    slots = tl.arange(0, BLOCK_K)
    unused = (slots >= taken) & (slots < K)
    tl.store(key_ptr + out + slots, tl.full([BLOCK_K], _INT32_MIN, tl.int32), mask=unused)
    tl.store(id_ptr + out + slots, tl.zeros([BLOCK_K], tl.int32), mask=unused)


@triton.jit
def _logprob_merge_kernel(
    logits_ptr,
    stride_row,
    ids_ptr,
    num_chunks,
    max_ptr,
    sum_ptr,
    key_ptr,
    id_ptr,
    chosen_ptr,
    top_values_ptr,
    top_ids_ptr,
    BLOCK_C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    in_row = c < num_chunks
    m = tl.load(max_ptr + row * num_chunks + c, mask=in_row, other=float("-inf"))
    s = tl.load(sum_ptr + row * num_chunks + c, mask=in_row, other=0.0)
    big = tl.max(m, axis=0)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - big))
    lse = big + tl.log(tl.sum(s * scale, axis=0))
    token = tl.load(ids_ptr + row).to(tl.int64)
    x = tl.load(logits_ptr + row * stride_row + token).to(tl.float32)
    tl.store(chosen_ptr + row, x - lse)
    n = tl.arange(0, BLOCK_N)
    count = num_chunks * K
    first = row * count
    key = tl.load(key_ptr + first + n, mask=n < count, other=_INT32_MIN)
    for j in tl.static_range(K):
        best, at = tl.max(key, axis=0, return_indices=True, return_indices_tie_break_left=True)
        bits = tl.where(best < 0, best ^ 0x7FFFFFFF, best)
        tl.store(top_values_ptr + row * K + j, bits.to(tl.float32, bitcast=True) - lse)
        tl.store(top_ids_ptr + row * K + j, tl.load(id_ptr + first + at).to(tl.int64))
        key = tl.where(n == at, _INT32_MIN, key)


def _chunk_width(batch: int, vocab: int, device: torch.device) -> int:
    wanted_chunks = cdiv(4 * num_sms(device), batch)
    chunk = min(_MOST_CHUNK, max(_LEAST_CHUNK, next_pow2(cdiv(vocab, wanted_chunks))))
    return min(chunk, next_pow2(vocab))


def token_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As `reference.token_logprobs` (logits [B, V] f32/bf16, ids [B], 0 <= k <= V): chosen
    [B] f32, top values [B, k] f32, top ids [B, k] int64; ties in the top k go to the lower id."""
    logits = unit_last_stride(logits)
    batch, vocab = logits.shape
    device = logits.device
    chosen = torch.empty((batch,), dtype=torch.float32, device=device)
    top_values = torch.empty((batch, k), dtype=torch.float32, device=device)
    top_ids = torch.empty((batch, k), dtype=torch.int64, device=device)
    if batch == 0:
        return chosen, top_values, top_ids
    chunk = _chunk_width(batch, vocab, device)
    num_chunks = cdiv(vocab, chunk)
    maxima = torch.empty((batch, num_chunks), dtype=torch.float32, device=device)
    sums = torch.empty_like(maxima)
    keys = torch.empty((batch, num_chunks, k), dtype=torch.int32, device=device)
    cand_ids = torch.empty_like(keys)
    candidates = next_pow2(num_chunks * k)
    pdl = use_pdl(device)
    warps = max(1, min(8, chunk // 256))
    _chunk_stats_kernel[(batch, num_chunks)](
        logits,
        logits.stride(0),
        vocab,
        num_chunks,
        maxima,
        sums,
        CHUNK=chunk,
        USE_PDL=pdl,
        num_warps=warps,
        launch_pdl=pdl,
    )
    thresholds = torch.empty((batch,), dtype=torch.int32, device=device)
    _row_threshold_kernel[(batch,)](
        num_chunks,
        maxima,
        thresholds,
        BLOCK_C=next_pow2(num_chunks),
        K=k,
        USE_PDL=pdl,
        num_warps=1 if num_chunks <= 64 else 4,
        launch_pdl=pdl,
    )
    _logprob_chunks_kernel[(batch, num_chunks)](
        logits,
        logits.stride(0),
        vocab,
        num_chunks,
        maxima,
        thresholds,
        keys,
        cand_ids,
        CHUNK=chunk,
        K=k,
        BLOCK_K=max(2, next_pow2(k)),
        USE_PDL=pdl,
        num_warps=warps,
        launch_pdl=pdl,
    )
    _logprob_merge_kernel[(batch,)](
        logits,
        logits.stride(0),
        ids,
        num_chunks,
        maxima,
        sums,
        keys,
        cand_ids,
        chosen,
        top_values,
        top_ids,
        BLOCK_C=next_pow2(num_chunks),
        BLOCK_N=candidates,
        K=k,
        USE_PDL=pdl,
        num_warps=8 if candidates >= 4096 else 4,
        launch_pdl=pdl,
    )
    return chosen, top_values, top_ids
