"""What the engine keeps while work is in flight: each live request, and each launched step.

A request is live from `Engine.add_request` until its final event. `LiveRequests` holds them
by id and counts those that ask a step for something beyond a greedy token (sampling, log-
probabilities, logit processing, a grammar): the step inputs build those parts only when a
count is not zero, so a batch of plain greedy rows pays nothing for them. Those with a grammar
it also holds apart, so that the per-step checks of their matchers visit only them; and it
holds the prompt scores (prompt_logprobs) that live requests of the same prompt share.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from sv_model import PendingTokens
from sv_scheduler import RequestId, StepPlan
from sv_tokenizer import StreamDecoder

from sv_engine.grammar import GrammarMatcher
from sv_engine.logit_controls import RowControls
from sv_engine.logprobs import OutputLogprobs, PromptLogprobs
from sv_engine.params import SamplingParams


@dataclass
class LiveRequest:
    """Engine-side state of one request in flight."""

    params: SamplingParams
    seed: int
    decoder: StreamDecoder | None  # None: the caller wants no text until the completion
    stop_ids: frozenset[int]
    prompt_ids: list[int]
    start: float
    first_token_at: float | None = None
    logprobs: OutputLogprobs | None = None  # with params.logprobs
    prompt_logprobs: PromptLogprobs | None = None  # with params.prompt_logprobs
    controls: RowControls | None = None  # with params.processes_logits
    hidden_ids: frozenset[int] = frozenset()  # tokens whose text is not shown
    continuation: bool = False  # the text continues the prompt's (Engine.add_request)
    matcher: GrammarMatcher | None = None  # the request's grammar, if it has one

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None or self.prompt_logprobs is not None


class LiveRequests:
    """The live requests by id, and how many of them need each optional part of a step."""

    def __init__(self) -> None:
        self._by_id: dict[RequestId, LiveRequest] = {}
        self.num_sampling = 0  # temperature > 0
        self.num_logprobs = 0  # logprobs or prompt_logprobs
        self.num_controlled = 0  # logit processing
        # Those with a grammar, in the order they came (a subset of _by_id, so a request ends
        # here by the same pop or clear, whatever ends it; a preempted one stays live).
        self._constrained: dict[RequestId, LiveRequest] = {}
        # (prompt ids, K) -> the prompt scores live requests share, and how many hold them
        self._prompt_scores: dict[tuple[tuple[int, ...], int], _SharedScores] = {}

    def add(self, request_id: RequestId, live: LiveRequest) -> None:
        assert request_id not in self._by_id, request_id
        self._by_id[request_id] = live
        if live.matcher is not None:
            self._constrained[request_id] = live
        scores = live.prompt_logprobs
        if scores is not None:
            shared = self._prompt_scores.setdefault(_key(scores), _SharedScores(scores))
            assert shared.scores is scores, "prompt scores not from prompt_scores()"
            shared.holders += 1
        self._count(live, 1)

    def pop(self, request_id: RequestId) -> LiveRequest:
        live = self._by_id.pop(request_id)
        self._constrained.pop(request_id, None)
        if live.prompt_logprobs is not None:
            key = _key(live.prompt_logprobs)
            shared = self._prompt_scores[key]
            shared.holders -= 1
            if not shared.holders:
                del self._prompt_scores[key]
        self._count(live, -1)
        return live

    def clear(self) -> None:
        """Forget every request (an engine whose step failed, once it cancelled what it could)."""
        self._by_id.clear()
        self._constrained.clear()
        self._prompt_scores.clear()
        self.num_sampling = self.num_logprobs = self.num_controlled = 0

    def _count(self, live: LiveRequest, sign: int) -> None:
        self.num_sampling += sign * (not live.params.greedy)
        self.num_logprobs += sign * live.wants_logprobs
        self.num_controlled += sign * (live.controls is not None)

    def prompt_scores(self, prompt_ids: list[int], k: int) -> PromptLogprobs:
        """The prompt scores for a new request of `prompt_ids` with prompt_logprobs `k`: those
        of the live requests of the same prompt and K if there are any (the n choices of a
        prompt, queued one by one), so the prompt is scored once between them; else new ones.
        Shared scores stay shared until the last of their requests ends (`pop`): a request
        that comes after gets new ones, scored afresh.

        Sharing is sound because every request that scores its prompt computes it from
        position 0 (the prefix cache is off for it), and the scores are given out only with
        its first token, after its own prefill: each prompt token has been planned by then,
        by its chunk or by another's in an earlier step or the same one, and steps resolve in
        order, so all of them are in (see PromptLogprobs)."""
        shared = self._prompt_scores.get((tuple(prompt_ids), k))
        return shared.scores if shared is not None else PromptLogprobs(prompt_ids, k, [None])

    @property
    def num_constrained(self) -> int:
        """How many live requests have a grammar."""
        return len(self._constrained)

    @property
    def constrained(self) -> Mapping[RequestId, LiveRequest]:
        """The live requests with a grammar, by id and read-only, in the order they came."""
        return self._constrained

    @property
    def by_id(self) -> Mapping[RequestId, LiveRequest]:
        """The requests by id, read-only: for loops over every row of a step, where a lookup
        through this class would cost a Python call per row."""
        return self._by_id

    def get(self, request_id: RequestId) -> LiveRequest | None:
        return self._by_id.get(request_id)

    def __getitem__(self, request_id: RequestId) -> LiveRequest:
        return self._by_id[request_id]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def __iter__(self) -> Iterator[RequestId]:
        return iter(self._by_id)


@dataclass
class _SharedScores:
    scores: PromptLogprobs
    holders: int = 0  # live requests that have them


def _key(scores: PromptLogprobs) -> tuple[tuple[int, ...], int]:
    return tuple(scores.prompt_ids), scores.k


class LaunchedStep:
    """A step queued on the device: its plan and its sampled ids on their way to the host."""

    def __init__(
        self,
        plan: StepPlan,
        tokens: PendingTokens,
        prompt_targets: Sequence[tuple[PromptLogprobs, Sequence[int]]] = (),
    ) -> None:
        self.plan = plan
        self.tokens = tokens
        # (the scores they go to, prompt ids scored), in row order: to the scores, not to a
        # request, which may have ended by then while others share them
        self.prompt_targets = prompt_targets
        self._rows: dict[int, int] | None = None
        self.grammars_advanced = False  # its tokens have been given to the grammar matchers

    def rows(self) -> dict[int, int]:
        """id(seq) -> the row of its token among this step's sampled ids."""
        if self._rows is None:
            self._rows = {id(s): i for i, s in enumerate(self.plan.sampling)}
        return self._rows

    def row_of(self, seq: object) -> int:
        """The row of `seq`'s token among this step's sampled ids."""
        return self.rows()[id(seq)]
