"""/metrics: the server's counters in Prometheus' text format (version 0.0.4).

Gauges come from the engine thread's latest snapshot; counters and latency histograms are
updated on the event loop as deliveries arrive (one thread writes them, the same one renders
them, so no lock is needed).

    time to first token:  request arrival at the server -> end of the step that sampled it
    inter-token latency:  between consecutive tokens of one request
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence

from sv_server.engine_loop import Batch, Failed, LoopSnapshot, Token

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Histogram:
    """Cumulative buckets as Prometheus wants them: bucket i counts observations <= bounds[i]."""

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be strictly increasing")
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # the last is (bounds[-1], +Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le label, count of observations <= le), ending with +Inf."""
        rows, total = [], 0
        for bound, n in zip((*map(_number, self.bounds), "+Inf"), self._counts, strict=True):
            total += n
            rows.append((bound, total))
        return rows


class Metrics:
    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)
        self.latency = Histogram(LATENCY_BUCKETS_S)
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.finished: Counter[str] = Counter()  # finish reason -> requests
        self.rejected: Counter[str] = Counter()  # why the server refused -> requests

    def observe(self, batch: Batch) -> None:
        """The EngineLoop's observer: count tokens and time them, per request."""
        for handle, delivery in batch:
            if isinstance(delivery, Failed) and delivery.ran:
                self.finished["abort"] += 1  # (streamed or not: its error reaches the client)
                continue
            if not isinstance(delivery, Token):
                continue
            event, at = delivery.event, delivery.at
            if event.token_id is not None:
                self.generation_tokens += 1
                if handle.last_token_at is None:
                    self.ttft.observe(at - handle.arrived_at)
                else:
                    self.itl.observe(at - handle.last_token_at)
                handle.last_token_at = at
            if event.finished is not None:
                self.finished[event.finished] += 1
                self.latency.observe(at - handle.arrived_at)

    def render(self, snapshot: LoopSnapshot, waiting: int) -> str:
        """The metrics text; `waiting` is `EngineLoop.observed`'s: the snapshot's waiting
        requests and those whose first step has not ended, which it has not seen."""
        out = _Writer()
        out.gauge("sv_requests_waiting", "Requests waiting to be admitted.", waiting)
        out.gauge("sv_requests_running", "Requests admitted and not finished.", snapshot.running)
        stats = snapshot.stats
        if stats is not None:
            out.gauge("sv_kv_cache_pages_capacity", "Pages in the KV-cache pool.", stats.pool_pages)
            out.gauge("sv_kv_cache_pages_used", "Pages held by requests.", stats.assigned_pages)
            out.gauge(
                "sv_kv_cache_pages_free",
                "Pages free to allocate (free or cached but unheld).",
                stats.free_pages,
            )
            out.gauge(
                "sv_kv_cache_pages_cached",
                "Free pages still holding prefix-cache KV.",
                stats.cached_pages,
            )
            out.counter(
                "sv_prefix_cache_hit_tokens_total",
                "Prompt tokens served from the prefix cache instead of computed.",
                stats.prefix_cache_hit_tokens,
            )
            out.counter(
                "sv_admission_waits_total",
                "Engine steps in which the request at the head of the queue waited for room in "
                "the KV cache (its reserved pages, or its prompt's pages, did not fit).",
                stats.admission_waits,
            )
            out.counter(
                "sv_preemptions_total",
                "Running requests sent back to the queue to free pages (preemptive admission).",
                stats.preemptions,
            )
            out.counter(
                "sv_recomputed_tokens_total",
                "Tokens whose KV a preempted request computed again on resuming.",
                stats.recomputed_tokens,
            )
            out.counter("sv_engine_steps_total", "Engine steps run.", stats.steps)
            out.counter(
                "sv_spec_draft_tokens_total",
                "Draft tokens verified (speculative decoding).",
                stats.drafted_tokens,
            )
            out.counter(
                "sv_spec_accepted_tokens_total",
                "Draft tokens the model accepted.",
                stats.accepted_tokens,
            )
            out.counter(
                "sv_spec_verifications_total",
                "Sequence-steps that verified a draft; tokens per verify step is 1 + "
                "accepted / verifications.",
                stats.verifications,
            )
        out.counter(
            "sv_engine_step_failures_total", "Engine steps that raised.", snapshot.failed_steps
        )
        out.counter(
            "sv_prompt_tokens_total", "Prompt tokens of accepted requests.", self.prompt_tokens
        )
        out.counter("sv_generation_tokens_total", "Tokens generated.", self.generation_tokens)
        out.labelled_counter(
            "sv_requests_finished_total",
            "Requests ended, by finish reason (stop: a stop token or string, as vLLM counts "
            "them; cancelled: the client went away; error: its output constraint failed; "
            "abort: an engine step failed or the server stopped while it ran).",
            "finish_reason",
            self.finished,
            ("stop", "length", "cancelled", "error", "abort"),
        )
        out.labelled_counter(
            "sv_requests_rejected_total",
            "Generation requests the server refused, by reason (unauthorized: any request "
            "refused for its API key; engine_error and shutting_down: before the engine took "
            "it).",
            "reason",
            self.rejected,
            (
                "invalid",
                "unauthorized",
                "queue_full",
                "too_many_connections",
                "engine_error",
                "shutting_down",
            ),
        )
        out.histogram(
            "sv_time_to_first_token_seconds", "Arrival to first generated token.", self.ttft
        )
        out.histogram(
            "sv_inter_token_latency_seconds", "Time between consecutive tokens.", self.itl
        )
        out.histogram(
            "sv_request_latency_seconds", "Arrival to the request's last event.", self.latency
        )
        return out.text()


def _number(value: float) -> str:
    return repr(float(value))


class _Writer:
    def __init__(self) -> None:
        self._lines: list[str] = []

    def _header(self, name: str, help_text: str, kind: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def gauge(self, name: str, help_text: str, value: float) -> None:
        self._header(name, help_text, "gauge")
        self._lines.append(f"{name} {value}")

    def counter(self, name: str, help_text: str, value: float) -> None:
        self._header(name, help_text, "counter")
        self._lines.append(f"{name} {value}")

    def labelled_counter(
        self,
        name: str,
        help_text: str,
        label: str,
        values: Counter[str],
        always: Sequence[str],
    ) -> None:
        self._header(name, help_text, "counter")
        for key in sorted(set(always) | set(values)):
            self._lines.append(f'{name}{{{label}="{key}"}} {values[key]}')

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self._header(name, help_text, "histogram")
        for le, count in histogram.cumulative():
            self._lines.append(f'{name}_bucket{{le="{le}"}} {count}')
        self._lines.append(f"{name}_sum {_number(histogram.sum)}")
        self._lines.append(f"{name}_count {histogram.count}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
