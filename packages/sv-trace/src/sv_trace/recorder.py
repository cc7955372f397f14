"""`--trace FILE`: one JSON line per event of the engine, one per step above all.

The engine calls the recorder from a few hooks (`Engine.tracer`; the runner's
`logits_observer`), always on its own thread:

    queued(request)          add_request: a "request" line (its prompt, its limits)
    planned(plan)            after schedule(): the plan, admissions, the head's wait and its
                             reason, preemptions, every running block table, the pool's counts
    (logits observer)        inside launch: top-5 logprobs of the rows that sample (a verify
                             step's draft positions included)
    launched(plan)           after launch: host time of the step
    resolved(plan, events)   after the tokens are back: the sampled tokens with their logprobs
                             (a verified draft's kept run too), the finished requests; the
                             "step" line is written now
    cancelled(request)       a "cancel" line
    close(stats)             an "end" line with the --stats figures

With the overlapped loop step i+1 is planned before step i is resolved, so the recorder keeps
at most two steps open; lines are written in step order. The format is `schema.json` (version
`SCHEMA_VERSION`), described in this package's README.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from sv_scheduler import COUNTED_WAITS, RequestId, Scheduler, SchedulerStats, StepPlan
from sv_tokenizer import Tokenizer
from torch import Tensor

from sv_trace.errors import TraceError
from sv_trace.logprobs import StepLogprobs, step_logprobs
from sv_trace.pool import pool_picture
from sv_trace.schema import SCHEMA_NAME, SCHEMA_VERSION
from sv_trace.timing import StepClock

_log = logging.getLogger(__name__)


def _tables(
    scheduler: Scheduler, picture: dict[str, Any]
) -> tuple[dict[RequestId, list[int]], dict[RequestId, list[int]]]:
    """Per running request: its whole block table, the entries a sliding window gave back
    included (positions line up with an earlier plan's), and the pages it holds (the pool
    picture's `tables`, which list only those)."""
    held, holding = {}, {}
    for seq, table in zip(scheduler.running(), picture["tables"], strict=True):
        held[seq.request_id] = list(seq.table.pages)
        holding[seq.request_id] = table["pages"]
    return held, holding


class TracedEvent(Protocol):
    """What the recorder reads of an engine event (sv_engine.StreamEvent)."""

    @property
    def request_id(self) -> RequestId: ...
    @property
    def token_id(self) -> int | None: ...
    @property
    def finished(self) -> str | None: ...


class _OpenStep:
    __slots__ = ("clock", "logprobs", "record")

    def __init__(self, record: dict[str, Any], clock: StepClock) -> None:
        self.record = record
        self.clock = clock
        self.logprobs: StepLogprobs | None = None


class StepRecorder:
    """Writes the trace of one engine to `out` (a text file it owns once given)."""

    def __init__(
        self,
        out: TextIO,
        scheduler: Scheduler,
        tokenizer: Tokenizer,
        *,
        cuda: bool,
        header: dict[str, Any] | None = None,
    ) -> None:
        self._out = out
        self._scheduler = scheduler
        self._tokenizer = tokenizer
        self._cuda = cuda
        self._t0 = time.perf_counter()
        self._open: dict[int, _OpenStep] = {}
        self._current: _OpenStep | None = None  # planned, its logits not seen yet
        # Per request at the last plan: its block table, and the pages it held (`_tables`). A
        # trace started on a busy engine: the requests running now were admitted before it, with
        # these pages (not at its first step, nor are their pages new there).
        self._held, self._holding = _tables(scheduler, pool_picture(scheduler))
        self._texts: dict[int, str] = {}
        self._closed = False
        self._started = False  # the header is written: a later failed write stops the trace
        self._failure: OSError | None = None  # that write's error, for close() to raise
        config = scheduler.config
        self._write(
            {
                "type": "header",
                "format": SCHEMA_NAME,
                "version": SCHEMA_VERSION,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "num_pages": config.num_pages,
                "page_size": config.page_size,
                "max_num_seqs": config.max_num_seqs,
                "max_step_tokens": config.max_step_tokens,
                "max_model_len": config.max_model_len,
                "policy": config.policy,
                "admission": config.admission,
                "prefix_caching": config.prefix_caching,
                "clock": "cuda" if cuda else "wall",
                **(header or {}),
            }
        )
        self._started = True

    @classmethod
    def open(
        cls,
        path: str | Path,
        scheduler: Scheduler,
        tokenizer: Tokenizer,
        *,
        cuda: bool,
        header: dict[str, Any] | None = None,
    ) -> StepRecorder:
        try:
            out = Path(path).open("w", encoding="utf-8")  # noqa: SIM115 (the recorder closes it)
        except OSError as e:
            raise TraceError(f"cannot write the trace file {str(path)!r}: {e.strerror}") from None
        return cls(out, scheduler, tokenizer, cuda=cuda, header=header)

    # --- hooks ------------------------------------------------------------------------------------

    def queued(self, request_id: RequestId, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        self._write(
            {
                "type": "request",
                "request": request_id,
                "at_ms": self._now_ms(),
                "prompt_ids": list(prompt_ids),
                "prompt_text": self._tokenizer.decode(prompt_ids),
                "max_new_tokens": max_new_tokens,
            }
        )

    def planned(self, plan: StepPlan) -> None:
        clock = StepClock(self._cuda)
        scheduler = self._scheduler
        picture = pool_picture(scheduler)
        admitted = []
        changes = []
        freed = []
        held, holding = _tables(scheduler, picture)
        for seq in scheduler.running():
            rid = seq.request_id
            pages = held[rid]
            before = self._held.get(rid)
            if before is not None and pages[: len(before)] != before:
                # preempted and admitted again within this one plan: a new block table
                freed.append({"request": rid, "pages": self._holding[rid]})
                before = None
            if before is None:
                cached = seq.num_cached_tokens
                shared = pages[: cached // scheduler.config.page_size]
                resumed = seq.num_preemptions > 0
                admitted.append({"request": rid, "cached_tokens": cached, "resumed": resumed})
                changes.append({"request": rid, "assigned": pages[len(shared) :], "shared": shared})
            elif len(pages) > len(before):
                changes.append({"request": rid, "assigned": pages[len(before) :], "shared": []})
        freed += [
            {"request": rid, "pages": pages}
            for rid, pages in self._holding.items()
            if rid not in held
        ]
        self._held, self._holding = held, holding
        wait = None
        if plan.head_wait is not None:
            head, reason = plan.head_wait
            wait = {
                "request": head.request_id,
                "reason": reason,
                "counted": reason in COUNTED_WAITS,
            }
        record: dict[str, Any] = {
            "type": "step",
            "step": plan.step,
            "at_ms": self._now_ms(),
            "prefills": [
                {"request": c.seq.request_id, "start": c.start, "end": c.end, "samples": c.samples}
                for c in plan.prefills
            ],
            "decodes": [
                {"request": s.request_id, "position": s.num_tokens - 1} for s in plan.decodes
            ],
            "num_tokens": plan.num_tokens,
            "admitted": admitted,
            "wait": wait,
            "waiting": [s.request_id for s in scheduler.waiting()],
            "preempted": [s.request_id for s in plan.preempted],
            "pages": changes,
            "freed": freed,
            "pool": picture,
        }
        step = _OpenStep(record, clock)
        self._open[plan.step] = step
        self._current = step

    def on_logits(self, logits: Tensor, ids: Tensor) -> None:
        """The runner's logits observer: the rows that sample this step, and their ids."""
        if self._current is not None:
            self._current.logprobs = step_logprobs(logits, ids)
            self._current = None

    def launched(self, plan: StepPlan) -> None:
        self._current = None
        step = self._open.get(plan.step)
        if step is not None:
            step.clock.launched()

    def resolved(
        self,
        plan: StepPlan,
        tokens: Sequence[int],
        events: Sequence[TracedEvent],
        kept_runs: Mapping[RequestId, Sequence[tuple[int, int]]] | None = None,
    ) -> None:
        """`kept_runs`: request id -> (token, its choice's row) for each token a verified
        draft kept, its first choice included (see sv_engine.draft_choices.kept_runs)."""
        step = self._open.pop(plan.step, None)
        if step is None:
            return
        delivered = {e.request_id for e in events if e.token_id is not None}
        finished = [
            {"request": e.request_id, "reason": e.finished}
            for e in events
            if e.finished is not None
        ]
        rows = step.logprobs.rows() if step.logprobs is not None else None
        sampled = []
        # Each sequence's tokens of the step: its one choice, or a verified draft's kept run.
        for i, (seq, token) in enumerate(zip(plan.sampling, tokens, strict=False)):
            dropped = seq.request_id not in delivered
            run = kept_runs.get(seq.request_id) if kept_runs else None
            for kept, row in run or [(token, i)]:
                entry: dict[str, Any] = {
                    "request": seq.request_id,
                    "token": kept,
                    "text": self._token_text(kept),
                    "dropped": dropped,
                }
                if rows is not None:
                    chosen, top = rows[row]
                    entry["logprob"] = chosen
                    entry["top"] = [
                        {"token": t, "logprob": lp, "text": self._token_text(t)} for t, lp in top
                    ]
                sampled.append(entry)
        record = step.record
        record["sampled"] = sampled
        record["finished"] = finished
        record["timing"] = step.clock.result()
        self._write(record)

    def abandoned(self) -> None:
        """A step failed and the engine dropped the steps in flight: they will never resolve,
        so their records are dropped too (kept, each failure would hold one or two for good).
        The requests' cancel lines follow, and the next plan lists their pages as freed."""
        self._open.clear()
        self._current = None

    def cancelled(self, request_id: RequestId, reason: str = "cancelled") -> None:
        """Ended between steps: cancelled, or (`reason` "error") its grammar failed."""
        record: dict[str, Any] = {"type": "cancel", "request": request_id, "at_ms": self._now_ms()}
        if reason != "cancelled":
            record["reason"] = reason
        self._write(record)

    def close(self, stats: SchedulerStats) -> None:
        """Write the "end" line (the --stats figures and the pool as it is left) and close.
        A write that failed earlier is raised here (the trace ended there)."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        if self._closed:
            return
        self._closed = True
        self._write(
            {
                "type": "end",
                "at_ms": self._now_ms(),
                "stats": dataclasses.asdict(stats),
                "pool": pool_picture(self._scheduler),
            }
        )
        self._out.close()

    # --- internals --------------------------------------------------------------------------------

    def _now_ms(self) -> float:
        return round((time.perf_counter() - self._t0) * 1e3, 3)

    def _token_text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._tokenizer.shown_bytes(token).decode("utf-8", "replace")
            self._texts[token] = text
        return text

    def _write(self, record: dict[str, Any]) -> None:
        if self._closed and record.get("type") != "end":
            return
        # One line per record, flushed: a trace of a server that is killed is still readable.
        try:
            self._out.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._out.flush()
        except OSError as e:  # a full disk: an OSError still (the apps' write failures), named
            name = getattr(self._out, "name", "")
            error = OSError(f"cannot write the trace file {name!r}: {e.strerror or e}")
            if not self._started or record.get("type") == "end":
                raise error from e
            # Mid-run, the engine goes on untraced: raising here would fail the step, and with
            # it every request in flight (in `sv serve`, every request after it too). The
            # error is logged now and raised by close(), so the trace's end still fails.
            self._closed = True
            self._failure = error
            with contextlib.suppress(OSError):
                self._out.close()
            _log.error("%s; the trace stops here, the requests go on", error)
