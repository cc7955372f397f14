"""Speculative decoding by prompt lookup: drafts from a sequence's own tokens, and how many to try.

A decoder that speculates feeds its newest token followed by a draft of up to k tokens, in one
step (k + 1 query positions). The model's choice at each of those positions (argmax, or a sample
drawn with the request's seed at that output index) is what plain decoding would have produced
there, given that the drafts before it were right. So the sequence keeps its first choice, and
then one more choice for every draft token that equals the choice before it: the longest
accepted prefix plus one bonus token. With greedy decoding the output is that of plain decoding.

With sampling this is exactly rejection sampling against a draft that is a point mass on x: the
choice y is drawn from the target distribution p, x is accepted iff y == x (probability p(x)),
and on rejection y is distributed as p with x removed and renormalized (the residual
max(0, p - q) / Z for q = the point mass). Because the choice at output index i is drawn from
the noise of (seed, i), as in plain decoding, the output under a seed is also the same tokens
the plain engine samples (up to floating-point differences between the two attention paths).

The drafter (prompt lookup, no second model): find the latest earlier occurrence of the last n
tokens (n = `ngram` down to `min_ngram`) in the prompt and output, and propose the tokens that
followed it. Each sequence keeps an index of its n-grams, extended as it grows.

Adaptivity, per sequence: the next draft is twice as long as the last accepted run plus its
bonus token (twice the draft after a fully accepted one), at most k and at least k / 2: at batch
1 a verify step costs about the same for any k up to 15 (it is bound by latency, not by its
rows: 1.03-1.10 ms on the H200 against 0.88 for a plain step, launch and wait), and an
accepted run's length says little about the next one's. k = 15 is the most the decode graphs
take (a verify run is at most 16 decode rows, sv_model.step_packing); a longer draft runs its
verify step outside them, ten times slower. A sequence whose drafts keep failing stops
speculating for a while (see `DraftState.record`). Per step: no draft while more than
`max_batch` requests are unfinished, running or waiting (vLLM's `disable_by_batch_size`).

A step with drafts needs the step before it resolved (its drafts and positions follow from that
step's tokens), so it cannot overlap the host's work with the device's: a resolved step costs
about 0.1 ms more at batch 1 on the H200. So the engine waits only where a draft is likely
(`DraftState.may_draft`): the tokens known so far end in an n-gram of at least `min_ngram`
tokens seen before. On the default model's grounded prompts a suffix of 2+ matching tokens is
followed by an accepted draft 59-97% of the time, a single token's 26% (0.95 tokens accepted
on average); at today's verify cost even the single token's pays (a verify step pays from
~0.3 accepted tokens). The defaults (shortest suffix 1, six misses before a pause of 2 steps)
were chosen by `scripts/spec_policy_model.py --grid` on the held-out prompts
(spec_prompts_heldout.json) alone, and model 1.85x plain on spec_prompts.json against 1.79x for
the earlier ones (shortest suffix 2, four misses, 8 steps): BENCHMARKS.md, "Sixteenth session".
In a large batch the lost overlap and the extra rows cost more than the few accepted tokens save.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass

from .errors import SchedulerError


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculationConfig:
    """Prompt-lookup speculation.

    max_draft:    k, the most draft tokens one step verifies for one sequence.
    ngram:        n, the longest suffix looked up in the sequence's tokens.
    min_ngram:    the shortest suffix looked up when the longer ones are not found; also the
                  shortest known suffix for which the engine waits to draft (`may_draft`).
    miss_limit:   drafts in a row that find nothing or get nothing accepted before the sequence
                  pauses speculation.
    first_pause:  steps of the first pause; each further pause in a row doubles it ...
    max_pause:    ... up to this many steps.
    max_batch:    the most unfinished requests (running or waiting) under which steps
                  draft; with more, no sequence drafts (None: no limit).
    """

    max_draft: int = 15
    ngram: int = 3
    min_ngram: int = 1
    miss_limit: int = 6
    first_pause: int = 2
    max_pause: int = 512
    max_batch: int | None = 32

    def __post_init__(self) -> None:
        names = ("max_draft", "ngram", "min_ngram", "miss_limit", "first_pause", "max_pause")
        for name in (*names, "max_batch"):
            value = getattr(self, name)
            if value is None and name == "max_batch":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SchedulerError(
                    f"SpeculationConfig.{name} must be a positive integer, got {value!r}"
                )
        if self.min_ngram > self.ngram:
            raise SchedulerError(
                f"SpeculationConfig.min_ngram ({self.min_ngram}) must not exceed ngram "
                f"({self.ngram})"
            )
        if self.first_pause > self.max_pause:
            raise SchedulerError(
                f"SpeculationConfig.first_pause ({self.first_pause}) must not exceed max_pause "
                f"({self.max_pause})"
            )


def accepted_run(draft: SequenceOf[int], choices: SequenceOf[int]) -> int:
    """How many draft tokens the model's choices accept: the longest prefix where choice i
    (made after the newest token and drafts 0..i-1) equals draft i."""
    n = 0
    for d, c in zip(draft, choices, strict=False):
        if d != c:
            break
        n += 1
    return n


class DraftState:
    """One sequence's drafter: its n-gram index and its adaptive draft length."""

    __slots__ = ("config", "index", "indexed", "k", "misses", "pause", "resume_step")

    def __init__(self, config: SpeculationConfig) -> None:
        self.config = config
        # n-gram -> the position right after its latest occurrence that has a continuation
        self.index: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in `index`
        self.k = config.max_draft  # the next draft's length at most
        self.misses = 0  # drafts in a row that found nothing or had nothing accepted
        self.pause = config.first_pause  # the next pause's length in steps
        self.resume_step = 0  # no draft before this step

    def propose(self, tokens: SequenceOf[int], limit: int, step: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest
        suffix of `tokens` found (empty if none; that counts as a miss)."""
        at = self._continuation(tokens)
        if at is None:
            self.miss(step)
            return []
        return list(tokens[at : at + limit])

    def may_draft(self, tokens: SequenceOf[int], step: int) -> bool:
        """Whether the next `propose` is worth a step resolved first, judged from the tokens
        known before the newest one arrives: speculation not paused, and the last
        `min_ngram`..`ngram` of them occurred before (with a continuation). A suffix that
        matched then mostly matches with the newest token too: the copy is under way."""
        return self.resume_step <= step and self._continuation(tokens) is not None

    def _continuation(self, tokens: SequenceOf[int]) -> int | None:
        """Where the tokens after the latest earlier occurrence of the longest suffix of
        `tokens` (`ngram` down to `min_ngram` long) start; None if no suffix occurred before."""
        self._extend_index(tokens)
        end = len(tokens)
        cfg = self.config
        for n in range(min(cfg.ngram, end - 1), cfg.min_ngram - 1, -1):
            at = self.index.get(tuple(tokens[end - n :]))
            if at is not None:
                return at
        return None

    def record(self, drafted: int, accepted: int, step: int) -> None:
        """A verify of `drafted` tokens at `step` accepted `accepted`: adapt the next length.
        A draft with nothing accepted is a miss; `miss_limit` in a row pause speculation."""
        cfg = self.config
        floor = max(1, cfg.max_draft // 2)
        if accepted == 0:
            self.k = floor
            self.miss(step)
            return
        self.misses = 0
        self.pause = cfg.first_pause
        grown = 2 * drafted if accepted == drafted else 2 * (accepted + 1)
        self.k = min(cfg.max_draft, max(floor, grown))

    def miss(self, step: int) -> None:
        """A draft at `step` found nothing worth verifying, or had nothing accepted."""
        self.misses += 1
        if self.misses >= self.config.miss_limit:
            self.misses = 0
            self.resume_step = step + 1 + self.pause
            self.pause = min(2 * self.pause, self.config.max_pause)
            self.k = self.config.max_draft

    def _extend_index(self, tokens: SequenceOf[int]) -> None:
        cfg = self.config
        index = self.index
        end = len(tokens) - 1  # the last position with a continuation
        for at in range(max(self.indexed, 1), end + 1):
            for n in range(cfg.min_ngram, min(cfg.ngram, at) + 1):
                index[tuple(tokens[at - n : at])] = at
        self.indexed = max(self.indexed, end + 1)
