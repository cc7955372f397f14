# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""Greedy argmax and seeded temperature / top-k / top-p sampling over the vocabulary.

`argmax` is two-stage: programs over (row, vocabulary chunk) find chunk maxima, a second kernel
picks the best chunk per row (the lowest index wins ties in both stages).

`sample` reproduces `reference.sample` without sorting the row. Every pass over the logits is
split over (row, column chunk) programs, so that even a single row keeps the whole GPU busy;
small one-program-per-row kernels in between combine what the chunks found. Per row:
  1. greedy rows (temperature <= 0) use T = 1 and no noise: the argmax of the raw logits;
  2. x = (logits - the row's largest logit) / T (IEEE division, as torch does; why from the
     largest: see `reference`'s sampling notes);
  3. top-k: the k-th largest x, i.e. the largest value t with count(x >= t) >= k;
  4. top-p: among the top-k survivors, the largest value t with mass(x >= t) >= p * (their
     total mass), where a value's mass is exp(x) (x <= 0), its softmax probability up to the
     normalizer. (This is the reference's rule: keep x if the mass strictly above x is < p.)
  5. the answer is argmax(x + Gumbel noise) over x >= the threshold, with the reference's
     hash-based noise, so both backends return the same ids for the same inputs.

Steps 3 and 4 are the same weighted radix select (weight 1 for top-k, the mass for top-p) over
the 32-bit order-preserving integer key of each FP32 value, 8 bits per round, highest bits first:
  - a histogram kernel, programs over (row, chunk): among the values whose key starts with the
    prefix chosen so far, the total weight per value of the next 8 key bits (256 bins), one
    histogram per chunk in a [B, chunks, 256] buffer;
  - a select kernel, one program per row: adds up the chunks' histograms, walks the bins from
    the top and picks the bin in which the running weight reaches the weight still wanted. That
    bin extends the prefix, and the weight of the bins above it is taken off what is wanted.
After 4 rounds the prefix is a whole key, so the threshold is an exact row value.
Weights are integers: counts, and the mass in fixed point (exp(x - max) * 2^40, truncated).
Integer sums are exact and associative, so the result does not depend on how the chunks or the
threads split the work (deterministic run to run), and the weight of a bin in one round is
exactly the sum of its sub-bins in the next. Counts come from `tl.histogram`; Triton has no
weighted histogram, so masses are integer atomic adds into the program's own histogram.

Cost. The launch count is fixed for a shape (the call is captured in CUDA graphs: nothing is
read back on the host; rows that need less work branch inside the kernels on their own flags):
19 launches = row max (1) + top-k rounds (4 x 2) + top-p rounds (4 x 2) + draw (chunks + merge).
The caller may promise that no row uses top-k (or top-p): that filter's launches are skipped
(3 launches with neither filter, 11 with one).
Passes over a row: 1 for greedy rows (every other kernel returns at once for them), 2 for
temperature-only rows (row max + draw), 6 with top-k or top-p alone (row max + 4 rounds +
draw), 10 with both. (The previous one-program-per-row bisection made about 25 passes.)

Agreement with the reference: the kept set is identical unless top_p lands within FP32
rounding (~1e-6 relative) of a cumulative mass (the reference's FP32 cumsum rounds; the fixed
point mass is within V * 2^-40 of exact), and even then the id only differs if that one
boundary token wins the draw. On the GPU the noise is bit-identical to torch's (libdevice's
logf is the one torch's CUDA `log` uses); under the interpreter numpy's log stands in.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..errors import KernelError
from ._common import (
    INTERPRET,
    cdiv,
    next_pow2,
    num_sms,
    unit_last_stride,
    use_pdl,
    wait_for_prior_kernels,
)

# Sampling: columns per load inside a chunk program, and the bounds on a chunk's width.
_BLOCK_V = 1024
_MIN_CHUNK = 2048
_MAX_CHUNK = 32768
# The radix select: 8 key bits per round, 4 rounds for a 32-bit key.
_RADIX_BITS = 8
_ROUND_SHIFTS = (24, 16, 8, 0)
# Sizes passed as plain (run-time) arguments and kept out of Triton's specialization (which
# would compile a variant for a value of 1 or a multiple of 16): the chunk width and count
# change with the batch size, and the round's shift with the round, but none needs to be a
# compile-time constant. So the sampler compiles once per vocabulary and dtype, not once per
# batch size and round (19 kernels for each of 5 chunk widths, seconds on a first request).
_RUNTIME_SIZES = ["num_chunks", "chunk_size"]
# Fixed-point scale of the top-p mass exp(x - max) <= 1. A row's total must fit in int64:
# vocab * 2^40 < 2^63 allows up to 2^23 columns.
_MASS_SCALE = 2.0**40
_MAX_VOCAB = 2**23


# --- argmax -------------------------------------------------------------------------------


@triton.jit
def _argmax_chunks_kernel(
    logits_ptr,
    chunk_max_ptr,
    chunk_arg_ptr,
    vocab,
    stride_row,
    num_chunks,
    CHUNK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
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
def _argmax_merge_kernel(
    chunk_max_ptr, chunk_arg_ptr, out_ptr, num_chunks, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr
):
    wait_for_prior_kernels(USE_PDL)
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
    chunk = _vocab_chunk(batch, vocab, logits.device, 1024, 16384)
    num_chunks = cdiv(vocab, chunk)
    chunk_max = torch.empty((batch, num_chunks), dtype=torch.float32, device=logits.device)
    chunk_arg = torch.empty((batch, num_chunks), dtype=torch.int32, device=logits.device)
    pdl = use_pdl(logits.device)
    _argmax_chunks_kernel[(batch, num_chunks)](
        logits,
        chunk_max,
        chunk_arg,
        vocab,
        logits.stride(0),
        num_chunks,
        CHUNK=chunk,
        USE_PDL=pdl,
        num_warps=max(1, min(8, chunk // 512)),
        launch_pdl=pdl,
    )
    _argmax_merge_kernel[(batch,)](
        chunk_max,
        chunk_arg,
        out,
        num_chunks,
        BLOCK_C=next_pow2(num_chunks),
        USE_PDL=pdl,
        num_warps=1,
        launch_pdl=pdl,
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
    """Order-preserving map FP32 -> unsigned 32-bit key (as int64, in [0, 2^32)).

    Negative floats get their magnitude bits flipped (then the signed int32 order is the float
    order), and the offset 2^31 makes the key unsigned, so its bits can be read as radix digits.
    """
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) + 2147483648


@triton.jit
def _key_to_float(key):
    """Inverse of `_float_to_key` (the bit flip is its own inverse)."""
    bits = (key - 2147483648).to(tl.int32)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.float32, bitcast=True)


@triton.jit
def _row_filters(temperature_ptr, top_k_ptr, top_p_ptr, row, vocab):
    """One row's sampling parameters: (T, greedy, k, use_top_k, top_p, use_top_p).

    Greedy rows (T <= 0) get T = 1, no noise and no filters: the draw is an argmax of the raw
    logits. top_k outside 1..vocab-1 and top_p >= 1 are off.
    """
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    greedy = temperature <= 0
    temperature = tl.where(greedy, 1.0, temperature)
    top_k = tl.load(top_k_ptr + row).to(tl.int64)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    k = tl.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    use_top_k = (k < vocab) & (~greedy)
    use_top_p = (top_p < 1.0) & (~greedy)
    return temperature, greedy, k, use_top_k, top_p, use_top_p


@triton.jit
def _raw_logits(row_ptr, cols, vocab):
    """One block of a row's logits in FP32; columns past the vocabulary read -inf."""
    return tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)


@triton.jit
def _scaled_logits(row_ptr, cols, vocab, offset, temperature):
    """x = (logits - offset) / T for one block of columns (-inf past the vocabulary)."""
    raw = _raw_logits(row_ptr, cols, vocab)
    return tl.math.div_rn(raw - offset, temperature)  # IEEE division, bit-equal to torch's


@triton.jit
def _row_offset(chunk_max_ptr, row, num_chunks, greedy):
    """What the row's logits are measured from (`reference._sampling_offset`): the largest of
    its chunk maxima for a sampled row, 0 for a greedy row (whose maxima were never written:
    what they hold is read and dropped) and for a row whose largest is not finite."""
    c = tl.arange(0, 64)
    top = tl.full([], float("-inf"), tl.float32)
    for c0 in range(0, num_chunks, 64):
        maxima = tl.load(
            chunk_max_ptr + row * num_chunks + c0 + c,
            mask=c0 + c < num_chunks,
            other=float("-inf"),
        )
        top = tl.maximum(top, tl.max(maxima, axis=0))
    finite = (top > float("-inf")) & (top < float("inf"))
    return tl.where(greedy | ~finite, 0.0, top)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def _chunk_max_kernel(
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    chunk_max_ptr,
    vocab,
    stride_row,
    num_chunks,
    chunk_size,
    BLOCK_V: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Chunk maxima of the raw logits of the sampled rows (greedy rows write nothing)."""
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    _, greedy, _, _, _, _ = _row_filters(temperature_ptr, top_k_ptr, top_p_ptr, row, vocab)
    if not greedy:
        row_ptr = logits_ptr + row * stride_row
        top = tl.full([BLOCK_V], float("-inf"), tl.float32)
        for start in range(0, chunk_size, BLOCK_V):
            cols = chunk * chunk_size + start + tl.arange(0, BLOCK_V)
            top = tl.maximum(top, _raw_logits(row_ptr, cols, vocab))
        tl.store(chunk_max_ptr + row * num_chunks + chunk, tl.max(top, axis=0))


@triton.jit(do_not_specialize=[*_RUNTIME_SIZES, "shift"])
def _radix_histogram_kernel(
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    chunk_max_ptr,
    threshold_ptr,
    prefix_ptr,
    hist_ptr,
    vocab,
    stride_row,
    num_chunks,
    chunk_size,
    shift,
    TOP_P: tl.constexpr,
    BLOCK_V: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One round, one (row, chunk): the weight per next-8-bit digit of the keys in the prefix.

    top-k (TOP_P false): the count of values. top-p: the fixed-point mass of the values that
    survived top-k (x >= the top-k threshold). Writes hist[row, chunk, 0:256] (int64).
    """
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    temperature, greedy, _, use_top_k, _, use_top_p = _row_filters(
        temperature_ptr, top_k_ptr, top_p_ptr, row, vocab
    )
    active = use_top_p if TOP_P else use_top_k
    if active:
        row_ptr = logits_ptr + row * stride_row
        bins = tl.arange(0, 256)
        program_hist = hist_ptr + (row * num_chunks + chunk) * 256  # this program's histogram
        # The first round has no prefix yet (key >> 32 is 0 for every key).
        prefix = tl.load(prefix_ptr + row, mask=shift < 24, other=0)
        offset = _row_offset(chunk_max_ptr, row, num_chunks, greedy)
        if TOP_P:
            floor = tl.load(threshold_ptr + row)
            # This histogram belongs to this program alone: zero it, then let every thread add to
            # it (the barrier orders the zeroing before the other threads' atomics).
            tl.store(program_hist + bins, tl.zeros([256], tl.int64))
            tl.debug_barrier()
        else:
            counts = tl.zeros([256], tl.int32)
        for start in range(0, chunk_size, BLOCK_V):
            cols = chunk * chunk_size + start + tl.arange(0, BLOCK_V)
            x = _scaled_logits(row_ptr, cols, vocab, offset, temperature)
            key = _float_to_key(x)
            # Count only real columns (the padding reads -inf, which is also a real value).
            match = (cols < vocab) & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
            digit = ((key >> shift) & 255).to(tl.int32)
            if TOP_P:
                mass = (tl.exp(x) * 2.0**40).to(tl.int64)  # x <= 0 (0 at the row's largest)
                add = match & (x >= floor) & (mass > 0)
                tl.atomic_add(program_hist + digit, mass, mask=add, sem="relaxed", scope="cta")
            else:
                counts += tl.histogram(digit, 256, mask=match)
        if not TOP_P:
            tl.store(program_hist + bins, counts.to(tl.int64))


@triton.jit(do_not_specialize=["num_chunks", "shift"])
def _radix_select_kernel(
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    hist_ptr,
    prefix_ptr,
    wanted_ptr,
    threshold_ptr,
    vocab,
    num_chunks,
    shift,
    TOP_P: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One round, one row: pick the next 8 bits of the threshold's key from the histograms.

    The threshold is the largest key t whose weight at or above t reaches the target (k for
    top-k; ceil(p * total mass) for top-p). `wanted` is what is still missing inside the prefix.
    The last round (shift 0) writes the threshold. Rows without this filter write nothing,
    except that the first top-k round sets their threshold to -inf (keep everything).
    """
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    _, _, k, use_top_k, top_p, use_top_p = _row_filters(
        temperature_ptr, top_k_ptr, top_p_ptr, row, vocab
    )
    if not TOP_P:
        tl.store(threshold_ptr + row, float("-inf"), mask=(~use_top_k) & (shift == 24))
    active = use_top_p if TOP_P else use_top_k
    if active:
        bins = tl.arange(0, 256)
        weight = tl.zeros([256], tl.int64)
        for chunk in range(0, num_chunks):  # a fixed order (integers: any order is exact)
            weight += tl.load(hist_ptr + (row * num_chunks + chunk) * 256 + bins)
        total = tl.sum(weight, axis=0)
        if shift == 24:
            prefix = tl.full([], 0, tl.int64)
            if TOP_P:
                # The first round sees every survivor: total is their whole mass. The target
                # is ceil(p * total), at least 1 so that p <= 0 keeps the maximum.
                budget = top_p.to(tl.float64) * total.to(tl.float64)
                wanted = budget.to(tl.int64)
                wanted += (wanted.to(tl.float64) < budget).to(tl.int64)
                wanted = tl.maximum(wanted, 1)
            else:
                wanted = k
        else:
            prefix = tl.load(prefix_ptr + row)
            wanted = tl.load(wanted_ptr + row)
        # at_or_above[b]: the weight in bins b..255. It is non-increasing in b and the whole
        # prefix holds at least `wanted` (at_or_above[0] = total), so the digit is the last bin
        # where it still reaches `wanted`.
        at_or_above = total - tl.cumsum(weight, axis=0) + weight
        digit = tl.max(tl.where(at_or_above >= wanted, bins, 0), axis=0)
        above = tl.sum(tl.where(bins == digit, at_or_above - weight, 0), axis=0)
        prefix = prefix | (digit.to(tl.int64) << shift)
        tl.store(prefix_ptr + row, prefix)
        tl.store(wanted_ptr + row, wanted - above)
        tl.store(threshold_ptr + row, _key_to_float(prefix), mask=shift == 0)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def _draw_chunks_kernel(
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seeds_ptr,
    steps_ptr,
    chunk_max_ptr,
    threshold_ptr,
    chunk_best_ptr,
    chunk_arg_ptr,
    vocab,
    stride_row,
    num_chunks,
    chunk_size,
    BLOCK_V: tl.constexpr,
    PRECISE_LOG: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The Gumbel-max draw over one chunk: the best x + noise among x >= threshold, and where.

    Greedy rows score x alone (T = 1): an argmax. The lowest column wins ties, here and in the
    merge (`_argmax_merge_kernel`), as torch.argmax does.
    """
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row * stride_row
    temperature, greedy, _, _, _, _ = _row_filters(
        temperature_ptr, top_k_ptr, top_p_ptr, row, vocab
    )
    offset = _row_offset(chunk_max_ptr, row, num_chunks, greedy)
    threshold = tl.load(threshold_ptr + row)
    seed = tl.load(seeds_ptr + row).to(tl.uint32)  # the low 32 bits, as the reference masks
    step = tl.load(steps_ptr + row).to(tl.uint32)
    row_hash = _hash32(_hash32(seed) ^ step)
    best = tl.full([], float("-inf"), tl.float32)
    best_col = tl.full([], 0, tl.int32) + chunk * chunk_size
    for start in range(0, chunk_size, BLOCK_V):
        cols = chunk * chunk_size + start + tl.arange(0, BLOCK_V)
        x = _scaled_logits(row_ptr, cols, vocab, offset, temperature)
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
        best_col = tl.where(block_best > best, chunk * chunk_size + start + block_col, best_col)
        best = tl.maximum(best, block_best)
    tl.store(chunk_best_ptr + row * num_chunks + chunk, best)
    tl.store(chunk_arg_ptr + row * num_chunks + chunk, best_col)


def _vocab_chunk(batch: int, vocab: int, device: torch.device, least: int, most: int) -> int:
    """Columns per (row, chunk) program of a pass over the logits: about four programs per SM
    in all, a power of two from `least` to `most` (and no wider than the vocabulary needs)."""
    wanted_chunks = cdiv(4 * num_sms(device), batch)
    chunk = min(most, max(least, next_pow2(cdiv(vocab, wanted_chunks))))
    return min(chunk, next_pow2(vocab))


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    *,
    any_top_k: bool = True,
    any_top_p: bool = True,
) -> torch.Tensor:
    """One token per row of logits [B, V], the same ids as `reference.sample` (see module doc).

    `any_top_k=False` / `any_top_p=False` promise that no row uses that filter (the caller
    knows its rows on the host); the filter's launches are then skipped, which matters because
    the sampler runs eagerly, where each launch costs tens of microseconds of host time. With
    neither filter a call is 3 launches (row max, the draw and its merge) instead of 19.
    """
    logits = unit_last_stride(logits)
    temperature, top_k, top_p = temperature.contiguous(), top_k.contiguous(), top_p.contiguous()
    seeds, steps = seeds.contiguous(), steps.contiguous()
    batch, vocab = logits.shape
    device = logits.device
    out = torch.empty((batch,), dtype=torch.int64, device=device)
    if batch == 0 or vocab == 0:
        return out
    if vocab > _MAX_VOCAB:
        raise KernelError(f"sample: vocabulary {vocab} > {_MAX_VOCAB} (the top-p mass is int64)")
    chunk = _vocab_chunk(batch, vocab, device, _MIN_CHUNK, _MAX_CHUNK)
    num_chunks = cdiv(vocab, chunk)
    block_v = min(_BLOCK_V, chunk)
    num_warps = 4 if block_v >= 512 else 2
    # Scratch: written before it is read, every launch (torch.empty is fine in a CUDA graph).
    chunk_max = torch.empty((batch, num_chunks), dtype=torch.float32, device=device)
    hist = torch.empty((batch, num_chunks, 1 << _RADIX_BITS), dtype=torch.int64, device=device)
    prefix = torch.empty((batch,), dtype=torch.int64, device=device)
    wanted = torch.empty((batch,), dtype=torch.int64, device=device)
    threshold = torch.empty((batch,), dtype=torch.float32, device=device)
    chunk_best = torch.empty((batch, num_chunks), dtype=torch.float32, device=device)
    chunk_arg = torch.empty((batch, num_chunks), dtype=torch.int32, device=device)
    params = (temperature, top_k, top_p)
    grid = (batch, num_chunks)
    # Under PDL each kernel launches while its predecessor drains and waits before reading
    # anything (19 launches with both filters: their gaps are most of a batch-1 draw).
    pdl = use_pdl(device)

    _chunk_max_kernel[grid](
        logits,
        *params,
        chunk_max,
        vocab,
        logits.stride(0),
        num_chunks,
        chunk,
        BLOCK_V=block_v,
        USE_PDL=pdl,
        num_warps=num_warps,
        launch_pdl=pdl,
    )
    if not any_top_k:  # the first top-k round is what sets "keep everything" otherwise
        threshold.fill_(float("-inf"))
    phases = [p for p, used in ((False, any_top_k), (True, any_top_p)) if used]
    for top_p_phase in phases:  # top-k first: top-p weighs only its survivors
        for shift in _ROUND_SHIFTS:
            _radix_histogram_kernel[grid](
                logits,
                *params,
                chunk_max,
                threshold,
                prefix,
                hist,
                vocab,
                logits.stride(0),
                num_chunks,
                chunk,
                shift,
                TOP_P=top_p_phase,
                BLOCK_V=block_v,
                USE_PDL=pdl,
                num_warps=num_warps,
                launch_pdl=pdl,
            )
            _radix_select_kernel[(batch,)](
                *params,
                hist,
                prefix,
                wanted,
                threshold,
                vocab,
                num_chunks,
                shift,
                TOP_P=top_p_phase,
                USE_PDL=pdl,
                num_warps=2,
                launch_pdl=pdl,
            )
    _draw_chunks_kernel[grid](
        logits,
        *params,
        seeds,
        steps,
        chunk_max,
        threshold,
        chunk_best,
        chunk_arg,
        vocab,
        logits.stride(0),
        num_chunks,
        chunk,
        BLOCK_V=block_v,
        PRECISE_LOG=not INTERPRET,
        USE_PDL=pdl,
        num_warps=num_warps,
        launch_pdl=pdl,
    )
    # BLOCK_C from the vocabulary alone (the most chunks any batch size gets), not from this
    # batch's chunk count: one compiled merge for every batch size.
    max_chunks = cdiv(vocab, min(_MIN_CHUNK, next_pow2(vocab)))
    _argmax_merge_kernel[(batch,)](
        chunk_best,
        chunk_arg,
        out,
        num_chunks,
        BLOCK_C=next_pow2(max_chunks),
        USE_PDL=pdl,
        num_warps=1,
        launch_pdl=pdl,
    )
    return out
