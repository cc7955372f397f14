"""The reader's checks of a trace, line by line: every field the report reads, with the type and
range schema.json gives it, and the facts between lines the report relies on (page ids inside
the header's pool, request ids that were queued, steps in order).

By hand rather than with jsonschema: that is a test dependency only (the GPU machine's image
lacks it), and a failure here names the file, the line and the field, as `sv trace report`
prints it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

from sv_trace.errors import TraceError

# What a value must be: its description in an error message, and the test.
Kind = tuple[str, Callable[[Any], bool]]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no number


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)  # NaN fails every range test below


def _is_ms(value: Any) -> bool:
    return _is_number(value) and 0 <= value < math.inf


def _one_of(*names: str) -> Kind:
    return "one of " + ", ".join(names), lambda v: isinstance(v, str) and v in names


COUNT: Kind = ("an integer >= 0", lambda v: _is_int(v) and v >= 0)
POSITIVE: Kind = ("an integer >= 1", lambda v: _is_int(v) and v >= 1)
# The report draws a cell per page (web/pool.js): past this a pool is not a real one (4M pages
# of 16 tokens is 64M tokens of KV) and its page would not draw.
MAX_POOL_PAGES = 1 << 22
POOL_PAGES: Kind = (
    f"an integer from 1 to {MAX_POOL_PAGES:,}",
    lambda v: _is_int(v) and 1 <= v <= MAX_POOL_PAGES,
)
MS: Kind = ("a finite number >= 0", _is_ms)
MS_OR_NULL: Kind = ("a finite number >= 0 or null", lambda v: v is None or _is_ms(v))
# -Infinity is real: the top 5 of a row whose grammar mask allowed fewer tokens.
LOGPROB: Kind = ("a number <= 0", lambda v: _is_number(v) and v <= 0)
TEXT: Kind = ("a string", lambda v: isinstance(v, str))
FLAG: Kind = ("true or false", lambda v: isinstance(v, bool))
OBJECT: Kind = ("an object", lambda v: isinstance(v, dict))
OBJECT_OR_NULL: Kind = ("an object or null", lambda v: v is None or isinstance(v, dict))
ARRAY: Kind = ("an array", lambda v: isinstance(v, list))
REQUEST_ID: Kind = ("an integer or a string", lambda v: _is_int(v) or isinstance(v, str))
CLOCK = _one_of("cuda", "wall")
WAIT_REASON = _one_of(
    "credits", "pages", "static_group", "max_num_seqs", "token_budget", "shared_prefix"
)
FINISH_REASON = _one_of("stop", "length", "cancelled")
# The --stats figures the report shows (the end line holds every SchedulerStats figure).
SHOWN_STATS = (
    "pool_pages", "peak_running", "largest_decode_batch", "peak_assigned_pages",
    "admission_waits", "prefix_cache_hit_tokens", "preemptions", "recomputed_tokens",
    "free_pages",
)  # fmt: skip
# Shown when a speculating engine wrote them (they are counts wherever present).
SPECULATION_STATS = ("drafted_tokens", "accepted_tokens", "verifications")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


class TraceChecker:
    """Checks the records of one trace in file order, the header first; raises TraceError
    naming FILE:LINE, the line's type and the field (`pool.tables[0].pages[2]`)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._where = name
        self._num_pages = 0  # the header's pool
        self._queued: set[int | str] = set()
        self._last_step: int | None = None

    def check(self, number: int, record: dict[str, Any]) -> None:
        kind = record["type"]
        self._where = f"{self._name}:{number}: {kind} line"
        if kind == "header":
            self._header(record)
        elif kind == "request":
            self._request(record)
        elif kind == "step":
            self._step(record)
        elif kind == "cancel":
            self._get(record, "at_ms", "", MS)
            # Before the first step it may cancel a request queued before the trace started.
            self._request_id(record, "request", "", known=self._last_step is not None)
            if "reason" in record:  # (absent: cancelled)
                self._get(record, "reason", "", _one_of("error"))
        elif kind == "end":
            self._get(record, "at_ms", "", MS)
            stats = self._get(record, "stats", "", OBJECT)
            for name in SHOWN_STATS:
                self._get(stats, name, "stats.", COUNT)
            for name in SPECULATION_STATS:
                if name in stats:
                    self._get(stats, name, "stats.", COUNT)
            self._pool(record, known=True)
        else:
            self._fail("type", f"is {_shown(kind)}, expected one of request, step, cancel, end")

    # --- lines --------------------------------------------------------------------------------

    def _header(self, record: dict[str, Any]) -> None:
        if self._num_pages:
            self._fail("type", 'is "header", but the header is the first line only')
        self._num_pages = self._get(record, "num_pages", "", POOL_PAGES)
        self._get(record, "page_size", "", POSITIVE)
        self._get(record, "policy", "", _one_of("continuous", "static"))
        self._get(record, "admission", "", _one_of("conservative", "preemptive"))
        self._get(record, "created", "", TEXT)
        for name in ("model", "device"):
            if name in record:
                self._get(record, name, "", TEXT)

    def _request(self, record: dict[str, Any]) -> None:
        rid = self._get(record, "request", "", REQUEST_ID)
        if rid in self._queued:
            self._fail("request", f"is {_shown(rid)}, a request already queued")
        self._queued.add(rid)
        self._get(record, "at_ms", "", MS)
        if not self._items(record, "prompt_ids", "", COUNT):
            self._fail("prompt_ids", "is empty")
        self._get(record, "prompt_text", "", TEXT)
        self._get(record, "max_new_tokens", "", POSITIVE)

    def _step(self, record: dict[str, Any]) -> None:
        step = self._get(record, "step", "", COUNT)
        if self._last_step is not None and step <= self._last_step:
            self._fail("step", f"is {step}, but the step before it was {self._last_step}")
        # A request queued before the trace started has no request line: at the first step it
        # is running (its block table is in the pool) or waiting.
        first = self._last_step is None
        self._last_step = step
        self._pool(record, known=not first)
        self._ids(record, "waiting", known=not first)
        self._ids(record, "preempted")
        self._get(record, "at_ms", "", MS)
        self._get(record, "num_tokens", "", POSITIVE)
        for at, chunk in self._objects(record, "prefills", ""):
            self._request_id(chunk, "request", at)
            self._get(chunk, "start", at, COUNT)
            self._get(chunk, "end", at, POSITIVE)
            self._get(chunk, "samples", at, FLAG)
        for at, decode in self._objects(record, "decodes", ""):
            self._request_id(decode, "request", at)
            self._get(decode, "position", at, COUNT)
        for at, admitted in self._objects(record, "admitted", ""):
            self._request_id(admitted, "request", at)
            self._get(admitted, "cached_tokens", at, COUNT)
            self._get(admitted, "resumed", at, FLAG)
        wait = self._get(record, "wait", "", OBJECT_OR_NULL)
        if wait is not None:
            self._request_id(wait, "request", "wait.")
            self._get(wait, "reason", "wait.", WAIT_REASON)
            self._get(wait, "counted", "wait.", FLAG)
        for at, change in self._objects(record, "pages", ""):
            self._request_id(change, "request", at)
            self._pages(change, "assigned", at)
            self._pages(change, "shared", at)
        for at, freed in self._objects(record, "freed", ""):
            self._request_id(freed, "request", at)
            self._pages(freed, "pages", at)
        for at, row in self._objects(record, "sampled", ""):
            self._request_id(row, "request", at)
            self._get(row, "token", at, COUNT)
            self._get(row, "text", at, TEXT)
            self._get(row, "dropped", at, FLAG)
            if "logprob" in row:
                self._get(row, "logprob", at, LOGPROB)
            for top_at, top in self._objects(row, "top", at) if "top" in row else []:
                self._get(top, "token", top_at, COUNT)
                self._get(top, "logprob", top_at, LOGPROB)
                self._get(top, "text", top_at, TEXT)
        for at, finished in self._objects(record, "finished", ""):
            self._request_id(finished, "request", at)
            self._get(finished, "reason", at, FINISH_REASON)
        timing = self._get(record, "timing", "", OBJECT)
        self._get(timing, "clock", "timing.", CLOCK)
        self._get(timing, "host_ms", "timing.", MS_OR_NULL)
        self._get(timing, "span_ms", "timing.", MS)
        self._get(timing, "device_ms", "timing.", MS_OR_NULL)

    def _pool(self, record: dict[str, Any], *, known: bool) -> None:
        pool = self._get(record, "pool", "", OBJECT)
        num_pages = self._get(pool, "num_pages", "pool.", POSITIVE)
        if num_pages != self._num_pages:
            problem = f"is {num_pages}, but the header's pool has {self._num_pages} pages"
            self._fail("pool.num_pages", problem)
        counts = [self._get(pool, name, "pool.", COUNT) for name in ("free", "cached", "assigned")]
        if sum(counts) != num_pages:
            self._fail("pool", f"free + cached + assigned is {sum(counts)}, not {num_pages} pages")
        self._pages(pool, "cached_pages", "pool.")
        for at, table in self._objects(pool, "tables", "pool."):
            self._request_id(table, "request", at, known=known)
            self._get(table, "row", at, COUNT)
            self._pages(table, "pages", at)
            if "released" in table:  # (a sliding window's pages given back before these)
                self._get(table, "released", at, COUNT)

    # --- fields: `at` is the path of the object that holds them (`pool.tables[0].`) ------------

    def _fail(self, field: str, problem: str) -> NoReturn:
        raise TraceError(f"{self._where}: '{field}' {problem}")

    def _get(self, obj: Any, key: str | int, at: str, kind: Kind) -> Any:
        """obj[key] (an object's field or an array's item), which must be of `kind`."""
        if isinstance(obj, dict) and key not in obj:
            self._fail(_path(at, key), "is missing")
        value = obj[key]
        expected, test = kind
        if not test(value):
            self._fail(_path(at, key), f"is {_shown(value)}, expected {expected}")
        return value

    def _items(self, obj: dict[str, Any], key: str, at: str, kind: Kind) -> list[Any]:
        items: list[Any] = self._get(obj, key, at, ARRAY)
        for index in range(len(items)):
            self._get(items, index, at + key, kind)
        return items

    def _objects(self, obj: dict[str, Any], key: str, at: str) -> list[tuple[str, Any]]:
        """The objects of the array obj[key], each with its path."""
        items = self._items(obj, key, at, OBJECT)
        return [(f"{at}{key}[{index}].", item) for index, item in enumerate(items)]

    def _pages(self, obj: dict[str, Any], key: str, at: str) -> None:
        for index, page in enumerate(self._items(obj, key, at, COUNT)):
            if page >= self._num_pages:
                problem = f"is {page}, not a page of the {self._num_pages}-page pool"
                self._fail(_path(at + key, index), problem)

    def _ids(self, obj: dict[str, Any], key: str, *, known: bool = True) -> None:
        for index in range(len(self._get(obj, key, "", ARRAY))):
            self._request_id(obj[key], index, key, known=known)

    def _request_id(self, obj: Any, key: str | int, at: str, *, known: bool = True) -> None:
        """A request id, which must have been queued unless not `known` yet (then it is now)."""
        rid = self._get(obj, key, at, REQUEST_ID)
        if known and rid not in self._queued:
            self._fail(_path(at, key), f"is {_shown(rid)}, a request the trace never queued")
        self._queued.add(rid)


def _path(at: str, key: str | int) -> str:
    return f"{at}[{key}]" if isinstance(key, int) else at + key
