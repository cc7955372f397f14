"""The engine: tokenizer + scheduler + model runner, composed once for every app.

The step loop, in full:

    plan = scheduler.schedule()              # who prefills which chunk, who decodes
    runner.set_block_tables(changed rows)    # only sequences that got a page or were admitted
    tokens = runner.execute(step inputs)     # one forward pass + sampling
    finished = scheduler.complete_step(plan, tokens)   # append tokens, stop, free pages

That loop leaves the GPU idle while the host reads the tokens, turns them into events and plans
the next step: about 50 us a step, 6% of a batch-1 decode step on the H200. So the engine runs
it one step ahead (`overlap`, the default): with step i queued on the GPU, it plans step i+1
and queues it too, and only then waits for step i's tokens:

    plan(i+1) = scheduler.schedule()         # step i is advanced: its tokens are counted
    pending(i+1) = runner.launch(inputs)     # tokens of step i still on the GPU are fed there
    tokens(i) = pending(i).result()          # the GPU is busy with step i+1 meanwhile
    finished = scheduler.resolve(plan(i), tokens(i))   # values in, stop tokens applied
    scheduler.advance(plan(i+1))

A request that stops at step i was planned into step i+1 as well; that token is dropped (one
wasted row), so the outputs are exactly those of the plain loop. Each `step()` call returns the
events of one step.

With speculation (`speculation=`, sv_scheduler.speculation) a decoder may feed a draft after its
newest token and keep 1 + accepted tokens. The draft is made on the host from the sequence's
tokens and the accepted count decides the next step's positions, so around a step with drafts
the loop resolves before it plans: `tokens(i)` first, then `plan(i+1)`. That costs what the
plain loop costs per step, measured at batch 1 on the H200 as 939 against 806 us per token
(BENCHMARKS.md, run 38): about 130 us per speculative step, where each accepted token saves a
whole step of about 800 us. When no decoder would draft (each one paused for missing, or its
tokens so far ending in no n-gram seen before: see `Scheduler.would_draft`) the loop overlaps
again.

Everything else here is bookkeeping around that loop: request ids, prompts, cancels, grammars.
Its parts live apart: what is kept per request and per launched step (`live`), a plan turned
into the runner's inputs (`step_inputs`), a step's tokens turned into events (`events`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from sv_kernels import TuningCache
from sv_kernels.quantized import QuantKind
from sv_model import ModelRunner, TokenBitmask
from sv_scheduler import (
    Admission,
    FinishedRequest,
    FinishReason,
    Request,
    RequestId,
    Scheduler,
    SchedulerConfig,
    SchedulerStats,
    SpeculationConfig,
    StepPlan,
)
from sv_scheduler import Sequence as Seq
from sv_tokenizer import Message, StreamDecoder, Tokenizer

from sv_engine import bad_words, draft_choices
from sv_engine.errors import EngineError
from sv_engine.events import finish_event, token_events
from sv_engine.grammar import GrammarMatcher, Grammars
from sv_engine.live import LaunchedStep, LiveRequest, LiveRequests
from sv_engine.loading import EngineConfig, KVCacheDtype, TokenizerCheck, load_model
from sv_engine.logit_controls import RowControls
from sv_engine.logprobs import OutputLogprobs, PromptLogprobs, with_first_rows
from sv_engine.params import Completion, SamplingParams, StreamEvent, sampler_seed
from sv_engine.ranks import start_leader
from sv_engine.step_inputs import step_inputs

if TYPE_CHECKING:
    from sv_trace.recorder import StepRecorder

# A prompt is a user message (str, formatted with the model's chat format), a whole dialog
# (a list of Messages), or token ids used as they are.
Prompt = str | Sequence[Message] | Sequence[int]


def _sampling_params(params: object) -> SamplingParams:
    """`params`, or the defaults for None; anything else (a dict of OpenAI's fields, say) is
    refused by name rather than failing on its first missing attribute."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise EngineError(f"params must be a SamplingParams or None, got {type(params).__name__}")
    return params


class Engine:
    def __init__(
        self,
        tokenizer: Tokenizer,
        runner: ModelRunner,
        scheduler: Scheduler,
        stop_ids: frozenset[int],
    ) -> None:
        self.tokenizer = tokenizer
        self.runner = runner
        self.scheduler = scheduler
        self.stop_ids = stop_ids
        self._live = LiveRequests()
        self._ids = itertools.count(1)  # request 1 is the first prompt, in every message
        self._special_ids = frozenset(tokenizer.special_tokens.values())
        # Rows of the model's logits past the tokenizer's vocabulary (Qwen's checkpoints pad
        # 151,669 tokens to 151,936): a model may sample one (random weights often do), and it
        # has no text, as in HF's decode.
        self._tokenless_ids = frozenset(range(tokenizer.vocab_size, runner.config.vocab_size))
        self.grammars = Grammars(tokenizer, runner.config.vocab_size, stop_ids)
        scheduler.draft_limit = self._draft_limit
        # Plan and launch the next step before reading this one's tokens (see the module doc).
        self.overlap = True
        self._in_flight: LaunchedStep | None = None  # launched and advanced, not yet resolved
        self.tracer: StepRecorder | None = None  # --trace (sv_engine.tracing.start_trace)

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        *,
        device: str = "auto",
        kv_cache_mib: float | None = None,
        policy: str = "continuous",
        dtype: torch.dtype | None = None,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        max_step_tokens: int = 8192,
        prefix_caching: bool = True,
        admission: Admission = "conservative",
        speculation: SpeculationConfig | None = None,
        use_cuda_graphs: bool = True,
        tuning_cache: TuningCache | None = None,
        kv_cache_dtype: KVCacheDtype = "auto",
        warmup: bool = True,
        progress: Callable[[str], None] | None = None,
        quantization: QuantKind | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        chat_template: str | None = None,
        chat_template_source: str | None = None,
        check_tokenizer: TokenizerCheck | None = None,
    ) -> Engine:
        """Load a Llama checkpoint folder (config.json, safetensors, tokenizer) into a ready engine.

        device "auto" picks CUDA when present, else the CPU. The KV pool is `kv_cache_mib` MiB
        when given; otherwise most of the free GPU memory on CUDA, a modest default on the CPU.
        `admission` is the scheduler's policy: "conservative" reserves each request's whole
        budget up front, "preemptive" admits on the prompt's pages and preempts when pages run
        out (see sv_scheduler.admission). `speculation`: prompt-lookup speculative decoding
        (None: off; see sv_scheduler.speculation). `tuning_cache`: the file that keeps the batch-1 GEMV
        timings between processes (None: time them in every process; the apps pass
        `sv_engine.options.default_tuning_cache()`). `kv_cache_dtype` "fp8" stores the KV pool
        as FP8 e4m3 (half the bytes of BF16 per token, so twice the tokens in the same memory;
        see sv_model.KVCache); "auto" uses the weights' dtype. On CUDA, `warmup` compiles the kernels and
        captures the decode graphs before returning, so no request pays for them; `progress`
        hears a line per phase (see `ModelRunner.warmup`: seconds, or about half a minute the
        first time on a machine). `quantization` ("fp8" or "int8") quantizes the matrices at
        load (see `sv_model.quantize`); a pre-quantized checkpoint's come quantized anyway.
        `tensor_parallel_size` > 1 splits the model over that many ranks, one process each
        (this one is rank 0; see sv_engine.ranks): `kv_cache_mib` is then each rank's pool.
        `gpu_memory_utilization` (CUDA only, not with `kv_cache_mib`): the share of the GPU's
        whole memory the engine may use, weights included (see `loading.gpu_kv_budget`).
        `chat_template` replaces the model folder's chat template (checked at load as the
        folder's is; `chat_template_source` names it in messages). `check_tokenizer` sees the
        tokenizer before the weights load: a ValueError it raises (an option this model's
        tokenizer cannot honour) is an EngineError, found before the long part of the load.
        """
        cfg = EngineConfig(
            device=device,
            kv_cache_mib=kv_cache_mib,
            policy=policy,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            max_step_tokens=max_step_tokens,
            prefix_caching=prefix_caching,
            admission=admission,
            use_cuda_graphs=use_cuda_graphs,
            tuning_cache=tuning_cache,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            chat_template=chat_template,
            chat_template_source=chat_template_source,
        )
        if tensor_parallel_size == 1:
            loaded = load_model(Path(model_dir), cfg, check_tokenizer=check_tokenizer)
        else:
            loaded = start_leader(Path(model_dir), cfg, check_tokenizer)
        scheduler = Scheduler(
            SchedulerConfig(
                num_pages=loaded.num_pages,
                max_model_len=loaded.max_model_len,
                page_size=loaded.runner.page_size,
                policy=cfg.policy,  # type: ignore[arg-type]
                max_num_seqs=cfg.max_num_seqs,
                max_step_tokens=cfg.max_step_tokens,
                prefix_caching=cfg.prefix_caching,
                admission=cfg.admission,
                sliding_window=loaded.config.sliding_window,
                speculation=speculation,
            )
        )
        if warmup and loaded.runner.is_cuda:
            loaded.runner.warmup(min(cfg.max_step_tokens, loaded.max_model_len), progress)
        stop_ids = frozenset(loaded.tokenizer.eos_ids) | frozenset(loaded.config.eos_token_ids)
        return cls(loaded.tokenizer, loaded.runner, scheduler, stop_ids)

    # --- requests -------------------------------------------------------------------------------

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids for a prompt: a str is one user turn of the model's chat format."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise EngineError("the prompt is empty")
            return self.tokenizer.chat_format.encode_user_prompt(prompt)
        if isinstance(prompt, bytes | bytearray) or not isinstance(prompt, Iterable):
            raise EngineError(
                "a prompt is a str, a list of Message, or a list of token ids, "
                f"got {type(prompt).__name__}"
            )
        items = list(prompt)
        if not items:
            raise EngineError("the prompt is empty")
        if all(isinstance(m, Message) for m in items):
            return self.tokenizer.chat_format.encode_dialog(items)  # type: ignore[arg-type]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
            bad = [t for t in items if not 0 <= t < self.runner.config.vocab_size]  # type: ignore[operator]
            if bad:
                raise EngineError(
                    f"prompt token id {bad[0]} is outside the vocabulary "
                    f"(0..{self.runner.config.vocab_size - 1})"
                )
            return items  # type: ignore[return-value]
        kinds = sorted({type(item).__name__ for item in items})
        raise EngineError(
            "a prompt is a str, a list of Message, or a list of token ids, "
            f"got a {type(prompt).__name__} of {', '.join(kinds)}"
        )

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        stream_text: bool = True,
        continuation: bool = False,
    ) -> RequestId:
        """Queue one request; raises EngineError/AdmissionError if it can never run.

        With `stream_text` False its events carry no text (only token ids) and the text is
        decoded once, into the completion: cheaper for batch work nobody watches token by token.
        `continuation`: the text continues the prompt's (a raw completion, not a chat answer),
        so a SentencePiece tokenizer's leading space is kept, as decoding both together keeps
        it (see `Tokenizer.decode`).
        """
        params = _sampling_params(params)
        if params.n != 1:
            raise EngineError(f"add_request queues one choice, but n = {params.n}: use add_choices")
        prompt_ids = self.encode_prompt(prompt)
        vocab_size = self.runner.config.vocab_size
        for name in ("grammar_after_token", "grammar_wait_opener"):
            token = getattr(params, name)
            if token is not None and token >= vocab_size:
                raise EngineError.bad_field(
                    name, f"has token id {token}, outside the vocabulary (0..{vocab_size - 1})"
                )
        bad_word_ids = (
            bad_words.word_ids(self.tokenizer.encode, params.bad_words) if params.bad_words else ()
        )
        # Found here, not when the step indexes the logits with them: a failed step ends
        # every request in flight, not only this one. (A stop id past the logits could never
        # be sampled: it was a stop that silently never came.)
        for name, ids in (
            ("logit_bias", params.logit_bias),
            ("allowed_token_ids", params.allowed_token_ids or ()),
            ("bad_words", [t for word in bad_word_ids for t in word]),
            ("stop_token_ids", params.stop_token_ids),
        ):
            outside = sorted(t for t in ids if t >= vocab_size)
            if outside:
                raise EngineError.bad_field(
                    name, f"has token id {outside[0]}, outside the vocabulary (0..{vocab_size - 1})"
                )
        # ignore_eos drops the model's stop ids only: the request's own still stop it. A
        # grammar's end is a stop token too (its mask allows nothing else), so those stay.
        model_stops = frozenset() if params.ignore_eos and params.grammar is None else self.stop_ids
        stop_ids = model_stops | params.stop_token_ids
        if params.allowed_token_ids is not None:
            # A row with no token left would come out as token 0, outside the allowed set.
            banned = {word[0] for word in bad_word_ids if len(word) == 1}
            if params.min_tokens:
                banned |= stop_ids
            if params.allowed_token_ids <= banned:
                raise EngineError.bad_field(
                    "allowed_token_ids",
                    "leaves nothing to generate: every allowed id is a one-token bad word"
                    + (" or a stop token, banned until min_tokens" if params.min_tokens else ""),
                )
        if params.grammar is not None and params.min_tokens:
            # A grammar that completes within min_tokens allows only the stop tokens, which
            # min_tokens bans: no token would be left (it came out as token 0, unannounced).
            raise EngineError.bad_field(
                "min_tokens",
                "cannot be combined with an output constraint: the grammar decides where the "
                "output ends",
            )
        request_id = next(self._ids)
        matcher = (
            self.grammars.matcher(
                params.grammar,
                params.grammar_after_token,
                params.grammar_wait_opener,
                params.allowed_token_ids,
            )
            if params.grammar is not None
            else None
        )
        self.scheduler.add(
            Request(
                request_id=request_id,
                prompt_ids=prompt_ids,
                max_new_tokens=params.max_new_tokens,
                stop_ids=stop_ids,
                reuse_cached_prefix=params.prompt_logprobs is None,
            )
        )
        seed = sampler_seed(params.seed) if params.seed is not None else random.getrandbits(32)
        live = LiveRequest(
            params=params,
            seed=seed,
            decoder=(
                StreamDecoder(self.tokenizer, continuation=continuation) if stream_text else None
            ),
            continuation=continuation,
            stop_ids=stop_ids,
            prompt_ids=prompt_ids,
            start=time.perf_counter(),
            logprobs=None if params.logprobs is None else OutputLogprobs(params.logprobs),
            prompt_logprobs=(
                None
                if params.prompt_logprobs is None
                else self._live.prompt_scores(prompt_ids, params.prompt_logprobs)
            ),
            controls=(
                # (min_tokens bans the stop ids; one past the logits is never sampled anyway)
                RowControls(
                    params,
                    frozenset(t for t in stop_ids if t < self.runner.config.vocab_size),
                    prompt_ids,
                    bad_word_ids,
                )
                if params.processes_logits
                else None
            ),
            hidden_ids=stop_ids
            | self._tokenless_ids
            | (self._special_ids if params.skip_special_tokens else frozenset()),
            matcher=matcher,
        )
        self._live.add(request_id, live)
        if self.tracer is not None:
            self.tracer.queued(request_id, prompt_ids, params.max_new_tokens)
        return request_id

    def add_choices(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        stream_text: bool = True,
        continuation: bool = False,
    ) -> list[RequestId]:
        """Queue the `params.n` choices of one prompt, all or none: one request each
        (`SamplingParams.choices`), queued together, so admission counts every one and they
        share the prompt's full pages (the prefix cache; those admitted in one step wait for
        the page another is computing). Each computes its own last, partial page: at most 16
        positions, where copying the page would be a mechanism of its own for the same work."""
        params = _sampling_params(params)
        prompt_ids = self.encode_prompt(prompt)
        ids: list[RequestId] = []
        try:
            for choice in params.choices():
                ids.append(
                    self.add_request(
                        prompt_ids, choice, stream_text=stream_text, continuation=continuation
                    )
                )
        except BaseException:
            for request_id in ids:
                self.cancel(request_id)
            raise
        return ids

    def cancel(self, request_id: RequestId) -> StreamEvent | None:
        """Cancel a request at once (between steps): its pages and credits are returned.
        Returns the request's final event, or None if it was not in flight."""
        return self._end(request_id, "cancelled")

    def _end(self, request_id: RequestId, reason: FinishReason) -> StreamEvent | None:
        """End a request at once (between steps) with `reason`, as `cancel` does (the
        scheduler's statistics count it as cancelled: it was ended from outside its steps)."""
        seq = self.scheduler.cancel(request_id)
        if seq is None or request_id not in self._live:
            return None
        # After the cancel: a token still on the device is not part of the output.
        output = seq.output_ids
        prompt_ids = self._live[request_id].prompt_ids
        event = finish_event(
            # (its prompt's cached tokens too: a request a stop string ends reports them)
            FinishedRequest(request_id, prompt_ids, output, reason, seq.prompt_cached_tokens),
            None,
            "",
            self._live,
            self.tokenizer,
        )
        if self.tracer is not None:
            self.tracer.cancelled(request_id, reason)
        in_flight = self._in_flight
        if in_flight is not None and not any(
            s.request_id in self._live for s in in_flight.plan.sampling
        ):
            # Nobody waits for the step in flight any more: end it now (its tokens are all
            # dropped), so that has_unfinished() turns false once nothing is left.
            self._in_flight = None
            self._resolve(in_flight)
        return event

    def cancel_all(self) -> None:
        for request_id in list(self._live):
            self.cancel(request_id)

    def clear_prefix_cache(self) -> int:
        """Forget cached prompt pages nobody holds; returns how many pages were freed."""
        return self.scheduler.clear_prefix_cache()

    def has_unfinished(self) -> bool:
        """Whether a request is unfinished or a step's events are still to come."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    @property
    def stats(self) -> SchedulerStats:
        return self.scheduler.stats

    # --- the step loop --------------------------------------------------------------------------

    def step(self) -> list[StreamEvent]:
        """Finish one model step: return one event per token it sampled (and per request that
        finished). With `overlap`, the next step is already launched when this returns."""
        try:
            if not self.overlap:
                draining = self._in_flight
                if draining is not None:  # overlap was just turned off: drain first
                    self._in_flight = None
                    return self._resolve(draining) + self._end_failed_grammars()
                launched = self._launch_next(None)
                if launched is None:
                    return []
                self.scheduler.advance(launched.plan)
                return self._resolve(launched) + self._end_failed_grammars()
            current = self._in_flight
            if current is None:
                current = self._launch_next(None)
                if current is None:
                    return []
                self.scheduler.advance(current.plan)
            self._in_flight = None
            if current.plan.num_draft_tokens or self.scheduler.would_draft:
                # Speculation: the next plan needs this step's tokens (see the module doc).
                events = self._resolve(current)
                following = self._launch_next(None) if self.scheduler.has_unfinished() else None
            else:
                following = self._launch_next(current) if self.scheduler.has_unfinished() else None
                events = self._resolve(current)
            if following is not None:
                self.scheduler.advance(following.plan)
                if self.scheduler.has_unfinished():
                    self._in_flight = following
                else:  # every request in it is done: end it now, so nothing is left in flight
                    # A grammar that failed on this step's tokens ends its request first, at
                    # the refused token, as the plain loop does: `following` may hold one
                    # more token of it, sampled from nothing, at its length limit.
                    events += self._end_failed_grammars()
                    events += self._resolve(following)
            return events + self._end_failed_grammars()
        except BaseException:
            self._abandon_all()
            raise

    def _launch_next(self, previous: LaunchedStep | None) -> LaunchedStep | None:
        """Plan the next step and queue it on the device; None when there is nothing to run.
        `previous` is the step still in flight, whose tokens this one may feed."""
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return None
        if self.tracer is not None:
            self.tracer.planned(plan)
        self.runner.set_block_tables(
            [(s.table_row, s.block_table) for s in plan.block_table_changed]
        )
        prompt_targets = self._prompt_targets(plan) if self._live.num_logprobs else []
        bitmask = self._token_bitmask(plan, previous) if self._live.num_constrained else None
        inputs = step_inputs(
            plan, previous, self._live, self.runner.config.vocab_size, prompt_targets, bitmask
        )
        launched = LaunchedStep(
            plan, self.runner.launch(inputs), [(r, t) for r, _, _, t in prompt_targets]
        )
        if self.tracer is not None:
            self.tracer.launched(plan)
        return launched

    def _resolve(self, launched: LaunchedStep) -> list[StreamEvent]:
        """Wait for a launched step's tokens; hand them to the scheduler; make the events."""
        plan = launched.plan
        tokens = launched.tokens.result()
        self._advance_grammars(launched)
        # A decode that verifies a draft keeps its first choice and then its accepted run,
        # which starts at its length before the scheduler appends it.
        drafted = draft_choices.drafting(plan)
        runs: dict[int, tuple[int, draft_choices.DraftChoices]] = {}
        if drafted:
            runs = {
                id(s): (len(s.token_ids), drafted[id(s)]) for s in plan.decodes if id(s) in drafted
            }
        finished = {f.request_id: f for f in self.scheduler.resolve(plan, tokens)}
        self._deliver_prompt_logprobs(launched)
        events = token_events(
            plan,
            tokens,
            launched.tokens.logprobs(),
            finished,
            runs,
            self._live,
            self.tokenizer,
        )
        if self.tracer is not None:
            self.tracer.resolved(plan, tokens, events, draft_choices.kept_runs(runs, plan))
        return events

    def _prompt_targets(self, plan: StepPlan) -> list[tuple[PromptLogprobs, int, int, list[int]]]:
        """(the scores, prefill row, offset in its chunk, prompt ids) of each chunk of this
        plan that scores prompt tokens (SamplingParams.prompt_logprobs): only tokens no chunk
        has scored yet, for requests that share their scores."""
        out = []
        for row, chunk in enumerate(plan.prefills):
            prompt = self._live[chunk.seq.request_id].prompt_logprobs
            if prompt is not None and (found := prompt.targets(chunk)) is not None:
                out.append((prompt, row, *found))
        return out

    def _deliver_prompt_logprobs(self, launched: LaunchedStep) -> None:
        rows = launched.tokens.prompt_logprobs()
        if rows is None:
            return
        for scores, first_row, targets in with_first_rows(launched.prompt_targets):
            scores.add(rows, first_row, targets)

    def _abandon_all(self) -> None:
        """A step failed: end every request (pages and credits back) and forget the steps in
        flight, so the engine is usable again; the caller sees the exception."""
        self._in_flight = None
        self.scheduler.abandon()
        if self.tracer is not None:
            self.tracer.abandoned()
        for request_id in list(self._live):
            self.cancel(request_id)
        self._live.clear()

    # --- structured output ----------------------------------------------------------------------

    def _token_bitmask(
        self, plan: StepPlan, previous: LaunchedStep | None
    ) -> Callable[[], TokenBitmask | None]:
        """What the runner calls once the step's forward is queued: the grammar masks of its
        constrained rows. A constrained request's mask depends on the token the step before
        gave it, so with overlap this is where the engine waits for that step (the device is
        busy with this step's forward meanwhile) and advances the matchers: the overlap is
        kept, and only sampling waits for the mask (see ARCHITECTURE.md, the overlap rule)."""

        drafted = draft_choices.drafting(plan)

        def bitmask() -> TokenBitmask | None:
            if previous is not None:
                self._advance_grammars(previous)
            rows: list[tuple[Sequence[int], GrammarMatcher, Sequence[int]]] = []
            for row, seq in enumerate(plan.sampling):
                live = self._live.get(seq.request_id)
                if live is None or live.matcher is None or live.matcher.waiting:
                    continue  # (a waiting grammar: its draft stops before the token it waits for)
                d = drafted.get(id(seq))
                if d is None:
                    rows.append(([row], live.matcher, ()))
                else:  # a mask per draft position, each after the drafts before it
                    rows.append(
                        ([d.row(i) for i in range(len(d.draft) + 1)], live.matcher, d.draft)
                    )
            return self.grammars.bitmask(rows)

        return bitmask

    def _end_failed_grammars(self) -> list[StreamEvent]:
        """End each request whose grammar failed, at once: a failed matcher's mask allows only
        the stop tokens, but allowed_token_ids may ban those too, and then every later token
        would be sampled from nothing (as token 0) until max_tokens. Only the constrained
        requests are visited: the rest have no matcher to fail."""
        constrained = self._live.constrained
        if not constrained:
            return []
        failed = [
            request_id
            for request_id, live in constrained.items()
            if live.matcher is not None and live.matcher.error is not None
        ]
        return [event for r in failed if (event := self._end(r, "error")) is not None]

    def _draft_limit(self, seq: Seq, draft: list[int]) -> int:
        """How much of a proposed draft to verify: a constrained request's grammar may cut it."""
        live = self._live.get(seq.request_id)
        if live is None or live.matcher is None:
            return len(draft)
        return live.matcher.draft_prefix(draft, live.stop_ids)

    def _advance_grammars(self, launched: LaunchedStep) -> None:
        """Give a step's tokens to the matchers of its live constrained requests, once."""
        if launched.grammars_advanced:
            return
        launched.grammars_advanced = True
        if not self._live.num_constrained:
            return
        # One token per plan.sampling entry first; a verify step's draft choices follow them,
        # and the accepted ones are given to the matchers by _resolve, once it knows them.
        for seq, token in zip(launched.plan.sampling, launched.tokens.result(), strict=False):
            live = self._live.get(seq.request_id)
            if live is not None and live.matcher is not None:
                live.matcher.accept(token)

    # --- conveniences -------------------------------------------------------------------------

    def stream(
        self, prompts: Iterable[Prompt], params: SamplingParams | None = None
    ) -> Iterator[StreamEvent]:
        """Queue every prompt (a lone str is one prompt), then yield events as tokens are
        generated. Closing the iterator early, dropping it unread, or Ctrl-C cancels what is
        still running, so no page is left held. Only these prompts' events come out: a request
        queued before with `add_request` runs in the same steps, but its events are not
        returned here (drive such requests with `step`)."""
        events = self._run(self._add_all(prompts, params))
        # Into _run's try block now: an iterator dropped before its first event (never
        # iterated) is closed by the garbage collector, which cancels its requests too.
        next(events)
        return cast(Iterator[StreamEvent], events)

    def generate(
        self, prompts: Iterable[Prompt], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Run every prompt (a lone str is one prompt) to completion; completions come back in
        prompt order (with `params.n` > 1, each prompt's choices in turn). As with `stream`,
        a request queued before with `add_request` runs in the same steps, but its completion
        is not returned here."""
        ids = self._add_all(prompts, params, stream_text=False)
        done = {
            e.request_id: e.completion
            for e in self._run(ids)
            if e is not None and e.completion is not None
        }
        return [done[r] for r in ids]

    def _run(self, ids: list[RequestId]) -> Iterator[StreamEvent | None]:
        """The events of requests `ids`, after a first None (see `stream`); when the iterator
        is closed or dropped, the requests still running are cancelled."""
        pending = set(ids)
        try:
            yield None
            while pending:
                ours = False
                for event in self.step():
                    if event.request_id in pending:
                        ours = True
                        if event.finished is not None:
                            pending.discard(event.request_id)
                        yield event
                if not ours:
                    # One of them may have ended outside this loop (`cancel(id)` gives its
                    # final event to that caller): it sends nothing more, and waiting for it
                    # stepped an idle engine forever. Looked for only in a step that sent
                    # none of theirs, so a step of running requests pays nothing for it.
                    pending = {r for r in pending if r in self._live}
        finally:
            for request_id in pending:
                self.cancel(request_id)

    def _add_all(
        self, prompts: Iterable[Prompt], params: SamplingParams | None, stream_text: bool = True
    ) -> list[RequestId]:
        """Add all prompts (each `params.n` times) or none: a prompt that can never run cancels
        the ones before it. A str is one prompt, as in vLLM's `generate`: iterated, it would be
        a prompt per character."""
        if isinstance(prompts, str):
            prompts = [prompts]
        ids: list[RequestId] = []
        try:
            for prompt in prompts:
                ids.extend(self.add_choices(prompt, params, stream_text=stream_text))
        except BaseException:  # any error (a chat template's too) or Ctrl-C: none stays queued
            for request_id in ids:
                self.cancel(request_id)
            raise
        if not ids:
            raise EngineError("no prompts given")
        return ids
