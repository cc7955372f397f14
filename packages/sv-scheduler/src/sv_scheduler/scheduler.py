"""The scheduler: a FIFO queue, page-budget admission, and one plan per model step.

The engine drives it in a loop:

    while sched.has_unfinished():
        plan = sched.schedule()                       # what to compute this step
        tokens = run_model_and_sample(plan)           # one token per plan.sampling entry
        finished = sched.complete_step(plan, tokens)  # record them; finished requests leave

`complete_step` is two halves that may be called apart: `advance(plan)` counts the step's
tokens before their values are known (each sampling sequence gets a pending token, counted in
`Sequence.num_pending`; lengths, pages and length limits move on), and `resolve(plan, tokens)`
appends the values and applies stop tokens. Between the two the next step can be scheduled,
which is how the engine keeps the GPU busy while the host catches up (see sv_engine): one
step's tokens are still on the device while the next step is planned and launched. A sequence that turns out to have
stopped was then planned into that next step too; its token there is dropped, and the KV the
GPU writes for it lands in pages it has already given back, before any later step (which runs
after it on the same stream) can reuse them. At most one step is advanced and unresolved.

Admission is FIFO: the head of the queue waits until its admission policy (admission.py) lets
it start, and nobody skips ahead. `conservative` (the default) reserves each request's credits,
ceil((prompt + max_new' - 1) / page_size) pages, up front: no preemption, no deadlock.
`preemptive` admits on the pages of the prompt and, when a growing sequence finds no free page,
preempts the most recently admitted running sequences: each goes back to the head of the queue
and recomputes its prompt and output so far when it resumes. Physical pages are assigned lazily
under both.

With prefix caching, a request may start on pages another request computed. Cached pages nobody
holds are evictable, so they count as available. A request whose next full page is being computed
by a prompt admitted before it (two prompts with one system prompt arriving together) waits for
that chunk to finish, then starts on the cached page instead of computing it a second time.

Each step feeds decodes first (one token each; max_step_tokens >= max_num_seqs, so all of them
always fit and a long prompt never stalls running decodes), then prefill chunks of the prompts
already admitted, then newly admitted prompts, until the step's token budget is spent.

With speculation (`SchedulerConfig.speculation`, speculation.py) a decoder advances by 1 +
accepted tokens: a decoder whose tokens are all known may feed a draft after its newest token,
taken from the budget before the prefill chunks, and `resolve` keeps the accepted run (the
next due step, pages and limits follow from it). Its draft positions get pages at schedule();
rejected positions' pages go back at resolve(). The accepted count is known only then, so a
step with drafts must be resolved before the next schedule(): such a step is never overlapped
with the next (the engine resolves first; see `would_draft`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf

from sv_kvcache import NO_MATCH, PagePool, PrefixMatch, page_key

from .admission import check_request, make_admission_policy
from .config import SchedulerConfig
from .errors import AdmissionError, SchedulerError
from .plan import PrefillChunk, StepPlan, WaitReason
from .request import FinishedRequest, FinishReason, Request, RequestId
from .sequence import Sequence, SequenceStatus
from .speculation import DraftState
from .stats import SchedulerStats

_WAITING = SequenceStatus.WAITING
_RUNNING = SequenceStatus.RUNNING
_FINISHED = SequenceStatus.FINISHED


class Scheduler:
    """Decides, step by step, which tokens of which requests the model computes."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.pool = PagePool(config.num_pages, config.page_size)
        self._continuous = config.policy == "continuous"
        self._policy = make_admission_policy(config.admission, self.pool)
        self._prefix_caching = config.prefix_caching
        self._sliding_window = config.sliding_window
        self._speculation = config.speculation
        # No decoder may draft before this step (the earliest resume step; may be early, never late)
        self._next_draft_step = 0
        # (sequence, its proposed draft) -> how many of its tokens to verify; None: all. The
        # engine's grammar check: a token the grammar rejects would never be chosen.
        self.draft_limit: Callable[[Sequence, list[int]], int] | None = None
        # what a head that does not fit waits for, as the trace names it
        self._no_room: WaitReason = "credits" if config.admission == "conservative" else "pages"

        self._waiting: deque[Sequence] = deque()  # FIFO; preempted sequences go back in front
        self._unfinished: dict[RequestId, Sequence] = {}  # waiting or running, by id
        self._running: dict[RequestId, Sequence] = {}  # admission order: the newest is last
        self._prefilling: list[Sequence] = []  # running, prompt not fully computed; admission order
        self._decoding: list[Sequence] = []  # running, generating; the order of plan.decodes
        self._needs_page: list[Sequence] = []  # decoders whose next token starts a new page
        # step -> decoders to look at after that step (see _file_due)
        self._due: dict[int, list[Sequence]] = {}
        # prefix-cache key of the first page a prefilling sequence computes itself -> that
        # sequence, while it prefills (see _next_page_in_progress)
        self._computing: dict[int, Sequence] = {}
        # every stop id of every request: one set test tells the step loop whether to look closer
        self._stop_ids: set[int] = set()
        self._drop_token: list[Sequence] = []  # decoders that left while a plan was out
        # finished (by length at advance(), or stopped) and not yet reported by resolve()
        self._finishing: list[tuple[Sequence, FinishReason]] = []
        self._free_table_rows = list(
            range(config.max_num_seqs)
        )  # a heap: lowest free table row first
        self._plan: StepPlan | None = None  # the plan handed out and not yet advanced
        self._unresolved: StepPlan | None = None  # advanced, its sampled tokens not yet known
        self._step = 0
        self._admissions = 0

        self._peak_running = 0
        self._largest_decode_batch = 0
        self._peak_assigned_pages = 0
        self._admission_waits = 0
        self._waited_requests = 0
        self._prefix_cache_hit_tokens = 0
        self._preemptions = 0
        self._recomputed_tokens = 0
        self._finished_requests = 0
        self._cancelled_requests = 0
        self._drafted_tokens = 0
        self._accepted_tokens = 0
        self._verifications = 0

    # -- requests in --------------------------------------------------------------------------

    def add(self, request: Request) -> Sequence:
        """Queue `request` (FIFO). Raises AdmissionError if it could never run."""
        max_new, credits = check_request(request, self.config)
        if request.request_id in self._unfinished:
            raise AdmissionError(
                f"request {request.request_id!r} rejected: a request with this id is still "
                f"{self._unfinished[request.request_id].status.value}"
            )
        if self._unreported(request.request_id) is not None:
            # (resolve() and cancel() would mix the two up)
            raise AdmissionError(
                f"request {request.request_id!r} rejected: a request with this id has "
                "finished but its finish is not reported yet"
            )
        seq = Sequence(request, max_new_tokens=max_new, credits=credits, pool=self.pool)
        self._stop_ids.update(seq.stop_ids)
        self._waiting.append(seq)
        self._unfinished[seq.request_id] = seq
        return seq

    def clear_prefix_cache(self) -> int:
        """Drop every cached prefix page no request holds (e.g. between benchmark runs, so one
        run's prompts do not serve the next); returns how many pages were freed."""
        return self.pool.clear_cache()

    def cancel(self, request_id: RequestId) -> Sequence | None:
        """Drop a waiting or running request now, returning its pages, credits and table row.

        Returns the cancelled sequence, or None if no unfinished request has this id. Safe
        while a plan is out: the token `complete_step` then receives for this request is
        dropped. A token still pending (its step advanced, not resolved) is dropped too: the
        request ends with the tokens resolved. That holds for a request that reached its
        length limit in the step advanced and not yet resolved: its finish is not reported
        yet (its last token is unknown), so it is cancelled instead, and `resolve` leaves it
        out.
        """
        seq = self._unfinished.pop(request_id, None)
        if seq is None:
            return self._cancel_unreported(request_id)
        if seq.status is _WAITING:
            self._waiting.remove(seq)
        else:
            if self._plan is not None and seq.decoding:
                self._drop_token.append(seq)  # advance() will give it a token: drop that
            self._stop_running(seq)
        seq.num_pending = 0
        seq.status = _FINISHED
        seq.finish_reason = "cancelled"
        self._cancelled_requests += 1
        return seq

    def _cancel_unreported(self, request_id: RequestId) -> Sequence | None:
        """Cancel a request that finished in the advanced step, before `resolve` reports it
        (its pages and credits are already back)."""
        index = self._unreported(request_id)
        if index is None:
            return None
        seq, _ = self._finishing.pop(index)
        self._count_as_cancelled(seq)
        return seq

    def _unreported(self, request_id: RequestId) -> int | None:
        """Where request `request_id` is among the finishes `resolve` has yet to report."""
        return next(
            (i for i, (seq, _) in enumerate(self._finishing) if seq.request_id == request_id),
            None,
        )

    def _count_as_cancelled(self, seq: Sequence) -> None:
        """`seq`, finished and unreported, ends as cancelled: its pending token is dropped."""
        seq.num_pending = 0
        seq.finish_reason = "cancelled"
        self._finished_requests -= 1
        self._cancelled_requests += 1

    def has_unfinished(self) -> bool:
        return bool(self._unfinished)

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan the next step: assign pages, admit from the queue, split the token budget."""
        if self._plan is not None:
            raise SchedulerError(
                f"schedule() called again before advance() or complete_step() for step "
                f"{self._plan.step}"
            )
        if self._unresolved is not None and self._unresolved.num_draft_tokens:
            raise SchedulerError(
                f"schedule() while step {self._unresolved.step}, which verifies drafts, is "
                f"unresolved: its accepted tokens decide the next plan; call resolve() first"
            )
        step = self._step
        changed: list[Sequence] = []
        preempted: list[Sequence] = []

        # 1. Decoders whose next token starts a new page get it (1 step in page_size per sequence).
        if self._needs_page:
            self._assign_decode_pages(step, changed, preempted)

        # 2. Every running decode, one token each, and drafts where speculation is on.
        decodes = self._decoding.copy()
        budget = self.config.max_step_tokens - len(decodes)
        num_draft_tokens = 0
        if self._drafts_allowed() and self._unresolved is None:
            num_draft_tokens = self._draft(decodes, budget, step, changed)
            budget -= num_draft_tokens

        # 3. Prompts already admitted continue, oldest first, as far as the budget goes.
        prefills: list[PrefillChunk] = []
        for seq in self._prefilling:
            if budget == 0:
                break
            budget -= self._add_chunk(seq, budget, prefills, step, changed)

        # 4. Admission, FIFO. Static: a new group only once the previous one has finished.
        head_wait = None
        if self._waiting:
            if self._continuous or not self._running:
                head_wait = self._admit(budget, prefills, step, changed)
            else:
                head_wait = self._count_wait(self._waiting[0], "static_group")

        if preempted:  # a sequence given a page, then preempted for an older one
            changed = [seq for seq in changed if seq.status is _RUNNING]

        sampling = [chunk.seq for chunk in prefills if chunk.samples]
        num_prefill_samples = len(sampling)
        sampling += decodes

        if len(self._running) > self._peak_running:
            self._peak_running = len(self._running)
        if len(decodes) > self._largest_decode_batch:
            self._largest_decode_batch = len(decodes)
        if self.pool.num_assigned > self._peak_assigned_pages:
            self._peak_assigned_pages = self.pool.num_assigned

        plan = StepPlan(
            step=step,
            prefills=prefills,
            decodes=decodes,
            sampling=sampling,
            num_prefill_samples=num_prefill_samples,
            block_table_changed=changed,
            preempted=preempted,
            num_draft_tokens=num_draft_tokens,
            head_wait=head_wait,
        )
        if not plan.is_empty:  # an empty plan computes nothing: nothing to advance or resolve
            self._plan = plan
        return plan

    def complete_step(
        self, plan: StepPlan, sampled_tokens: SequenceOf[int]
    ) -> list[FinishedRequest]:
        """Record a finished step: KV written for every planned position, and one sampled token
        for each `plan.sampling` entry, in that order (a list of ints: the engine's `.tolist()`).
        Returns the requests that finished; their pages and credits are already back.
        The same as `advance(plan)` then `resolve(plan, sampled_tokens)`."""
        self._check_token_count("complete_step", plan, sampled_tokens)
        self.advance(plan)
        return self.resolve(plan, sampled_tokens)

    def advance(self, plan: StepPlan) -> None:
        """The step of `plan` is under way: count its tokens before their values are known.

        Prompt chunks count as computed; each sequence in `plan.sampling` gets a pending token
        (`num_pending` 1), whose value `resolve` appends; length limits and page needs are
        applied (a sequence that reached its limit gives its pages back now, and is reported by
        `resolve`). The next `schedule()` may be called before `resolve`. An empty plan
        (nothing to run) needs neither call; both accept it and do nothing."""
        if plan.is_empty:
            return
        if plan is not self._plan:
            raise SchedulerError(
                f"advance() got step {plan.step}, which is not the plan that schedule() "
                f"handed out last"
            )
        if self._unresolved is not None:
            raise SchedulerError(
                f"advance() for step {plan.step} while step {self._unresolved.step} is "
                f"unresolved: call resolve() first"
            )
        self._plan = None
        self._unresolved = plan
        self._step += 1

        # Prefill chunks: their KV is written now, so their full pages may enter the prefix cache.
        for chunk in plan.prefills:
            seq = chunk.seq
            if seq.status is not _RUNNING:  # stopped or cancelled while the plan was out
                continue
            seq.prefilled_tokens = chunk.end
            if self._prefix_caching:
                # Only pages of known tokens: a resumed sequence's pending token is not one yet.
                seq.table.register_full_pages(seq.token_ids, min(chunk.end, len(seq.token_ids)))

        # Chunks that finished a prompt sampled the first new token: the sequence now decodes.
        step = plan.step
        sampling = plan.sampling
        for i in range(plan.num_prefill_samples):
            seq = sampling[i]
            if seq.status is not _RUNNING:
                continue
            self._prefilling.remove(seq)
            self._computing_done(seq)
            self._decoding.append(seq)
            seq.decoding = True
            seq.num_pending = 1
            if self._speculation is not None and seq.drafter is None:
                seq.drafter = DraftState(self._speculation)
                self._next_draft_step = 0
            self._file_decoder(seq, step + 1)

        # The hot loop: one store per decode. Everything else is rare and handled below.
        for seq in plan.decodes:
            seq.num_pending = 1
        if self._drop_token:
            for seq in self._drop_token:
                seq.num_pending = 0
            self._drop_token.clear()

        if self._sliding_window is not None:
            self._release_pages_outside_window(plan)

        # Decoders filed under this step: finished by length, or their next token needs a page.
        due = self._due.pop(step, None)
        if due is not None:
            for seq in due:
                if seq.due_step != step or seq.status is not _RUNNING:
                    continue  # filed again since, finished, cancelled or preempted
                seq.due_step = -1
                if seq.num_tokens >= seq.finish_len:
                    self._finish(seq, "length")
                else:
                    self._needs_page.append(seq)

    def resolve(self, plan: StepPlan, sampled_tokens: SequenceOf[int]) -> list[FinishedRequest]:
        """The sampled tokens of the advanced step `plan`, one per `plan.sampling` entry in that
        order and then one per draft token (`plan.num_sampled` in all): each pending token's
        value is appended, each draft's accepted run after it, and stop tokens end their
        sequences. Returns every request that finished in this step (by length or by stop), with
        its real tokens."""
        if plan.is_empty:
            self._check_token_count("resolve", plan, sampled_tokens)
            return []
        if plan is not self._unresolved:
            raise SchedulerError(
                f"resolve() got step {plan.step}, which is not the step advanced last"
                + ("" if self._unresolved is not None else " (none is unresolved)")
            )
        self._check_token_count("resolve", plan, sampled_tokens)
        sampling = plan.sampling
        self._unresolved = None
        # A sequence with no token pending any more (cancelled) keeps its tokens as they are.
        # (The draft choices after the first len(sampling) tokens are _verify's.)
        for seq, token in zip(sampling, sampled_tokens, strict=False):
            if seq.num_pending:
                seq.token_ids.append(token)
                seq.num_pending = 0

        # Stop tokens: one C-level set test over all sampled tokens says whether to look closer.
        if not self._stop_ids.isdisjoint(sampled_tokens):
            for seq, token in zip(sampling, sampled_tokens, strict=False):
                if token in seq.stop_ids and seq.token_ids[-1] == token:
                    self._stop(seq)
        if plan.num_draft_tokens:
            self._verify(plan, sampled_tokens)

        finished = [self._finished_request(seq, reason) for seq, reason in self._finishing]
        self._finishing.clear()
        return finished

    @staticmethod
    def _check_token_count(call: str, plan: StepPlan, sampled_tokens: SequenceOf[int]) -> None:
        if len(sampled_tokens) != plan.num_sampled:
            raise SchedulerError(
                f"{call}() for step {plan.step} needs {plan.num_sampled} sampled tokens "
                f"(one per plan.sampling entry and one per draft token), got "
                f"{len(sampled_tokens)}"
            )

    def abandon(self) -> None:
        """The steps handed out (scheduled, or advanced and unresolved) will never complete:
        forget them. For an engine whose step failed; it then cancels its requests (a pending
        token is dropped by `cancel`). Finishes not yet reported never will be: those requests
        count as cancelled."""
        self._plan = None
        self._unresolved = None
        self._drop_token.clear()
        for seq, _ in self._finishing:
            self._count_as_cancelled(seq)
        self._finishing.clear()

    def _stop(self, seq: Sequence) -> None:
        """`seq`'s newest token, just resolved, is one of its stop ids."""
        if seq.status is _RUNNING:
            self._finish(seq, "stop")
        elif seq.status is _WAITING:  # preempted after its token was sampled (preemptive)
            self._waiting.remove(seq)
            self._record_finish(seq, "stop")
        elif seq.finish_reason == "length":  # hit its limit with a stop token: that is a stop
            for i, (other, _) in enumerate(self._finishing):
                if other is seq:
                    seq.finish_reason = "stop"
                    self._finishing[i] = (seq, "stop")

    # -- inspection ---------------------------------------------------------------------------

    @property
    def stats(self) -> SchedulerStats:
        pool = self.pool
        return SchedulerStats(
            pool_pages=pool.num_pages,
            peak_running=self._peak_running,
            largest_decode_batch=self._largest_decode_batch,
            peak_assigned_pages=self._peak_assigned_pages,
            admission_waits=self._admission_waits,
            waited_requests=self._waited_requests,
            prefix_cache_hit_tokens=self._prefix_cache_hit_tokens,
            preemptions=self._preemptions,
            recomputed_tokens=self._recomputed_tokens,
            steps=self._step,
            finished_requests=self._finished_requests,
            cancelled_requests=self._cancelled_requests,
            free_pages=pool.num_available,
            cached_pages=pool.num_cached,
            assigned_pages=pool.num_assigned,
            free_credits=self._policy.free_credits,
            drafted_tokens=self._drafted_tokens,
            accepted_tokens=self._accepted_tokens,
            verifications=self._verifications,
        )

    @property
    def would_draft(self) -> bool:
        """Whether the next plan should wait for the step in flight, to give a decoder a draft.
        Drafts are made on the host from a sequence's tokens, so with this True the engine
        resolves that step before planning the next; False lets it overlap the two. True when
        some decoder is not paused and the tokens it has so far end in an n-gram seen before
        (`DraftState.may_draft`): without one, its next lookup would mostly find nothing, and
        an overlapped step is cheaper than a resolved one that drafts nothing."""
        if not (self._drafts_allowed() and self._decoding and self._next_draft_step <= self._step):
            return False
        step = self._step
        for seq in self._decoding:
            drafter = seq.drafter
            assert drafter is not None  # every decoder has one while speculation is on
            if drafter.may_draft(seq.token_ids, step):
                return True
        return False

    def _drafts_allowed(self) -> bool:
        """Speculation is on and at most its max_batch requests are unfinished (running or
        waiting, as vLLM counts for `disable_by_batch_size`: a batch that is filling up does
        not draft while its first decoders are few)."""
        spec = self._speculation
        return spec is not None and (
            spec.max_batch is None or len(self._unfinished) <= spec.max_batch
        )

    @property
    def free_credits(self) -> int:
        """Credits (pages) not reserved by running requests (the whole pool under the
        preemptive policy, which reserves none)."""
        return self._policy.free_credits

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def waiting(self) -> list[Sequence]:
        """The queue, head first."""
        return list(self._waiting)

    def running(self) -> list[Sequence]:
        """Running sequences, oldest admission first."""
        return list(self._running.values())

    def get(self, request_id: RequestId) -> Sequence | None:
        """The unfinished sequence with this id, if any."""
        return self._unfinished.get(request_id)

    # -- internals ----------------------------------------------------------------------------

    def _mark_changed(self, seq: Sequence, step: int, changed: list[Sequence]) -> None:
        if seq.changed_at_step != step:
            seq.changed_at_step = step
            changed.append(seq)

    def _assign_decode_pages(
        self, step: int, changed: list[Sequence], preempted: list[Sequence]
    ) -> None:
        """Give each decoder in `_needs_page` its next page: the token it feeds this step sits at
        position num_tokens-1 == capacity, the first slot past its last page."""
        needs_page = [seq for seq in self._needs_page if seq.status is _RUNNING]
        self._needs_page = []

        def make_room(seq: Sequence) -> bool:
            return self._make_room(seq, preempted)

        for seq in self._policy.grow(needs_page, make_room):
            self._file_due(seq, step)
            self._mark_changed(seq, step, changed)

    def _file_due(self, seq: Sequence, next_step: int) -> None:
        """File decoder `seq` under the step after which it needs a look: when the token it will
        then have to feed has no page, or when it reaches its length limit.

        It feeds one token in every step from `next_step` on, holding n = num_tokens tokens
        before `next_step`. After step next_step + k it has n + k + 1 tokens, so it needs a page
        after the step where n + k == capacity, and finishes after the one where
        n + k + 1 == finish_len.
        """
        due = next_step + min(seq.table.capacity, seq.finish_len - 1) - seq.num_tokens
        seq.due_step = due
        bucket = self._due.get(due)
        if bucket is None:
            self._due[due] = [seq]
        else:
            bucket.append(seq)

    def _draft(
        self, decodes: list[Sequence], budget: int, step: int, changed: list[Sequence]
    ) -> int:
        """Give each decoder that speculates now its draft (prompt lookup, speculation.py);
        returns the draft tokens, at most `budget`. Every token is known (no step unresolved).

        A draft stops before finish_len - 1 (all accepted plus the bonus token reach
        finish_len at most), so its positions are within the request's credits: under
        conservative admission their pages exist. Under preemptive admission a draft takes only
        pages free above the watermark and is cut to the pages it has otherwise: a draft is a
        guess, not worth preempting anyone for."""
        total = 0
        next_draft = 1 << 62
        size = self.config.page_size
        for seq in decodes:
            state = seq.drafter
            assert state is not None  # every decoder has one while speculation is on
            if state.resume_step <= step:
                n = seq.num_tokens
                limit = min(state.k, seq.finish_len - n - 1, budget - total)
                draft = state.propose(seq.token_ids, limit, step) if limit > 0 else []
                if draft and self.draft_limit is not None:
                    draft = draft[: self.draft_limit(seq, draft)]
                    if not draft:  # nothing worth verifying: a miss, as a draft none accepts
                        state.miss(step)
                table = seq.table
                missing = -(-(n + len(draft)) // size) - len(table.pages)
                if missing > 0:
                    if self._policy.can_draft(missing):
                        table.ensure_capacity(n + len(draft))
                        self._mark_changed(seq, step, changed)
                    else:
                        draft = draft[: table.capacity - n]
                if draft:
                    seq.draft = tuple(draft)
                    seq.due_step = -1  # filed again by _verify once the accepted run is known
                    total += len(draft)
            if state.resume_step < next_draft:
                next_draft = state.resume_step
        self._next_draft_step = next_draft
        return total

    def _verify(self, plan: StepPlan, sampled_tokens: SequenceOf[int]) -> None:
        """Keep each draft's accepted run. The first choice of every decode is already appended;
        the choices at its draft positions follow the first len(plan.sampling) tokens. Draft
        token i is accepted when the sequence's newest token (the choice before it) equals it;
        then the choice made at its position is kept too. Then: a stop token ends the sequence,
        so does finish_len, and pages past the new length go back (they hold rejected drafts'
        KV, never registered: the prefix cache only ever sees computed, known tokens)."""
        at = len(plan.sampling)
        next_step = plan.step + 1
        for seq in plan.decodes:
            draft = seq.draft
            if not draft:
                continue
            seq.draft = ()
            choices = sampled_tokens[at : at + len(draft)]
            at += len(draft)
            if seq.status is not _RUNNING:  # cancelled, or its first token was a stop token
                continue
            tokens = seq.token_ids
            stop_ids = seq.stop_ids
            accepted = 0
            while (
                accepted < len(draft)
                and tokens[-1] == draft[accepted]
                and tokens[-1] not in stop_ids
            ):
                tokens.append(choices[accepted])
                accepted += 1
            self._drafted_tokens += len(draft)
            self._accepted_tokens += accepted
            self._verifications += 1
            drafter = seq.drafter
            assert drafter is not None
            drafter.record(len(draft), accepted, plan.step)
            if drafter.resume_step < self._next_draft_step:
                self._next_draft_step = drafter.resume_step
            if tokens[-1] in stop_ids:  # inside the accepted run (a first stop was seen above)
                self._finish(seq, "stop")
            else:
                seq.table.shrink_to(seq.num_tokens)
                self._file_decoder(seq, next_step)

    def _make_room(self, seq: Sequence, preempted: list[Sequence]) -> bool:
        """Free a page by preempting the newest running sequences, `seq` itself last; returns
        whether `seq` still runs."""
        while self.pool.num_available == 0:
            victim = next(reversed(self._running.values()))
            self._preempt(victim, preempted)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, preempted: list[Sequence]) -> None:
        """Send `seq` back to the front of the queue; it will recompute prompt + output so far."""
        seq.num_computed_at_preemption = seq.num_computed_tokens
        self._stop_running(seq)
        seq.status = _WAITING
        seq.decoding = False
        seq.prefilled_tokens = 0
        seq.due_step = -1
        seq.num_preemptions += 1
        self._waiting.appendleft(seq)
        self._preemptions += 1
        preempted.append(seq)

    def _add_chunk(
        self,
        seq: Sequence,
        budget: int,
        prefills: list[PrefillChunk],
        step: int,
        changed: list[Sequence],
    ) -> int:
        """Schedule the next chunk of `seq`'s prefill within `budget` tokens; returns its length."""
        start = seq.prefilled_tokens
        total = seq.num_tokens
        end = total if total - start <= budget else start + budget
        if seq.table.ensure_capacity(end):
            self._mark_changed(seq, step, changed)
        prefills.append(PrefillChunk(seq, start, end, end == total))
        return end - start

    def _admit(
        self, budget: int, prefills: list[PrefillChunk], step: int, changed: list[Sequence]
    ) -> tuple[Sequence, WaitReason] | None:
        """Admit from the head of the queue while table rows, credits and (continuous) budget allow.

        Static policy: called only when nothing runs, and admits the whole group that fits
        regardless of this step's token budget; their prompts then prefill in chunks.
        Continuous: a head whose next page another prompt is computing waits while that page is
        being computed (not counted as an admission wait), then shares it instead of computing
        it twice. Returns the head left waiting and why, if one is.
        """
        waiting = self._waiting
        max_num_seqs = self.config.max_num_seqs
        while waiting:
            seq = waiting[0]
            if len(self._running) >= max_num_seqs:
                return seq, "max_num_seqs"
            if self._continuous and budget == 0:
                return seq, "token_budget"
            match = self._cached_prefix(seq)
            if self._continuous and self._next_page_in_progress(seq, match):
                return seq, "shared_prefix"
            if not self._policy.fits(seq, match, len(self._running)):
                return self._count_wait(seq, self._no_room)
            waiting.popleft()
            self._start_running(seq, match, step, changed)
            if budget > 0:
                budget -= self._add_chunk(seq, budget, prefills, step, changed)
        return None

    def _count_wait(self, head: Sequence, reason: WaitReason) -> tuple[Sequence, WaitReason]:
        """The head of the queue could not start in this schedule() call for want of room."""
        self._admission_waits += 1
        if not head.waited:
            head.waited = True
            self._waited_requests += 1
        return head, reason

    def _cached_prefix(self, seq: Sequence) -> PrefixMatch:
        """Cached pages `seq` may start on: at most num_tokens-1 tokens, so the page holding the
        last token is always computed and the model produces logits to sample from."""
        if not (self._prefix_caching and seq.reuse_cached_prefix):
            return NO_MATCH
        return self.pool.match_prefix(seq.token_ids, seq.num_tokens - 1)

    def _next_page_key(self, seq: Sequence, match: PrefixMatch) -> int | None:
        """The prefix-cache key of the first page `seq` would compute itself after `match`, if
        that page is one a cache match could cover (full, before the last token)."""
        size = self.config.page_size
        index = len(match.pages)
        end = (index + 1) * size
        if end > seq.num_tokens - 1:
            return None
        parent = match.keys[-1] if match.keys else None
        return page_key(parent, tuple(seq.token_ids[index * size : end]))

    def _next_page_in_progress(self, seq: Sequence, match: PrefixMatch) -> bool:
        """Whether a prefilling sequence is about to compute the page `seq` would compute next
        (the same tokens up to its end), so that `seq` can wait and share it."""
        if not (self._computing and seq.reuse_cached_prefix):
            return False
        key = self._next_page_key(seq, match)
        other = self._computing.get(key) if key is not None else None
        end = (len(match.pages) + 1) * self.config.page_size
        return other is not None and other.prefilled_tokens < end

    def _computing_done(self, seq: Sequence) -> None:
        """`seq` left the prefill phase: it computes no page another request could wait for."""
        key = seq.computing_key
        if key is not None:
            seq.computing_key = None
            if self._computing.get(key) is seq:
                del self._computing[key]

    def _start_running(
        self, seq: Sequence, match: PrefixMatch, step: int, changed: list[Sequence]
    ) -> None:
        seq.table.share(match)
        seq.prefilled_tokens = match.num_tokens
        if self._sliding_window is not None:  # cached pages the window has already passed
            seq.table.release_pages_before(match.num_tokens - self._sliding_window + 1)
        seq.num_cached_tokens = match.num_tokens
        self._prefix_cache_hit_tokens += match.num_tokens
        if seq.num_preemptions:
            self._recomputed_tokens += max(0, seq.num_computed_at_preemption - match.num_tokens)
        else:  # the prompt's share (a resume may match its own output's pages too)
            seq.prompt_cached_tokens = match.num_tokens
        if self._prefix_caching and self._continuous:
            key = self._next_page_key(seq, match)
            if key is not None and key not in self._computing:
                self._computing[key] = seq
                seq.computing_key = key
        self._policy.admit(seq)
        seq.table_row = heapq.heappop(self._free_table_rows)
        seq.status = _RUNNING
        if seq.admit_index < 0:
            seq.admit_index = self._admissions
            self._admissions += 1
        self._running[seq.request_id] = seq
        self._prefilling.append(seq)
        self._mark_changed(seq, step, changed)

    def _file_decoder(self, seq: Sequence, next_step: int) -> None:
        """`seq` just got tokens whose count was not known in advance (a prefill's first token,
        pending; a draft's accepted run): finish at the length limit, or file it as a decoder.
        A stop token is `resolve`'s business."""
        num_tokens = seq.num_tokens
        if num_tokens >= seq.finish_len:
            self._finish(seq, "length")
        elif num_tokens > seq.table.capacity:  # the prompt filled its last page exactly
            self._needs_page.append(seq)
        else:
            self._file_due(seq, next_step)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a running sequence now; `resolve` reports it (once its last token is known)."""
        if self._plan is not None and seq.decoding:
            self._drop_token.append(seq)  # stopped while the next plan was out: drop its token
        self._stop_running(seq)
        self._record_finish(seq, reason)

    def _record_finish(self, seq: Sequence, reason: FinishReason) -> None:
        """`seq`, out of the running or waiting set, ends with `reason`; `resolve` reports it."""
        del self._unfinished[seq.request_id]
        seq.status = _FINISHED
        seq.finish_reason = reason
        self._finished_requests += 1
        self._finishing.append((seq, reason))

    @staticmethod
    def _finished_request(seq: Sequence, reason: FinishReason) -> FinishedRequest:
        return FinishedRequest(
            request_id=seq.request_id,
            prompt_ids=seq.token_ids[: seq.num_prompt_tokens],
            output_ids=seq.output_ids,
            finish_reason=reason,
            num_cached_tokens=seq.prompt_cached_tokens,
        )

    def _release_pages_outside_window(self, plan: StepPlan) -> None:
        """Every query from the next step on sits at `num_computed_tokens` or later and sees
        only the window's positions: the pages before them go back. (Kernels of the step still
        in flight may read them; a page reused is written by a later step, on the same stream.)"""
        window = self._sliding_window
        assert window is not None
        for seq in [chunk.seq for chunk in plan.prefills] + plan.decodes:
            if seq.status is _RUNNING:
                seq.table.release_pages_before(seq.num_computed_tokens - window + 1)

    def _stop_running(self, seq: Sequence) -> None:
        """Give back everything a running sequence holds: pages, credits, table row."""
        if self._prefix_caching:
            # Generated tokens' pages enter the cache here, once, rather than in the step loop:
            # only a later prompt that contains this output could use them anyway.
            known = min(seq.num_computed_tokens, len(seq.token_ids))
            seq.table.register_full_pages(seq.token_ids, known)
        seq.table.release()
        self._policy.release(seq)
        del self._running[seq.request_id]
        if seq.decoding:
            self._decoding.remove(seq)
        else:
            self._prefilling.remove(seq)
            self._computing_done(seq)
        heapq.heappush(self._free_table_rows, seq.table_row)
        seq.table_row = -1
