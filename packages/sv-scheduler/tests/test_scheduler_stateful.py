"""Hypothesis stateful test of the scheduler driven by a fake engine.

Random arrivals (prompts built on a few shared prefixes so the prefix cache gets hits), lengths,
early stops (the engine samples a request's stop ids with some probability), cancellations (also
while a step runs), static and continuous batching, prefix caching on and off, conservative and
preemptive admission on pools small enough to preempt often, and both ways of driving it:
`complete_step` after each step, or pipelined as the engine does it (the next step scheduled and
run before the previous one's tokens are resolved; the fake engine then reads each pending token
from the previous step's sampled tokens, as the GPU does).

The fake engine samples like a model: a request's next token is a function of its tokens so far
(seeded by the KV value at its last position), so however it was scheduled, preempted and
recomputed, a request's output must equal what it generates alone (`generate_alone`): the same
outputs under both admission policies.

The fake engine is also the oracle for the pages: it keeps a KV store of page x offset and, for each
position a plan says to compute, writes hash((value at position-1 read through the block table,
token)). That is how real K/V behave: a position's KV depends on the token and, through
attention, on everything before it. So if a block table ever points at a page holding someone
else's KV (a wrong prefix-cache hit, a page freed while still in use, a missing page), the value
read back differs from the chain computed straight from the sequence's own tokens.

Checked after every step: free + cached + assigned == pool; refcounts == block-table holders;
only prefix-cached pages are shared; credits never negative and equal to the pool minus the
running requests' credits; table rows unique; FIFO first admissions; every planned position has a slot;
the plan's shape (decodes first, sampling order, budget). At the end: everything finishes (no
deadlock, no starvation), outputs equal the sampled tokens and the request's output alone,
finish reasons are right, and all pages are back.
"""

from __future__ import annotations

import random

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sv_kvcache import PagePool
from sv_scheduler import (
    AdmissionError,
    FinishedRequest,
    Request,
    Scheduler,
    SchedulerConfig,
    Sequence,
    SequenceStatus,
    StepPlan,
)

ROOT = 0x5EED
STOP_CHOICES = (1, 2, 3)


def kv_chain(tokens: list[int]) -> list[int]:
    """The KV value at every position, computed straight from the tokens (no cache)."""
    values = []
    prev = ROOT
    for token in tokens:
        prev = hash((prev, token))
        values.append(prev)
    return values


def cached_as_own_prefix(pool: PagePool, seq: Sequence, index: int) -> bool:
    """Whether page `index` of `seq` is found in the prefix cache under the key of its own
    tokens so far (the key its block table chained for it)."""
    keys, size = seq.table.page_keys, pool.page_size
    if index >= len(keys):
        return False
    parent = keys[index - 1] if index else None
    tokens = tuple(seq.token_ids[index * size : (index + 1) * size])
    return pool.lookup(keys[index], parent, tokens) == seq.block_table[index]


def pages_touched(num_positions: int, page_size: int) -> int:
    """Distinct pages holding positions 0..num_positions-1, counted one by one (an independent
    route to ceil(num_positions / page_size))."""
    return len({position // page_size for position in range(num_positions)})


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    max_num_seqs = draw(st.integers(1, 5))
    return SchedulerConfig(
        num_pages=draw(st.integers(2, 40)),
        page_size=draw(st.sampled_from([2, 4, 4, 16])),
        max_model_len=draw(st.integers(8, 160)),
        policy=draw(st.sampled_from(["continuous", "static"])),
        max_num_seqs=max_num_seqs,
        max_step_tokens=max_num_seqs + draw(st.integers(0, 40)),
        prefix_caching=draw(st.booleans()),
        admission=draw(st.sampled_from(["conservative", "preemptive"])),
    )


# (prefix family or -1 for none, prefix length, tail tokens, max_new_tokens, stop ids, ignore_eos)
RequestSpec = tuple[int, int, list[int], int, frozenset[int], bool]
request_specs = st.tuples(
    st.integers(-1, 2),
    st.integers(0, 48),
    st.lists(st.integers(10, 60), max_size=24),
    st.integers(1, 30),
    st.frozensets(st.sampled_from(STOP_CHOICES)),
    st.booleans(),
)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        config=configs(),
        p_stop=st.sampled_from([0.0, 0.05, 0.3]),
        seed=st.integers(0, 2**32 - 1),
        initial=st.lists(request_specs, min_size=1, max_size=8),
        pipelined=st.booleans(),
    )
    def setup(
        self,
        config: SchedulerConfig,
        p_stop: float,
        seed: int,
        initial: list[RequestSpec],
        pipelined: bool,
    ) -> None:
        self.config = config
        self.pipelined = pipelined
        # pipelined: the step advanced and not yet resolved, with the tokens it sampled
        self.inflight: tuple[StepPlan, list[int]] | None = None
        self.sched = Scheduler(config)
        self.p_stop = p_stop
        self.rng = random.Random(seed)
        self.sample_seed = seed
        # A few shared prefixes, so prompts often begin with the same full pages.
        self.prefixes = [[self.rng.randint(10, 60) for _ in range(48)] for _ in range(3)]
        self.kv: dict[tuple[int, int], int] = {}
        self.seqs: dict[int, Sequence] = {}
        self.requests: dict[int, Request] = {}
        self.max_new: dict[int, int] = {}
        self.sampled: dict[int, list[int]] = {}
        self.results: dict[int, FinishedRequest] = {}
        self.cancelled: set[int] = set()
        self.first_admissions: list[int] = []  # request ids (arrival order) of first admissions
        self.tables_at_last_plan: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.next_id = 0
        for spec in initial:
            self.add_request(spec)

    # -- rules ----------------------------------------------------------------------------------

    @rule(spec=request_specs)
    def add(self, spec: RequestSpec) -> None:
        self.add_request(spec)

    @rule(specs=st.lists(request_specs, min_size=2, max_size=6))
    def add_burst(self, specs: list[RequestSpec]) -> None:
        for spec in specs:
            self.add_request(spec)

    def add_request(self, spec: RequestSpec) -> None:
        family, prefix_len, tail, max_new, stop_ids, ignore_eos = spec
        prompt = (self.prefixes[family][:prefix_len] if family >= 0 else []) + tail
        rid = self.next_id
        self.next_id += 1
        request = Request(rid, prompt, max_new, stop_ids=stop_ids, ignore_eos=ignore_eos)
        cfg = self.config
        # The oracle for rejection, computed independently of sv_scheduler.admission.
        expected_error = None
        if not prompt:
            expected_error = "the prompt is empty"
        elif len(prompt) >= cfg.max_model_len:
            expected_error = "leaving no room for an output token"
        else:
            clamped = min(max_new, cfg.max_model_len - len(prompt))
            if pages_touched(len(prompt) + clamped - 1, cfg.page_size) > cfg.num_pages:
                pages = f"{cfg.num_pages} page" + ("s" if cfg.num_pages != 1 else "")
                expected_error = f"but the KV-cache pool has only {pages}"
        try:
            seq = self.sched.add(request)
        except AdmissionError as error:
            assert expected_error is not None, f"unexpected rejection: {error}"
            assert expected_error in str(error) and f"request {rid}" in str(error)
            return
        assert expected_error is None, f"should have been rejected: {expected_error}"
        clamped = min(max_new, cfg.max_model_len - len(prompt))
        assert seq.credits == pages_touched(len(prompt) + clamped - 1, cfg.page_size)
        self.seqs[rid] = seq
        self.requests[rid] = request
        self.max_new[rid] = clamped
        self.sampled[rid] = []

    @precondition(lambda self: self.sched.has_unfinished() or self.inflight is not None)
    @rule()
    def step(self) -> None:
        self.run_step(cancel=None)

    @precondition(lambda self: self.sched.has_unfinished() or self.inflight is not None)
    @rule(pick=st.integers(0, 1000))
    def step_and_cancel_while_it_runs(self, pick: int) -> None:
        self.run_step(cancel=pick)

    @precondition(lambda self: self.seqs)
    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick: int) -> None:
        rid = sorted(self.seqs)[pick % len(self.seqs)]
        # Cancellable until its finish is reported: a request that reached its length limit in
        # the step advanced and not yet resolved (pipelined) is finished but unreported.
        unreported = rid not in self.results and rid not in self.cancelled
        assert (self.sched.cancel(rid) is not None) is unreported
        if unreported:
            self.cancelled.add(rid)
            assert self.seqs[rid].finish_reason == "cancelled"
            assert self.seqs[rid].block_table == []

    # -- one step through the fake engine -------------------------------------------------------

    def run_step(self, cancel: int | None) -> None:
        if self.pipelined:
            self.run_pipelined_step(cancel)
            return
        sched = self.sched
        running_before = {s.request_id for s in sched.running()}
        plan = sched.schedule()
        self.check_plan(plan, running_before)
        tokens = self.run_engine(plan)
        if cancel is not None and plan.sampling:
            victim = plan.sampling[cancel % len(plan.sampling)]
            rid = victim.request_id
            assert isinstance(rid, int)
            assert sched.cancel(rid)
            self.cancelled.add(rid)
            self.sampled[rid].pop()  # the token of a cancelled request is dropped
        finished = sched.complete_step(plan, tokens)
        for f in finished:
            assert isinstance(f.request_id, int)
            assert f.request_id not in self.results
            self.results[f.request_id] = f
            self.check_finished(f)

    def run_pipelined_step(self, cancel: int | None) -> None:
        """As the engine does it: with step i advanced and unresolved, schedule and run step
        i+1, then resolve step i, then advance step i+1."""
        sched = self.sched
        if self.inflight is None:
            running_before = {s.request_id for s in sched.running()}
            plan = sched.schedule()
            self.check_plan(plan, running_before)
            tokens = self.run_engine(plan)
            sched.advance(plan)
            self.inflight = (plan, tokens)
        previous, previous_tokens = self.inflight
        following: tuple[StepPlan, list[int]] | None = None
        if sched.has_unfinished():
            running_before = {s.request_id for s in sched.running()}
            plan = sched.schedule()
            self.check_plan(plan, running_before)
            on_device = {id(s): t for s, t in zip(previous.sampling, previous_tokens, strict=True)}
            following = (plan, self.run_engine(plan, on_device))
        if cancel is not None and previous.sampling:
            victim = previous.sampling[cancel % len(previous.sampling)]
            rid = victim.request_id
            assert isinstance(rid, int)
            if sched.cancel(rid):  # None: cancelled before, or its finish already reported
                self.cancelled.add(rid)
                assert victim.num_pending == 0
        finished = sched.resolve(previous, previous_tokens)
        self.inflight = None
        for f in finished:
            assert isinstance(f.request_id, int)
            assert f.request_id not in self.results
            self.results[f.request_id] = f
            if following is not None and any(
                s.request_id == f.request_id for s in following[0].sampling
            ):
                self.sampled[f.request_id].pop()  # stopped at step i: its step i+1 token is dropped
            self.check_finished(f)
        if following is not None:
            sched.advance(following[0])
            self.inflight = following

    def check_plan(self, plan: StepPlan, running_before: set[object]) -> None:
        cfg = self.config
        sched = self.sched
        in_plan = [c.seq for c in plan.prefills] + plan.decodes
        assert len({id(s) for s in in_plan}) == len(in_plan), "a sequence twice in one plan"
        assert plan.num_tokens <= cfg.max_step_tokens
        for chunk in plan.prefills:
            seq = chunk.seq
            assert seq.status is SequenceStatus.RUNNING and not seq.decoding
            assert chunk.start == seq.num_computed_tokens < chunk.end <= seq.num_tokens
            assert chunk.samples == (chunk.end == seq.num_tokens)
            assert seq.table.capacity >= chunk.end, "a prefill position without a slot"
        for seq in plan.decodes:
            assert seq.status is SequenceStatus.RUNNING and seq.decoding
            assert seq.num_computed_tokens == seq.num_tokens - 1
            assert seq.table.capacity >= seq.num_tokens, "a decode position without a slot"
        # Every decoder runs every step; sampling order is finishing prefills, then decodes.
        assert {id(s) for s in sched.running() if s.decoding} == {id(s) for s in plan.decodes}
        assert plan.sampling == [c.seq for c in plan.prefills if c.samples] + plan.decodes
        assert plan.num_prefill_samples == sum(c.samples for c in plan.prefills)
        for seq in plan.preempted:
            assert cfg.admission == "preemptive"
            assert seq.status is SequenceStatus.RUNNING or seq not in in_plan
        # Preempted sequences still waiting are at the front of the queue, oldest first.
        requeued = [s for s in plan.preempted if s.status is SequenceStatus.WAITING]
        head = sched.waiting()[: len(requeued)]
        assert {id(s) for s in head} == {id(s) for s in requeued}
        assert head == sorted(head, key=lambda s: s.admit_index)
        for seq in plan.block_table_changed:
            assert seq.status is SequenceStatus.RUNNING and seq.table_row >= 0

        # Admissions in this plan: FIFO (first admissions in arrival order); static waits for
        # the whole previous group.
        newly = [
            s
            for s in sched.running()
            if s.request_id not in running_before and s.status is SequenceStatus.RUNNING
        ]
        if newly and cfg.policy == "static":
            assert not (running_before & {s.request_id for s in sched.running()})
        for seq in sorted(newly, key=lambda s: s.admit_index):
            assert seq in plan.block_table_changed
            assert isinstance(seq.request_id, int)
            if seq.request_id not in self.first_admissions:
                self.first_admissions.append(seq.request_id)
        assert self.first_admissions == sorted(self.first_admissions), "admission skipped ahead"

        # Continuous and conservative: the head is only left waiting for a reason.
        waiting = sched.waiting()
        if cfg.policy == "continuous" and cfg.admission == "conservative" and waiting:
            head = waiting[0]
            assert (
                sched.num_running == cfg.max_num_seqs
                or plan.num_tokens == cfg.max_step_tokens
                or head.credits > sched.free_credits
                or self.computing_its_next_page(head)
            ), "the queue head could have been admitted"

        # Rows the engine must refresh: every running sequence whose block table or table row changed.
        changed = {id(s) for s in plan.block_table_changed}
        now = {}
        for seq in sched.running():
            assert isinstance(seq.request_id, int)
            now[seq.request_id] = (seq.table_row, tuple(seq.block_table))
            if self.tables_at_last_plan.get(seq.request_id) != now[seq.request_id]:
                assert id(seq) in changed, f"{seq} changed but is not in block_table_changed"
        self.tables_at_last_plan = now

    def computing_its_next_page(self, head: Sequence) -> bool:
        """Whether a running prompt is about to compute, with the same tokens before it, the
        first page `head` would have to compute itself (so head waits to share it)."""
        if not self.config.prefix_caching:
            return False
        size = self.config.page_size
        cached = self.sched.pool.match_prefix(head.token_ids, head.num_tokens - 1).num_tokens
        end = cached + size
        return end <= head.num_tokens - 1 and any(
            not other.decoding
            and other.prefilled_tokens < end <= other.num_tokens
            and other.token_ids[:end] == head.token_ids[:end]
            for other in self.sched.running()
        )

    def run_engine(self, plan: StepPlan, on_device: dict[int, int] | None = None) -> list[int]:
        """Compute the planned positions into the fake KV store, then sample. A pending token
        may only be a sequence's newest token, sampled by the previous step: its value comes
        from `on_device` (id(seq) -> the token the previous step sampled for it)."""
        pool = self.sched.pool
        size = self.config.page_size
        work = [(c.seq, c.start, c.end) for c in plan.prefills]
        work += [(s, s.num_tokens - 1, s.num_tokens) for s in plan.decodes]
        last_kv: dict[int, int] = {}
        for seq, start, end in work:
            fed = list(seq.token_ids[:end])
            if seq.num_pending:
                assert end == len(fed) + 1, "a pending token that is not the newest"
                assert on_device is not None and id(seq) in on_device, "pending, not on device"
                fed.append(on_device[id(seq)])
            assert len(fed) == end
            expected = kv_chain(fed)
            last_kv[id(seq)] = expected[-1]
            table = seq.block_table
            for position in range(start, end):
                page, offset = table[position // size], position % size
                assert pool.refcount(page) == 1, f"write into shared page {page}"
                assert position // size >= len(seq.table.page_keys), (
                    f"write into page {page}, already keyed for the prefix cache"
                )
                if position == 0:
                    prev = ROOT
                else:
                    prev = self.kv[(table[(position - 1) // size], (position - 1) % size)]
                self.kv[(page, offset)] = hash((prev, fed[position]))
                assert self.kv[(page, offset)] == expected[position], (
                    f"{seq}: KV at position {position} is not its own (wrong page shared?)"
                )
        tokens = []
        for seq in plan.sampling:
            token = self.sample(seq.request_id, last_kv[id(seq)])  # type: ignore[arg-type]
            self.sampled[seq.request_id].append(token)  # type: ignore[index]
            tokens.append(token)
        return tokens

    def sample(self, rid: int, kv: int) -> int:
        """The next token of request `rid`, given the KV value at its newest position: a function
        of its tokens so far, as a model's greedy choice is."""
        rng = random.Random(kv ^ self.sample_seed)
        stops = sorted(self.requests[rid].stop_ids)
        if stops and rng.random() < self.p_stop:
            return rng.choice(stops)
        return rng.randint(4, 60)

    def generate_alone(self, rid: int) -> list[int]:
        """What request `rid` generates with nobody else around: the oracle for its output."""
        request = self.requests[rid]
        tokens = list(request.prompt_ids)
        stops = frozenset() if request.ignore_eos else request.stop_ids
        output: list[int] = []
        while len(output) < self.max_new[rid]:
            output.append(self.sample(rid, kv_chain(tokens)[-1]))
            tokens.append(output[-1])
            if output[-1] in stops:
                break
        return output

    def check_finished(self, f: FinishedRequest) -> None:
        assert isinstance(f.request_id, int)
        request = self.requests[f.request_id]
        assert f.prompt_ids == list(request.prompt_ids)
        assert f.output_ids == self.sampled[f.request_id]
        assert f.output_ids == self.generate_alone(f.request_id), "scheduling changed the output"
        stops = frozenset() if request.ignore_eos else request.stop_ids
        assert not any(t in stops for t in f.output_ids[:-1]), "generation went past a stop"
        assert 1 <= len(f.output_ids) <= self.max_new[f.request_id]
        if f.finish_reason == "stop":
            assert f.output_ids[-1] in stops
        else:
            assert f.finish_reason == "length"
            assert f.output_ids[-1] not in stops
            assert len(f.output_ids) == self.max_new[f.request_id]
        assert len(f.prompt_ids) + len(f.output_ids) <= self.config.max_model_len

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def pages_and_credits(self) -> None:
        if not hasattr(self, "sched"):
            return
        sched, pool, cfg = self.sched, self.sched.pool, self.config
        running = sched.running()
        assert pool.num_free + pool.num_cached + pool.num_assigned == cfg.num_pages
        holders: dict[int, int] = {}
        for seq in running:
            assert len(set(seq.block_table)) == len(seq.block_table)
            for page in seq.block_table:
                holders[page] = holders.get(page, 0) + 1
        assert pool.num_assigned == len(holders)
        for page in range(cfg.num_pages):
            assert pool.refcount(page) == holders.get(page, 0)
        # A shared page is a prefix-cached one: each holder finds it under its own tokens' key.
        for seq in running:
            for index, page in enumerate(seq.block_table):
                if holders[page] > 1:
                    assert cfg.prefix_caching and cached_as_own_prefix(pool, seq, index), (
                        f"page {page} shared but not cached under {seq}'s prefix"
                    )
        if not cfg.prefix_caching:
            assert pool.num_cached == 0
        if cfg.admission == "preemptive":
            assert sched.free_credits == cfg.num_pages
        else:
            assert sched.free_credits == cfg.num_pages - sum(s.credits for s in running) >= 0
            for seq in running:
                assert len(seq.block_table) <= seq.credits
        rows = [s.table_row for s in running]
        assert len(set(rows)) == len(rows) and all(0 <= x < cfg.max_num_seqs for x in rows)
        assert len(running) <= cfg.max_num_seqs
        for seq in sched.waiting():
            assert seq.block_table == [] and seq.table_row == -1
        assert sched.num_waiting + sched.num_running == sum(
            1 for s in self.seqs.values() if s.status is not SequenceStatus.FINISHED
        )

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        sched, cfg = self.sched, self.config
        # Drain: every admitted request must finish. Conservative: each step feeds at least one
        # token and nothing is recomputed, so the total tokens bound the number of steps.
        budget = sum(len(s.token_ids) + s.max_new_tokens for s in self.seqs.values()) + 1
        if cfg.admission == "preemptive":
            budget = budget * 20 + 100
        steps = 0
        while self.pipelined and (sched.has_unfinished() or self.inflight is not None):
            assert steps < budget, "no progress: deadlock or livelock"
            self.run_pipelined_step(cancel=None)
            self.pages_and_credits()
            steps += 1
        while sched.has_unfinished():
            assert steps < budget, "no progress: deadlock or livelock"
            running_before = {s.request_id for s in sched.running()}
            plan = sched.schedule()
            assert not plan.is_empty, "an empty plan while requests are unfinished"
            self.check_plan(plan, running_before)
            finished = sched.complete_step(plan, self.run_engine(plan))
            for f in finished:
                self.results[f.request_id] = f  # type: ignore[index]
                self.check_finished(f)
            self.pages_and_credits()
            steps += 1
        assert set(self.results) | self.cancelled == set(self.seqs)
        for rid, f in self.results.items():  # nothing appended after the end, no placeholder
            assert self.seqs[rid].token_ids == f.prompt_ids + f.output_ids
        assert not set(self.results) & self.cancelled
        stats = sched.stats
        assert stats.assigned_pages == 0
        assert stats.free_pages == cfg.num_pages
        assert stats.free_credits == cfg.num_pages
        assert stats.finished_requests == len(self.results)
        assert stats.cancelled_requests == len(self.cancelled)
        if cfg.admission == "conservative":
            assert stats.preemptions == stats.recomputed_tokens == 0
        assert stats.peak_running <= cfg.max_num_seqs
        assert stats.peak_assigned_pages <= cfg.num_pages
        # What this example exercised (pytest --hypothesis-show-statistics).
        event(f"policy={cfg.policy} admission={cfg.admission} caching={cfg.prefix_caching}")
        event(f"prefix-cache hits: {stats.prefix_cache_hit_tokens > 0}")
        event(f"preemptions: {stats.preemptions > 0}")
        event(f"admission waits: {stats.admission_waits > 0}")
        event(f"stops: {any(f.finish_reason == 'stop' for f in self.results.values())}")
        event(f"cancellations: {bool(self.cancelled)}")
        event(f"pipelined: {self.pipelined}")
        event(f"requests admitted: {min(len(self.seqs), 5)}{'+' if len(self.seqs) >= 5 else ''}")


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=250, stateful_step_count=40, deadline=None)
