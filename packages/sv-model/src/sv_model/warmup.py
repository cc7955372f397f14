"""The prefill steps a warm-up runs so that no request pays for compiling a kernel variant.

Triton compiles a kernel again for each new value of its block sizes and, for integer
arguments, for each new kind of value: 1, a multiple of 16, or neither. Both move with the
prompt length: prefill attention's query tile is the next power of two of the longest chunk
(16 to 128 tokens), and RoPE's tokens per program double each time the token count doubles
past a threshold. So the rule: 1, every power of two from 16 to the largest chunk and the
length just below each (the same tile, the other kind of integer), and at the top, where the
last range may hold no power of two, the largest chunk, one less, and the largest multiple of
16 up to it. Every range in which those block sizes stay the same is then run in both kinds.
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


def warmup_steps(max_prefill_tokens: int, scratch_table_row: int) -> list[StepInputs]:
    """One prefill per prompt length (and a second with two sequences, up to
    TWO_SEQUENCES_UP_TO), on the scratch table row, whose block table points every position at the
    scratch page. Each also feeds a token from the device, which compiles `ops.feed_tokens` (a
    step after an overlapped one does that)."""
    steps = []
    for n in prompt_lengths(max_prefill_tokens):
        for seqs in (1, 2) if n <= TWO_SEQUENCES_UP_TO else (1,):
            steps.append(
                StepInputs(
                    token_ids=[0] * (n * seqs),
                    positions=list(range(n)) * seqs,
                    table_rows=[scratch_table_row] * seqs,
                    query_lens=[n] * seqs,
                    seq_lens=[n] * seqs,
                    sample_rows=list(range(seqs)),
                    feed=[(0, 0)],
                )
            )
    return steps
