"""The prefill steps a warm-up runs so that no request pays for compiling a kernel variant.

Triton compiles a kernel again for each new value of its block sizes and, for integer
arguments, for each new kind of value: 1, a multiple of 16, or neither. Both move with the
prompt length: prefill attention's query tile is the next power of two of the longest chunk
(16 to 128 tokens), and RoPE's tokens per program double each time the token count doubles
past a threshold. So the rule: 1, every power of two from 16 to the largest chunk and the
length just below each (the same tile, the other kind of integer), and at the top, where the
last range may hold no power of two, the largest chunk, one less, and the largest multiple of
16 up to it. Every range in which those block sizes stay the same is then run in both kinds.

A prompt step also samples a row per sequence that ends its prompt in it, and the final norm,
the LM head and the sampler run on those rows alone: their kernels' variants move with that
count (a matmul plan's row bands, an 8-bit matmul's tile; every threshold a power of two). So
the warm-up also runs steps of many two-token prompts, each sampling: every power of two from
2 up to max_num_seqs and the count just above it (the next band, the other kind of integer),
max_num_seqs and the largest multiple of 16 up to it.
"""

from __future__ import annotations

from sv_model.step import StepInputs

# Up to this many tokens a prompt is also run as two sequences: the attention grid has a
# dimension per sequence, and one sequence (1) and two are different kinds of argument. Past
# it only the token count matters (RoPE's tokens per program).
TWO_SEQUENCES_UP_TO = 2048


def prompt_lengths(max_prefill_tokens: int) -> list[int]:
    """The prompt lengths to warm up with, by the rule above, ascending."""
    largest = max_prefill_tokens
    lengths = {1, largest, largest - 1, largest // 16 * 16}
    power = 16
    while power <= largest:
        lengths |= {power - 1, power}
        power *= 2
    return sorted(n for n in lengths if n > 0)


def sampling_counts(max_num_seqs: int) -> list[int]:
    """How many sequences sample in the warm-up's steps of many prompts (see the module doc)."""
    counts = {max_num_seqs, max_num_seqs // 16 * 16}  # the top band, in both kinds
    power = 2
    while power <= max_num_seqs:
        counts |= {power, power + 1}
        power *= 2
    return sorted(n for n in counts if 2 <= n <= max_num_seqs)


def warmup_steps(
    max_prefill_tokens: int, scratch_table_row: int, max_num_seqs: int
) -> list[StepInputs]:
    """One prefill per prompt length (and a second with two sequences, up to
    TWO_SEQUENCES_UP_TO), then one per `sampling_counts` of that many two-token prompts (as
    far as max_prefill_tokens holds them), all on the scratch table row, whose block table
    points every position at the scratch page. Each also feeds a token from the device, which
    compiles `ops.feed_tokens` (a step after an overlapped one does that)."""
    shapes = [
        (n, seqs)
        for n in prompt_lengths(max_prefill_tokens)
        for seqs in ((1, 2) if n <= TWO_SEQUENCES_UP_TO else (1,))
    ]
    shapes += [
        (2, seqs) for seqs in sampling_counts(max_num_seqs) if 2 * seqs <= max_prefill_tokens
    ]
    return [
        StepInputs(
            token_ids=[0] * (n * seqs),
            positions=list(range(n)) * seqs,
            table_rows=[scratch_table_row] * seqs,
            query_lens=[n] * seqs,
            seq_lens=[n] * seqs,
            sample_rows=list(range(seqs)),
            feed=[(0, 0)],
        )
        for n, seqs in shapes
    ]
