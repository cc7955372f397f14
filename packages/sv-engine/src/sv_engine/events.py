"""A resolved step's tokens turned into the events the engine returns (sv_engine.params).

Each live request gets one `StreamEvent` per token the step kept for it (a verified draft's
accepted run, then its last token), with its text when the caller streams text, its
log-probabilities when asked, and, when it finished, its `Completion`; a finished request
leaves the live requests here.
"""

from __future__ import annotations

import time

from sv_model import Logprobs
from sv_scheduler import FinishedRequest, RequestId, StepPlan
from sv_tokenizer import Tokenizer

from sv_engine.draft_choices import DraftChoices
from sv_engine.live import LiveRequest, LiveRequests
from sv_engine.params import Completion, StreamEvent


def token_events(
    plan: StepPlan,
    tokens: list[int],
    rows: Logprobs | None,
    finished: dict[RequestId, FinishedRequest],
    runs: dict[int, tuple[int, DraftChoices]],
    live: LiveRequests,
    tokenizer: Tokenizer,
) -> list[StreamEvent]:
    """The events of a resolved step: one per sampled token of a live request, in the order
    of `plan.sampling` (a verified draft's accepted run before its last token). `runs`:
    id(seq) -> (its length before the step, its draft's choices), for each verified draft.

    This runs for every token of every step (256 a step at batch 256), so the common token
    (no text, no log-probabilities, not finished, no draft) costs a few attribute tests and
    its event: each rarer case is tested once, then handled in its own call."""
    events: list[StreamEvent] = []
    now = time.perf_counter()
    live_of = live.by_id.get
    for row, (seq, token) in enumerate(zip(plan.sampling, tokens, strict=False)):
        request_id = seq.request_id
        request = live_of(request_id)
        if request is None:  # cancelled, or stopped a step earlier: this token is dropped
            continue
        first = request.first_token_at is None
        if first:
            request.first_token_at = now
        if runs and id(seq) in runs:  # a verified draft: its accepted run comes first
            start, choice = runs[id(seq)]
            kept = seq.token_ids[start:]
            token, row = _accepted_run(request_id, request, kept, choice, rows, events)
        text = "" if request.decoder is None else _text(request, token)
        logprob = None
        if rows is not None and request.logprobs is not None:
            logprob = request.logprobs.add(token, rows, row)  # before the completion reads them
        done = finished.get(request_id) if finished else None
        event = (
            StreamEvent(request_id, token, text)
            if done is None
            else finish_event(done, token, text, live, tokenizer)
        )
        if logprob is not None:
            event.logprob = logprob
        if first and request.prompt_logprobs is not None:
            # (a copy: live requests of one prompt share the scores, LiveRequests.prompt_scores)
            event.prompt_logprobs = list(request.prompt_logprobs.scored)
        events.append(event)
    return events


def _accepted_run(
    request_id: RequestId,
    request: LiveRequest,
    kept: list[int],
    choice: DraftChoices,
    rows: Logprobs | None,
    events: list[StreamEvent],
) -> tuple[int, int]:
    """Events for a verified draft's `kept` tokens (its first choice, then the accepted run)
    but the last; returns (the last kept token, the row of its choice)."""
    matcher = request.matcher
    for i, accepted in enumerate(kept[:-1]):
        # Given to the matcher one by one, each before its text: a token the constraint
        # refuses later in the run hides its own text, not that of those it had accepted.
        # (Choice 0 was given to it with the step's other tokens.)
        if matcher is not None and i:
            matcher.accept(accepted)
        event = StreamEvent(request_id, accepted, _text(request, accepted))
        if rows is not None and request.logprobs is not None:
            event.logprob = request.logprobs.add(accepted, rows, choice.row(i))
        events.append(event)
    if matcher is not None and len(kept) > 1:
        matcher.accept(kept[-1])
    return kept[-1], choice.row(len(kept) - 1)


def _text(request: LiveRequest, token: int) -> str:
    decoder = request.decoder
    if decoder is None or token in request.hidden_ids:
        return ""
    if request.matcher is not None and request.matcher.error is not None:
        return ""  # the token its constraint refused (the request ends on it) is not its text
    return decoder.push(token)


def finish_event(
    done: FinishedRequest,
    token: int | None,
    text: str,
    live: LiveRequests,
    tokenizer: Tokenizer,
) -> StreamEvent:
    """The final event of a finished request (`token`: its last, None for a cancel), which
    leaves `live`: the streamed text's tail and the whole completion."""
    request = live.pop(done.request_id)
    if request.decoder is not None:
        text += request.decoder.flush()
    reason, error = done.finish_reason, None
    if (
        request.matcher is not None
        and request.matcher.error is not None
        and reason in ("stop", "error", "length")
    ):
        # (a failed matcher's mask allows only the stop tokens: that is how it ended, unless
        # the engine ended it first, at the token the constraint refused, or the length limit
        # fell on that token: the engine ends a failed request at once, so the refused token
        # is the last either way)
        reason, error = "error", f"the output constraint failed: {request.matcher.error}"
    output = list(done.output_ids)
    # (the token that stopped it, or that its constraint refused, is not its text)
    visible = output[:-1] if reason in ("stop", "error") and output else output
    now = time.perf_counter()
    completion = Completion(
        request_id=done.request_id,
        prompt_ids=list(done.prompt_ids),
        output_ids=output,
        text=tokenizer.decode(
            (t for t in visible if t not in request.hidden_ids),
            continuation=request.continuation,
        ),
        finish_reason=reason,
        num_cached_tokens=done.num_cached_tokens,
        time_to_first_token_s=(
            None if request.first_token_at is None else request.first_token_at - request.start
        ),
        latency_s=now - request.start,
        logprobs=None if request.logprobs is None else request.logprobs.truncate(len(output)),
        # (a copy: the scores may be shared, and still coming in for a request cancelled
        # mid-prefill while others of its prompt go on)
        prompt_logprobs=(
            None if request.prompt_logprobs is None else list(request.prompt_logprobs.scored)
        ),
        error=error,
    )
    return StreamEvent(done.request_id, token, text, reason, completion)
