"""What the engine keeps while work is in flight: each live request, and each launched step.

A request is live from `Engine.add_request` until its final event. `LiveRequests` holds them
by id and counts those that ask a step for something beyond a greedy token (sampling, log-
probabilities, logit processing, a grammar): the step inputs build those parts only when a
count is not zero, so a batch of plain greedy rows pays nothing for them. Those with a grammar
it also holds apart, so that the per-step checks of their matchers visit only them.
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

    def add(self, request_id: RequestId, live: LiveRequest) -> None:
        assert request_id not in self._by_id, request_id
        self._by_id[request_id] = live
        if live.matcher is not None:
            self._constrained[request_id] = live
        self._count(live, 1)

    def pop(self, request_id: RequestId) -> LiveRequest:
        live = self._by_id.pop(request_id)
        self._constrained.pop(request_id, None)
        self._count(live, -1)
        return live

    def clear(self) -> None:
        """Forget every request (an engine whose step failed, once it cancelled what it could)."""
        self._by_id.clear()
        self._constrained.clear()
        self.num_sampling = self.num_logprobs = self.num_controlled = 0

    def _count(self, live: LiveRequest, sign: int) -> None:
        self.num_sampling += sign * (not live.params.greedy)
        self.num_logprobs += sign * live.wants_logprobs
        self.num_controlled += sign * (live.controls is not None)

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


class LaunchedStep:
    """A step queued on the device: its plan and its sampled ids on their way to the host."""

    def __init__(
        self,
        plan: StepPlan,
        tokens: PendingTokens,
        prompt_targets: Sequence[tuple[RequestId, Sequence[int]]] = (),
    ) -> None:
        self.plan = plan
        self.tokens = tokens
        self.prompt_targets = prompt_targets  # (request, prompt ids scored), in row order
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
