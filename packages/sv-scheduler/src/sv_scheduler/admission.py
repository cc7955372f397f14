"""Admission: how many pages ("credits") a request may ever need, and the two policies that
decide when a request may start and where its pages come from.

A request writes KV for every prompt token and for every output token except the last one (the
last sampled token is returned, never fed back). With the output budget clamped to the context
limit,

    max_new' = min(max_new_tokens, max_model_len - prompt_tokens)
    credits  = ceil((prompt_tokens + max_new' - 1) / page_size)

The conservative policy reserves all of them at admission, so a running request can never run out
of pages: no preemption, no deadlock. Physical pages are still assigned lazily as it grows. The
preemptive policy reserves nothing and preempts when pages run out. Under both, a request whose
credits exceed the whole pool is rejected at arrival: it could never finish.

Under a sliding window of W positions a sequence gives back every page the window has passed
(Scheduler.advance, and at admission for a cached prefix), so what it holds at once is bounded
however long it runs, and the conservative policy reserves only that (`window_credits_for`).
At a schedule() call the pages a sequence holds are those of the positions from the window's
start, as of the last release, to the end of the positions planned now:

- a prefill chunk of L tokens starting at c: the release was at c, so positions c-W+1 .. c+L-1;
- a decode at position q: q-W+1 .. q (a chunk of 1);
- a decode verifying a draft of d tokens, its previous step having accepted a drafts (released
  before the accepted count was known): q-a-W+1 .. q+d, a and d at most max_draft.

That is at most W-1+L consecutive positions, L = the longest "chunk": min(prompt, max_step_tokens)
for a prefill (conservative admission never recomputes an output), 1 + 2*max_draft for a decode.
n consecutive positions touch at most ceil((n-1) / page_size) + 1 pages, and a request never
holds more than the credits above, so

    credits = min(ceil((prompt_tokens + max_new' - 1) / page_size),
                  ceil((W - 2 + L) / page_size) + 1)

The preemptive policy keeps the first formula for its check at arrival: it gives a prompt (and,
resuming, its output so far) all its pages at admission, before the window releases any.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from sv_kvcache import PagePool, PrefixMatch

from .config import Admission, SchedulerConfig
from .errors import AdmissionError
from .request import Request
from .sequence import Sequence, SequenceStatus


def clamp_max_new_tokens(prompt_tokens: int, max_new_tokens: int, max_model_len: int) -> int:
    """The output budget after the context limit: min(max_new_tokens, max_model_len - prompt)."""
    return min(max_new_tokens, max_model_len - prompt_tokens)


def credits_for(prompt_tokens: int, max_new_tokens: int, page_size: int) -> int:
    """Pages a request may ever write: ceil((prompt + max_new - 1) / page_size)."""
    return -(-(prompt_tokens + max_new_tokens - 1) // page_size)


def window_credits_for(prompt_tokens: int, config: SchedulerConfig) -> int | None:
    """The most pages a request holds at once under the config's sliding window and
    conservative admission (see the module doc), whatever its max_new; None without one."""
    window = config.sliding_window
    if window is None or config.admission != "conservative":
        return None
    longest_decode = 1 + 2 * (config.speculation.max_draft if config.speculation else 0)
    longest_chunk = max(min(prompt_tokens, config.max_step_tokens), longest_decode)
    return -(-(window - 2 + longest_chunk) // config.page_size) + 1


def max_new_tokens_that_fit(prompt_tokens: int, config: SchedulerConfig) -> int:
    """The most output tokens a request with this prompt may ask for: within the context limit,
    and with credits that fit the pool (prompt + max_new - 1 <= num_pages * page_size, or the
    window's bound, which does not grow with max_new). Below 1 when nothing fits. For callers
    that choose a default, such as a server whose client gave no max_tokens."""
    room = config.max_model_len - prompt_tokens
    held_at_once = window_credits_for(prompt_tokens, config)
    if held_at_once is not None and held_at_once <= config.num_pages:
        return room
    in_pool = config.num_pages * config.page_size + 1 - prompt_tokens
    return min(room, in_pool)


def check_request(request: Request, config: SchedulerConfig) -> tuple[int, int]:
    """Validate `request` against `config`; returns (max_new', credits) or raises AdmissionError."""
    rid = request.request_id
    prompt = request.prompt_ids
    if len(prompt) == 0:
        raise AdmissionError(f"request {rid!r} rejected: the prompt is empty")
    for i, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise AdmissionError(
                f"request {rid!r} rejected: prompt_ids[{i}] is {token!r}, not a token id (int >= 0)"
            )
    max_new = request.max_new_tokens
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise AdmissionError(
            f"request {rid!r} rejected: max_new_tokens must be an integer >= 1, got {max_new!r}"
        )
    if not isinstance(request.stop_ids, frozenset) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in request.stop_ids
    ):
        raise AdmissionError(f"request {rid!r} rejected: stop_ids must be a frozenset of ints")
    prompt_len = len(prompt)
    if prompt_len >= config.max_model_len:
        raise AdmissionError(
            f"request {rid!r} rejected: the prompt has {prompt_len} tokens but max_model_len is "
            f"{config.max_model_len}, leaving no room for an output token"
        )
    clamped = clamp_max_new_tokens(prompt_len, max_new, config.max_model_len)
    credits = credits_for(prompt_len, clamped, config.page_size)
    held_at_once = window_credits_for(prompt_len, config)
    if held_at_once is not None and held_at_once < credits:
        credits = held_at_once
        if credits > config.num_pages:
            raise AdmissionError(
                f"request {rid!r} rejected: it needs {credits} pages at once (the sliding "
                f"window of {config.sliding_window} positions plus a prefill chunk of up to "
                f"{min(prompt_len, config.max_step_tokens)} tokens, {config.page_size} per page) "
                f"but the KV-cache pool has only {_pages(config.num_pages)}; give the KV cache "
                f"more memory or lower the step's token budget"
            )
    elif credits > config.num_pages:
        budget = f"max_new_tokens {clamped}"
        if clamped < max_new:  # the number asked for is the one the reader looks for
            budget += f" (clamped from {max_new} by max_model_len {config.max_model_len})"
        raise AdmissionError(
            f"request {rid!r} rejected: it needs {credits} pages (prompt {prompt_len} + "
            f"{budget} - 1 = {prompt_len + clamped - 1} tokens, "
            f"{config.page_size} per page) but the KV-cache pool has only "
            f"{_pages(config.num_pages)}; "
            f"shorten the prompt or max_new_tokens, or give the KV cache more memory"
        )
    return clamped, credits


def _pages(n: int) -> str:
    return f"{n} page" if n == 1 else f"{n} pages"


# -- the two policies ----------------------------------------------------------------------------


class AdmissionPolicy(ABC):
    """How running sequences share the pool's pages: when the head of the queue may start, and
    where a growing sequence's next page comes from. The scheduler holds one and asks it."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool

    @abstractmethod
    def fits(self, seq: Sequence, match: PrefixMatch, num_running: int) -> bool:
        """Whether `seq`, the head of the queue, may start now on `match`'s cached pages."""

    @abstractmethod
    def admit(self, seq: Sequence) -> None:
        """`seq` starts running; its block table already holds the cached prefix."""

    @abstractmethod
    def release(self, seq: Sequence) -> None:
        """`seq` stopped running (finished, cancelled or preempted); its pages are back."""

    @abstractmethod
    def grow(self, seqs: list[Sequence], make_room: Callable[[Sequence], bool]) -> list[Sequence]:
        """Give each running sequence of `seqs` one more page; returns those that got it.
        `make_room(seq)` frees pages by preempting newer sequences and says whether `seq` is
        still running (a policy that can run out of pages calls it; one that cannot never does)."""

    @abstractmethod
    def can_draft(self, num_pages: int) -> bool:
        """Whether a running sequence may take `num_pages` more pages for draft positions
        (speculation) now, without preempting anyone."""

    @property
    def free_credits(self) -> int:
        """Pages not promised to a running sequence (all of them, if the policy promises none)."""
        return self.pool.num_pages


class ConservativeAdmission(AdmissionPolicy):
    """The reference design's policy: admission reserves a request's whole budget, its credits
    (see `credits_for`; under a sliding window, `window_credits_for`), out of a counter
    separate from the physical pages. The credits of running requests never exceed the pool,
    so every page a running request will ever ask for exists: no preemption, no deadlock. The price: a request that may run long (no max_tokens)
    holds its whole budget from the start, and requests behind it wait."""

    def __init__(self, pool: PagePool) -> None:
        super().__init__(pool)
        self._free_credits = pool.num_pages

    def fits(self, seq: Sequence, match: PrefixMatch, num_running: int) -> bool:
        # Shared prefix pages still count fully: the sum of credits bounds the sum of pages
        # held, counting a shared page once per holder, which bounds the distinct pages in use.
        return seq.credits <= self._free_credits

    def admit(self, seq: Sequence) -> None:
        self._free_credits -= seq.credits

    def release(self, seq: Sequence) -> None:
        self._free_credits += seq.credits

    def grow(self, seqs: list[Sequence], make_room: Callable[[Sequence], bool]) -> list[Sequence]:
        # The credits guarantee these pages exist: take them in one call.
        for seq, page in zip(seqs, self.pool.allocate_many(len(seqs)), strict=True):
            seq.table.pages.append(page)
        return seqs

    def can_draft(self, num_pages: int) -> bool:
        # Draft positions stay below finish_len - 1, inside the request's credits (see
        # Scheduler._draft): the pages exist.
        return True

    @property
    def free_credits(self) -> int:
        return self._free_credits


class PreemptiveAdmission(AdmissionPolicy):
    """vLLM's policy: admit when the pages of the request's tokens so far fit, keeping a small
    watermark free for running sequences to grow into; assign pages as sequences grow; when
    none is left, preempt the most recently admitted running sequence (the scheduler requeues
    it at the head of the queue, and it recomputes its prompt and output so far on resuming,
    from the prefix cache where its pages survive).

    Progress: the oldest running sequence is preempted only when it is the only one left, and
    then every page is available to it; `check_request` rejects at arrival a request whose whole
    budget does not fit the pool alone. So the oldest always finishes, and FIFO admission with
    preempted sequences at the head means no request starves."""

    # vLLM keeps 1% of the pool free at admission; a smaller pool keeps none.
    WATERMARK_FRACTION = 0.01

    def __init__(self, pool: PagePool) -> None:
        super().__init__(pool)
        self.watermark = int(pool.num_pages * self.WATERMARK_FRACTION)

    def fits(self, seq: Sequence, match: PrefixMatch, num_running: int) -> bool:
        fresh = -(-seq.num_tokens // self.pool.page_size) - len(match.pages)
        room = self.pool.num_available - match.num_revived - fresh
        # The watermark is for running sequences: with none, a request that fits runs.
        return room >= (self.watermark if num_running else 0)

    def admit(self, seq: Sequence) -> None:
        # Pages for every token it has now, so its prefill chunks never need to preempt.
        seq.table.ensure_capacity(seq.num_tokens)

    def release(self, seq: Sequence) -> None:
        pass  # nothing reserved: the pages went back with the block table

    def grow(self, seqs: list[Sequence], make_room: Callable[[Sequence], bool]) -> list[Sequence]:
        grown = []
        for seq in seqs:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted just now, to make room for an older one
            if self.pool.num_available == 0 and not make_room(seq):
                continue
            seq.table.append_page()
            grown.append(seq)
        return grown

    def can_draft(self, num_pages: int) -> bool:
        # Not below the watermark: that is for running sequences' real tokens.
        return self.pool.num_available - num_pages >= self.watermark


def make_admission_policy(name: Admission, pool: PagePool) -> AdmissionPolicy:
    """The policy `SchedulerConfig.admission` names."""
    return ConservativeAdmission(pool) if name == "conservative" else PreemptiveAdmission(pool)
