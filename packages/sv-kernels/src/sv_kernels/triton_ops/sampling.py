# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""Greedy argmax and seeded temperature / top-k / top-p sampling over the vocabulary.

`argmax` is two-stage: programs over (row, vocabulary chunk) find chunk maxima, a second kernel
picks the best chunk per row (the lowest index wins ties in both stages).

`sample` reproduces `reference.sample` without sorting the row. One program per row:
  1. greedy rows (temperature <= 0) use T = 1 and no noise: the argmax of the raw logits;
  2. x = logits / T (IEEE division, as torch does);
  3. top-k: the k-th largest value of x, found by bisection over the row's values;
  4. top-p: the smallest value whose strictly-larger mass (softmax over the top-k survivors)
     is still below p, found the same way;
  5. the answer is argmax(x + Gumbel noise) over x >= the threshold, with the reference's
     hash-based noise, so both backends return the same ids for the same inputs.
The bisection runs over the 32-bit order-preserving integer keys of FP32 values, so it ends on
an exact row value. Each round evaluates NUM_PIVOTS thresholds at once (one pass over the row
per round, about log(2^32) / log(NUM_PIVOTS + 1) rounds). Rows with neither top-k nor top-p
take a single pass.

Agreement with the reference: the kept set is identical unless top_p lands within FP32
rounding (~1e-6 relative) of a cumulative mass, and even then the id only differs if that one
boundary token wins the draw. On the GPU the noise is bit-identical to torch's (libdevice's
logf is the one torch's CUDA `log` uses); under the interpreter numpy's log stands in.

Cost: one pass over the row for greedy or temperature-only rows; with top-k and/or top-p,
about 2 + 11 passes per filter (each pass compares every value with NUM_PIVOTS thresholds).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._common import INTERPRET, cdiv, next_pow2, num_sms, unit_last_stride

_BLOCK_V = 1024
_NUM_PIVOTS = 8


# --- argmax -------------------------------------------------------------------------------


@triton.jit
def _argmax_chunks_kernel(
    logits_ptr, chunk_max_ptr, chunk_arg_ptr, vocab, stride_row, num_chunks, CHUNK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab, other=float("-inf"))
    best, arg = tl.max(
        x.to(tl.float32), axis=0, return_indices=True, return_indices_tie_break_left=True
    )
    tl.store(chunk_max_ptr + row * num_chunks + chunk, best)
    tl.store(chunk_arg_ptr + row * num_chunks + chunk, chunk * CHUNK + arg)


@triton.jit
def _argmax_merge_kernel(chunk_max_ptr, chunk_arg_ptr, out_ptr, num_chunks, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    maxima = tl.load(chunk_max_ptr + row * num_chunks + c, mask=c < num_chunks, other=float("-inf"))
    _, best_chunk = tl.max(maxima, axis=0, return_indices=True, return_indices_tie_break_left=True)
    arg = tl.load(chunk_arg_ptr + row * num_chunks + best_chunk)
    tl.store(out_ptr + row, arg.to(tl.int64))


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of the largest logit per row [B, V] -> [B] int64, lowest index among ties."""
    logits = unit_last_stride(logits)
    batch, vocab = logits.shape
    out = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    if batch == 0 or vocab == 0:
        return out
    # About four chunk programs per SM in all, each chunk 1k..16k columns.
    wanted_chunks = cdiv(4 * num_sms(logits.device), batch)
    chunk = min(16384, max(1024, next_pow2(cdiv(vocab, wanted_chunks))))
    chunk = min(chunk, next_pow2(vocab))
    num_chunks = cdiv(vocab, chunk)
    chunk_max = torch.empty((batch, num_chunks), dtype=torch.float32, device=logits.device)
    chunk_arg = torch.empty((batch, num_chunks), dtype=torch.int32, device=logits.device)
    _argmax_chunks_kernel[(batch, num_chunks)](
        logits,
        chunk_max,
        chunk_arg,
        vocab,
        logits.stride(0),
        num_chunks,
        CHUNK=chunk,
        num_warps=max(1, min(8, chunk // 512)),
    )
    _argmax_merge_kernel[(batch,)](
        chunk_max, chunk_arg, out, num_chunks, BLOCK_C=next_pow2(num_chunks), num_warps=1
    )
    return out


# --- sampling -----------------------------------------------------------------------------


@triton.jit
def _hash32(x):
    """The "lowbias32" integer mixer on uint32 (multiplication wraps mod 2^32)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    x = x ^ (x >> 16)
    return x


@triton.jit
def _float_to_key(x):
    """Order-preserving map FP32 -> int (as int64): negative floats get their magnitude bits flipped."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def _key_to_float(key):
    """Inverse of `_float_to_key` (the bit flip is its own inverse)."""
    bits = key.to(tl.int32)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.float32, bitcast=True)


@triton.jit
def _scaled_logits(row_ptr, cols, vocab, temperature):
    """x = logits / T for one block of columns; columns past the vocabulary read -inf."""
    raw = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    return tl.math.div_rn(raw, temperature)  # IEEE division, bit-equal to torch's


@triton.jit
def _pivots(lo, hi, NUM_PIVOTS: tl.constexpr):
    """NUM_PIVOTS keys spread over (lo, hi): at least one strictly inside when hi - lo >= 2."""
    j = tl.arange(1, NUM_PIVOTS + 1).to(tl.int64)
    return lo + ((hi - lo) * j) // (NUM_PIVOTS + 1)


@triton.jit
def _row_max_min(row_ptr, vocab, temperature, BLOCK_V: tl.constexpr):
    top = tl.full([BLOCK_V], float("-inf"), tl.float32)
    bottom = tl.full([BLOCK_V], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _scaled_logits(row_ptr, cols, vocab, temperature)
        top = tl.maximum(top, x)
        bottom = tl.minimum(bottom, tl.where(cols < vocab, x, float("inf")))
    return tl.max(top, axis=0), tl.min(bottom, axis=0)


@triton.jit
def _count_above(
    row_ptr, vocab, temperature, taus, BLOCK_V: tl.constexpr, NUM_PIVOTS: tl.constexpr
):
    """For each threshold tau: how many x > tau."""
    counts = tl.zeros([NUM_PIVOTS], tl.int32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _scaled_logits(row_ptr, cols, vocab, temperature)
        counts += tl.sum((x[:, None] > taus[None, :]).to(tl.int32), axis=0)
    return counts


@triton.jit
def _mass_above(
    row_ptr,
    vocab,
    temperature,
    row_max,
    floor,
    taus,
    BLOCK_V: tl.constexpr,
    NUM_PIVOTS: tl.constexpr,
):
    """For each threshold tau: the sum of exp(x - max) over x > tau among x >= floor."""
    mass = tl.zeros([NUM_PIVOTS], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _scaled_logits(row_ptr, cols, vocab, temperature)
        e = tl.where(x >= floor, tl.exp(x - row_max), 0.0)
        mass += tl.sum(tl.where(x[:, None] > taus[None, :], e[:, None], 0.0), axis=0)
    return mass


@triton.jit
def _survivor_mass(row_ptr, vocab, temperature, row_max, floor, BLOCK_V: tl.constexpr):
    """The softmax normalizer over the survivors: the sum of exp(x - max) over x >= floor."""
    mass = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _scaled_logits(row_ptr, cols, vocab, temperature)
        mass += tl.where(x >= floor, tl.exp(x - row_max), 0.0)
    return tl.sum(mass, axis=0)


@triton.jit
def _kth_largest(
    row_ptr,
    vocab,
    temperature,
    k,
    row_min,
    row_max,
    BLOCK_V: tl.constexpr,
    NUM_PIVOTS: tl.constexpr,
):
    """The k-th largest x (ties counted): the smallest value with fewer than k values above it."""
    lo = _float_to_key(row_min) - 1  # invariant: lo fails (count >= k), hi passes
    hi = _float_to_key(row_max)
    while hi - lo > 1:
        keys = _pivots(lo, hi, NUM_PIVOTS)
        counts = _count_above(row_ptr, vocab, temperature, _key_to_float(keys), BLOCK_V, NUM_PIVOTS)
        passes = counts < k
        lo = tl.max(tl.where(passes, lo, keys), axis=0)
        hi = tl.min(tl.where(passes, keys, hi), axis=0)
    return _key_to_float(hi)


@triton.jit
def _top_p_cutoff(
    row_ptr,
    vocab,
    temperature,
    top_p,
    floor,
    row_max,
    BLOCK_V: tl.constexpr,
    NUM_PIVOTS: tl.constexpr,
):
    """The smallest x >= floor whose strictly-larger mass (softmax over x >= floor) is < top_p.

    The row maximum always passes (its mass above is 0), so top_p <= 0 keeps the maximum only.
    """
    total = _survivor_mass(row_ptr, vocab, temperature, row_max, floor, BLOCK_V)
    budget = top_p * total
    lo = _float_to_key(floor) - 1  # invariant: lo fails (mass above >= budget), hi passes
    hi = _float_to_key(row_max)
    while hi - lo > 1:
        keys = _pivots(lo, hi, NUM_PIVOTS)
        taus = _key_to_float(keys)
        mass = _mass_above(row_ptr, vocab, temperature, row_max, floor, taus, BLOCK_V, NUM_PIVOTS)
        passes = (mass < budget) | (taus >= row_max)
        lo = tl.max(tl.where(passes, lo, keys), axis=0)
        hi = tl.min(tl.where(passes, keys, hi), axis=0)
    return _key_to_float(hi)


@triton.jit
def _sample_kernel(
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seeds_ptr,
    steps_ptr,
    out_ptr,
    vocab,
    stride_row,
    BLOCK_V: tl.constexpr,
    NUM_PIVOTS: tl.constexpr,
    PRECISE_LOG: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    greedy = temperature <= 0
    # Greedy rows still run the sampling loop below (keeping the kernel a single path); they
    # use T = 1 and no noise, so the loop degenerates to an argmax of the raw logits.
    temperature = tl.where(greedy, 1.0, temperature)
    top_k = tl.load(top_k_ptr + row).to(tl.int64)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    k = tl.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    use_top_k = (k < vocab) & (~greedy)
    use_top_p = (top_p < 1.0) & (~greedy)

    threshold = tl.full([], float("-inf"), tl.float32)
    if use_top_k | use_top_p:
        row_max, row_min = _row_max_min(row_ptr, vocab, temperature, BLOCK_V)
        if use_top_k:
            threshold = _kth_largest(
                row_ptr, vocab, temperature, k, row_min, row_max, BLOCK_V, NUM_PIVOTS
            )
        else:
            threshold = row_min
        if use_top_p:
            threshold = _top_p_cutoff(
                row_ptr, vocab, temperature, top_p, threshold, row_max, BLOCK_V, NUM_PIVOTS
            )

    seed = tl.load(seeds_ptr + row).to(tl.uint32)  # the low 32 bits, as the reference masks
    step = tl.load(steps_ptr + row).to(tl.uint32)
    row_hash = _hash32(_hash32(seed) ^ step)
    best = tl.full([], float("-inf"), tl.float32)
    best_col = tl.full([], 0, tl.int32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _scaled_logits(row_ptr, cols, vocab, temperature)
        h = _hash32(row_hash ^ cols.to(tl.uint32))
        u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # as reference.uniform_noise
        # libdevice's logf is the one torch's CUDA log uses: bit-equal noise. (A constexpr
        # branch, not a ternary: the interpreter must never touch libdevice.)
        if PRECISE_LOG:  # noqa: SIM108
            gumbel = -libdevice.log(-libdevice.log(u))
        else:
            gumbel = -tl.log(-tl.log(u))
        score = tl.where(greedy, x, x + gumbel)
        score = tl.where((x >= threshold) & (cols < vocab), score, float("-inf"))
        block_best, block_col = tl.max(
            score, axis=0, return_indices=True, return_indices_tie_break_left=True
        )
        best_col = tl.where(block_best > best, start + block_col, best_col)
        best = tl.maximum(best, block_best)
    tl.store(out_ptr + row, best_col.to(tl.int64))


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> torch.Tensor:
    """One token per row of logits [B, V], the same ids as `reference.sample` (see module doc)."""
    logits = unit_last_stride(logits)
    temperature, top_k, top_p = temperature.contiguous(), top_k.contiguous(), top_p.contiguous()
    seeds, steps = seeds.contiguous(), steps.contiguous()
    batch, vocab = logits.shape
    out = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    if batch == 0 or vocab == 0:
        return out
    block_v = min(_BLOCK_V, next_pow2(vocab))
    _sample_kernel[(batch,)](
        logits,
        temperature,
        top_k,
        top_p,
        seeds,
        steps,
        out,
        vocab,
        logits.stride(0),
        BLOCK_V=block_v,
        NUM_PIVOTS=_NUM_PIVOTS,
        PRECISE_LOG=not INTERPRET,
        num_warps=8 if block_v >= 1024 else 4,
    )
    return out
