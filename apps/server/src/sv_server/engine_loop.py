"""One thread owns the Engine; HTTP handlers talk to it only through queues.

The Engine is single-threaded. A dedicated thread runs the step loop:

    commands = take every queued command (block only when the engine has nothing to do)
    apply them: submit -> engine.add_request, cancel -> engine.cancel
    events = engine.step()                  # a token for each running request (more when speculating)
    stop strings: cut each request's text, cancel a request whose text holds one
    hand this iteration's deliveries to the event loop      # one call_soon_threadsafe

Handlers (on the asyncio event loop) call `submit` / `cancel`, which only put a command on a
thread-safe queue, and read their request's deliveries from its own asyncio.Queue. Commands are
applied between steps, so a cancel frees the request's pages before the next step runs. When no
request is in flight the thread sleeps in `queue.get()`: no busy-waiting.

Stop strings are matched here, on the engine thread, as each step's events come (a request's
`stops`, stops.py): a request whose text completes one is cancelled in the engine before the
next step runs, as vLLM's engine ends it in the step that found it, so no token past it is
generated, delivered or counted; its client gets the text before it and a finish "stop".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sv_engine import Engine, EngineError, SamplingParams, StreamEvent
from sv_scheduler import AdmissionError, RequestId, SchedulerStats

from sv_server.engine_view import VIEW_INTERVAL_S, engine_view
from sv_server.errors import ServerError
from sv_server.stops import StopStringMatcher

log = logging.getLogger("sv_server")


# --- what a handler receives on its request's queue -------------------------------------------


@dataclass(frozen=True)
class Accepted:
    """The engine queued the request."""


_ENGINE_REQUEST = re.compile(r"^request \S+ rejected: ")


@dataclass(frozen=True)
class Rejected:
    """The engine refused the request: it could never run (the message says why, and
    `param` names the request field at fault, when one is)."""

    message: str
    param: str | None = None


@dataclass(frozen=True)
class Token:
    """One engine event (a token, and/or the end of the request), stamped when its step ended.

    `own_chars`: where the stop strings changed `event.text` (held text back that may begin
    one, released text held before, or cut the text at one), the characters of the token's
    own text as the engine decoded it; None: `event.text` is the token's own. Log-probabilities
    sit at their token's own place in the text (completions' text_offset, a Responses
    message's deltas), not where the stop strings let its text out."""

    event: StreamEvent
    at: float
    own_chars: int | None = None


@dataclass(frozen=True)
class Failed:
    """The request died with the engine step it was in (500), or the server is stopping (503).
    `ran`: the engine had accepted it (its metrics count it as finished, reason "abort")."""

    message: str
    status: int = 500
    ran: bool = False

    def error(self) -> ServerError:
        code = "shutting_down" if self.status == 503 else None
        return ServerError(
            self.message, status=self.status, type="server_error", code=code, counted=self.ran
        )


Delivery = Accepted | Rejected | Token | Failed


class RequestHandle:
    """A handler's end of one request. Create it on the event loop thread (it owns a Queue)."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        continuation: bool = False,
        arrived_at: float | None = None,
        stops: StopStringMatcher | None = None,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.continuation = continuation  # a completion's text continues its prompt's
        # Its stop strings, matched on the engine thread (used there only, once submitted).
        self.stops = stops if stops is not None and stops.stops else None
        self.output_tokens = 0  # the engine thread's count, for the stops' min_tokens
        self.deliveries: asyncio.Queue[Delivery] = asyncio.Queue()
        # When its HTTP request came (its handler's start), for TTFT and latency
        self.arrived_at = time.perf_counter() if arrived_at is None else arrived_at
        self.request_id: RequestId | None = None  # written by the engine thread only
        self.last_token_at: float | None = None  # written by delivery observers (event loop)


@dataclass(frozen=True)
class _Submit:
    handle: RequestHandle


@dataclass(frozen=True)
class _Cancel:
    handle: RequestHandle


@dataclass(frozen=True)
class _Stop:
    pass


@dataclass(frozen=True)
class _Refresh:
    """Take a fresh snapshot now (a dashboard opened while the engine is idle)."""


@dataclass(frozen=True)
class LoopSnapshot:
    """The scheduler's state after the engine thread's latest iteration (read from any thread:
    it is replaced whole, never changed)."""

    waiting: int = 0
    running: int = 0
    stats: SchedulerStats | None = None
    failed_steps: int = 0
    view: dict[str, Any] | None = None  # engine_view, while the dashboard is watched


Batch = list[tuple[RequestHandle, Delivery]]


class EngineLoop:
    """The engine thread, and the queues that are the only way to it.

    observer: called on the event loop with each iteration's deliveries, before they reach the
    handlers (metrics count tokens there, so requests whose client has gone are counted too).
    """

    def __init__(self, engine: Engine, observer: Callable[[Batch], None] | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self.last_error: str | None = None  # the latest failed step, for /health
        self._commands: queue.SimpleQueue[_Submit | _Cancel | _Stop | _Refresh] = (
            queue.SimpleQueue()
        )
        self._pending_lock = threading.Lock()
        self._pending_submits = 0  # submitted, not yet counted in the snapshot's `waiting`
        self._seen_submits = 0  # taken by the engine thread since the last snapshot
        self._live: dict[RequestId, RequestHandle] = {}  # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._failed_steps = 0
        # Dashboards watching (written on the event loop): the snapshot then carries a view.
        self.watchers = 0
        self._view_at = 0.0
        self.snapshot = self._take_snapshot()

    # --- the event loop's side ------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; deliveries go to handles on `loop`."""
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="sv-engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel every request (their handlers get Failed) and end the thread."""
        if self._thread is None:
            return
        self.request_stop()
        self._thread.join(timeout)
        self._thread = None

    def request_stop(self) -> None:
        """Have the engine thread cancel every request and end, once its current step is over
        (`is_alive` turns false then); does not wait."""
        self._commands.put(_Stop())

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, handle: RequestHandle) -> None:
        with self._pending_lock:
            self._pending_submits += 1
        self._commands.put(_Submit(handle))

    def cancel(self, handle: RequestHandle) -> None:
        """Cancel the request if it is still in flight (safe to call more than once)."""
        self._commands.put(_Cancel(handle))

    def refresh(self) -> None:
        """Have the engine thread take a snapshot now, even while it is idle."""
        self._commands.put(_Refresh())

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished (waiting or running)."""
        return self.queue_depth + self.snapshot.running

    @property
    def queue_depth(self) -> int:
        """Requests waiting to start: submitted but not yet seen, plus the scheduler's queue."""
        return self.observed()[1]

    def observed(self) -> tuple[LoopSnapshot, int]:
        """The latest snapshot and `queue_depth`, read together. A request submitted during
        a long step is counted as waiting at once, not only when the step has ended."""
        with self._pending_lock:
            return self.snapshot, self._pending_submits + self.snapshot.waiting

    # --- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch: Batch = []
            for command in self._next_commands():
                if isinstance(command, _Stop):
                    self._fail_all("the server is shutting down", batch, status=503)
                    self._finish_iteration(batch)
                    return
                if isinstance(command, _Submit):
                    self._add(command.handle, batch)
                elif isinstance(command, _Cancel):
                    self._cancel(command.handle, batch)
            if self.engine.has_unfinished():
                self._step(batch)
            self._finish_iteration(batch)

    def _next_commands(self) -> list[_Submit | _Cancel | _Stop | _Refresh]:
        commands = []
        if not self.engine.has_unfinished():
            commands.append(self._commands.get())  # idle: sleep until a command comes
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _add(self, handle: RequestHandle, batch: Batch) -> None:
        self._seen_submits += 1
        try:
            request_id = self.engine.add_request(
                handle.prompt_ids, handle.params, continuation=handle.continuation
            )
        except (EngineError, AdmissionError) as e:
            # The engine's request number means nothing to the client: its answer leaves it out.
            field = e.field if isinstance(e, EngineError) else None
            param = {"max_new_tokens": "max_tokens"}.get(field or "", field)  # the API's name
            batch.append((handle, Rejected(_ENGINE_REQUEST.sub("", str(e)), param)))
            return
        except Exception as e:  # a bug, not the client's fault: the handler answers 500
            log.exception("add_request failed")
            batch.append((handle, Failed(f"the engine failed to queue the request: {e}")))
            return
        handle.request_id = request_id
        self._live[request_id] = handle
        batch.append((handle, Accepted()))

    def _cancel(self, handle: RequestHandle, batch: Batch) -> None:
        request_id = handle.request_id
        if request_id is None or self._live.pop(request_id, None) is None:
            return  # never queued, already finished, or already cancelled
        event = self.engine.cancel(request_id)
        if event is not None:
            batch.append((handle, Token(event, time.perf_counter())))

    def _step(self, batch: Batch) -> None:
        try:
            events = self.engine.step()
        except Exception as e:
            # The engine's state may be inconsistent now: end every request in flight with an
            # error (500) rather than leave its client hanging, and free what can be freed.
            log.exception("engine step failed")
            self.last_error = f"{type(e).__name__}: {e}"
            self._failed_steps += 1
            self._fail_all(f"the engine step failed: {self.last_error}", batch)
            return
        now = time.perf_counter()
        for event in events:
            handle = (
                self._live.pop(event.request_id, None)
                if event.finished is not None
                else self._live.get(event.request_id)
            )
            if handle is None:
                continue  # (finished or cancelled: a later event of a verified draft)
            if handle.stops is None:
                batch.append((handle, Token(event, now)))
            else:
                self._stop_strings(handle, handle.stops, event, now, batch)

    def _stop_strings(
        self,
        handle: RequestHandle,
        stops: StopStringMatcher,
        event: StreamEvent,
        now: float,
        batch: Batch,
    ) -> None:
        """Deliver `event` through its request's stop strings: text that may begin one is
        held back; the token that completes one comes cut at it, then a finish "stop", and
        the request is cancelled before the next step (its pages go back then)."""
        if event.token_id is not None:
            handle.output_tokens += 1
        text = stops.push(event.text, handle.output_tokens)
        if not stops.stopped:
            if event.finished is not None:
                text += stops.flush()
            if text == event.text:  # (most tokens' text passes as it is: no copy for them)
                batch.append((handle, Token(event, now)))
            else:
                batch.append((handle, Token(replace(event, text=text), now, len(event.text))))
            return
        # The token is the client's (counted, scored), its text cut; the finish is "stop".
        cut = replace(event, text=text, finished=None, completion=None)
        batch.append((handle, Token(cut, now, len(event.text))))
        completion = event.completion
        if event.finished is None:  # (else the engine has ended it already: "length")
            self._live.pop(event.request_id, None)
            cancelled = self.engine.cancel(event.request_id)  # (its event is no one's)
            completion = None if cancelled is None else cancelled.completion
        # (the completion, for its prompt's cached tokens: a Responses answer's usage)
        last = StreamEvent(event.request_id, None, "", "stop", completion=completion)
        batch.append((handle, Token(last, now)))

    def _fail_all(self, message: str, batch: Batch, status: int = 500) -> None:
        for handle in self._live.values():
            batch.append((handle, Failed(message, status, ran=True)))
        self._live.clear()
        try:
            self.engine.cancel_all()
        except Exception:
            log.exception("cancelling every request failed")

    def _finish_iteration(self, batch: Batch) -> None:
        # One lock for both, so queue_depth never sees a request in neither count nor in both.
        snapshot = self._take_snapshot()
        with self._pending_lock:
            self._pending_submits -= self._seen_submits
            self.snapshot = snapshot
        self._seen_submits = 0
        if batch and self._loop is not None:
            # RuntimeError: the event loop is closed, nobody is listening any more
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._deliver, batch)

    def _take_snapshot(self) -> LoopSnapshot:
        scheduler = self.engine.scheduler
        return LoopSnapshot(
            waiting=scheduler.num_waiting,
            running=scheduler.num_running,
            stats=self.engine.stats,
            failed_steps=self._failed_steps,
            view=self._view(),
        )

    def _view(self) -> dict[str, Any] | None:
        """The dashboard's view: fresh every VIEW_INTERVAL_S, and always before going idle
        (so an idle engine never shows a stale picture); None while nobody watches."""
        if not self.watchers:
            return None
        now = time.perf_counter()
        previous = self.snapshot  # set: watchers is 0 while __init__ takes the first one
        if (
            previous.view is not None
            and self.engine.has_unfinished()
            and now - self._view_at < VIEW_INTERVAL_S
        ):
            return previous.view
        self._view_at = now
        return engine_view(self.engine)

    # --- back on the event loop -----------------------------------------------------------------

    def _deliver(self, batch: Batch) -> None:
        if self.observer is not None:
            try:
                self.observer(batch)
            except Exception:
                log.exception("delivery observer failed")
        for handle, delivery in batch:
            handle.deliveries.put_nowait(delivery)
