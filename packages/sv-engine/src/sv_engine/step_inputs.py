"""A step plan turned into the model runner's inputs (sv_model.StepInputs).

The rows are packed in the scheduler's order: each prefill chunk's tokens, then each decode's
newest token (and, in a step that verifies drafts, its draft after it). A token the step before
sampled may still be on the device when this step is launched (the engine's overlap): it goes
in as a stand-in 0, with a `feed` entry naming the row of that launch's sampled ids that holds
it. Beyond the tokens, a step carries only the parts its live requests ask for (sampling
parameters, log-probabilities, logit controls, grammar masks): `LiveRequests` counts them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from sv_model import LogitControls, SamplingRows, StepInputs, TokenBitmask
from sv_scheduler import StepPlan

from sv_engine import draft_choices
from sv_engine.live import LaunchedStep, LiveRequests
from sv_engine.logit_controls import step_controls
from sv_engine.logprobs import PromptLogprobs


def step_inputs(
    plan: StepPlan,
    previous: LaunchedStep | None,
    live: LiveRequests,
    vocab_size: int,
    prompt_targets: Sequence[tuple[PromptLogprobs, int, int, list[int]]] = (),
    token_bitmask: Callable[[], TokenBitmask | None] | None = None,
) -> StepInputs:
    """The inputs of `plan`. `previous`: the step still on the device, whose sampled ids this
    one may feed. `prompt_targets`: (scores, prefill row, offset in its chunk, prompt ids)
    of each chunk that scores prompt tokens. `token_bitmask`: what the runner calls for the
    grammar masks once the forward is queued (None: no constrained row)."""
    token_ids: list[int] = []
    positions: list[int] = []
    table_rows: list[int] = []
    query_lens: list[int] = []
    seq_lens: list[int] = []
    sample_rows: list[int] = []
    feed: list[tuple[int, int]] = []  # tokens still on the device (see StepInputs.feed)
    for row, chunk in enumerate(plan.prefills):
        seq = chunk.seq
        token_ids.extend(seq.token_ids[chunk.start : chunk.end])
        if chunk.end > len(seq.token_ids):  # a preempted sequence resuming, its token pending
            assert previous is not None
            feed.append((len(token_ids), previous.row_of(seq)))
            token_ids.append(0)  # a stand-in: the device writes the sampled id here
        positions.extend(range(chunk.start, chunk.end))
        table_rows.append(seq.table_row)
        query_lens.append(chunk.end - chunk.start)
        seq_lens.append(chunk.end)
        if chunk.samples:
            sample_rows.append(row)
    first = len(plan.prefills)
    # What the sequences' rows ask of this step beyond their tokens (a verify step's draft
    # positions ask it of the choices they make too: draft_choices).
    logprobs = live.num_logprobs > 0 and any(
        live.by_id[s.request_id].logprobs is not None for s in plan.sampling
    )
    logits_at = None
    if plan.num_draft_tokens:
        logits_at = _add_verify_rows(
            plan, token_ids, positions, table_rows, query_lens, seq_lens, sample_rows
        )
    else:
        _add_decode_rows(
            plan, previous, token_ids, positions, table_rows, query_lens, seq_lens, feed
        )
        sample_rows.extend(range(first, first + len(plan.decodes)))
    return StepInputs(
        token_ids=token_ids,
        positions=positions,
        table_rows=table_rows,
        query_lens=query_lens,
        seq_lens=seq_lens,
        sample_rows=sample_rows,
        sampling=_sampling_rows(plan, live, vocab_size) if live.num_sampling else None,
        feed=feed,
        logprobs=logprobs,
        prompt_logprobs=[(row, offset, t) for _, row, offset, t in prompt_targets],
        controls=_controls(plan, previous, live) if live.num_controlled else None,
        token_bitmask=token_bitmask,
        logits_at=logits_at,
        drafts=[(c.head, c.draft) for c in draft_choices.drafting(plan).values()],
    )


def _add_decode_rows(
    plan: StepPlan,
    previous: LaunchedStep | None,
    token_ids: list[int],
    positions: list[int],
    table_rows: list[int],
    query_lens: list[int],
    seq_lens: list[int],
    feed: list[tuple[int, int]],
) -> None:
    """The decodes of a step without drafts, added after its prefill chunks: each feeds its
    newest token. This runs for every running sequence in every step, so each list is one
    comprehension rather than a loop of appends (about half the host time at batch 256)."""
    decodes = plan.decodes
    first = len(token_ids)
    lengths = [len(seq.token_ids) + seq.num_pending for seq in decodes]  # num_tokens
    pending = [seq.num_pending for seq in decodes]
    if previous is None:
        assert not any(pending)  # nothing is on the device
    elif all(pending) and decodes == previous.plan.decodes:
        # The decoders of the step before, in its order (most steps): their tokens are that
        # launch's sampled ids after its prefill chunks' own.
        n, after = len(decodes), previous.plan.num_prefill_samples
        feed += zip(range(first, first + n), range(after, after + n), strict=True)
    else:
        rows = previous.rows()
        feed += [(first + i, rows[id(seq)]) for i, seq in enumerate(decodes) if seq.num_pending]
    token_ids += [0 if seq.num_pending else seq.token_ids[-1] for seq in decodes]
    positions += [n - 1 for n in lengths]
    table_rows += [seq.table_row for seq in decodes]
    query_lens += itertools.repeat(1, len(decodes))
    seq_lens += lengths


def _add_verify_rows(
    plan: StepPlan,
    token_ids: list[int],
    positions: list[int],
    table_rows: list[int],
    query_lens: list[int],
    seq_lens: list[int],
    sample_rows: list[int],
) -> list[int]:
    """The decodes of a step that verifies drafts, added after its prefill chunks: each
    decode feeds its newest token and its draft. Returns where choices are made (the packed
    rows of `StepInputs.logits_at`): at each sampling prefill's last token, at each decode's
    newest token, and then at every draft position, in that order (the scheduler's order of
    sampled tokens). Every token is known: no `feed`."""
    ends = list(itertools.accumulate(query_lens))
    logits_at = [ends[row] - 1 for row in sample_rows]  # the sampling prefill chunks
    drafts_at: list[int] = []
    row = len(plan.prefills)
    for seq in plan.decodes:
        n = seq.num_tokens
        draft = seq.draft
        logits_at.append(len(token_ids))
        token_ids.append(seq.token_ids[-1])
        token_ids.extend(draft)
        drafts_at.extend(range(len(token_ids) - len(draft), len(token_ids)))
        positions.extend(range(n - 1, n + len(draft)))
        table_rows.append(seq.table_row)
        query_lens.append(1 + len(draft))
        seq_lens.append(n + len(draft))
        sample_rows.append(row)
        row += 1
    return logits_at + drafts_at


def _sampling_rows(plan: StepPlan, live: LiveRequests, vocab_size: int) -> SamplingRows:
    """Each choice's sampling parameters, in the scheduler's order of sampled tokens. A
    choice's step is the output index of the token it makes (a draft position's too), so its
    noise is the one plain decoding draws for that token."""
    temps, top_ks, top_ps, seeds, steps = [], [], [], [], []
    requests = live.by_id
    for seq, offset in draft_choices.choices(plan):
        request = requests[seq.request_id]
        temps.append(request.params.temperature)
        # More than the vocabulary keeps every token, as 0 does; clamped so that any Python
        # int is a valid top_k (the step inputs are int32 on the device).
        top_ks.append(min(request.params.top_k, vocab_size))
        top_ps.append(request.params.top_p)
        seeds.append(request.seed)
        steps.append(seq.num_output_tokens + offset)
    return SamplingRows(temps, top_ks, top_ps, seeds, steps)


def _controls(
    plan: StepPlan, previous: LaunchedStep | None, live: LiveRequests
) -> LogitControls | None:
    def pending_row(seq: object) -> int:
        assert previous is not None
        return previous.row_of(seq)

    requests = live.by_id
    rows = [(seq, requests[seq.request_id].controls, i) for seq, i in draft_choices.choices(plan)]
    return step_controls(rows, pending_row)
