"""The report page: what it gathers from a trace, that it needs nothing from the network, and
the reader's errors (fuzzed)."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_scheduler import SchedulerConfig
from sv_tokenizer import Tokenizer
from sv_trace import TraceError, read_trace, render_report
from sv_trace.report import report_data, write_report

sys.path.insert(0, str(Path(__file__).parent))
from scripted import Scenario, prompt, run


@pytest.fixture(scope="module")
def trace(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "t.jsonl"
    scenario = Scenario(
        SchedulerConfig(num_pages=5, max_model_len=512),
        [prompt(20, 1), prompt(20, 2), prompt(20, 3)],
        [13, 13, 5],
        stop_at={2: 4},
        cancel_after={8: 1},
    )
    run(scenario, tokenizer, path)
    return path


def test_report_data_follows_each_request(trace: Path) -> None:
    data = report_data(read_trace(trace))
    by_id = {r["id"]: r for r in data["requests"]}
    assert sorted(by_id) == [1, 2, 3]
    one, two, three = by_id[1], by_id[2], by_id[3]
    assert one["admitted"] == [0] and one["prefill"] == [[0, 0, 20]]
    assert one["decode"] == list(range(1, 9)) and one["finish"] == "cancelled"
    assert two["finish"] == "stop" and two["end_step"] == 3 and len(two["tokens"]) == 4
    # request 3 waits for credits until request 2 stops (step 3), then starts at step 4
    assert [w[0] for w in three["waits"]] == [0, 1, 2, 3] and three["admitted"] == [4]
    assert {w[1] for w in three["waits"]} == {"credits"}
    assert three["queued_step"] == 0 and three["finish"] == "length"
    assert data["stats"]["admission_waits"] == 4
    assert len(data["pools"]) == len(data["steps"]) == data["stats"]["steps"]


class _Resources(HTMLParser):
    """Every attribute that could make a browser fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "action", "srcset", "poster", "data") and value:
                self.fetches.append(f"{tag} {name}={value}")


def test_the_page_is_self_contained(trace: Path) -> None:
    page = render_report(trace)
    parser = _Resources()
    parser.feed(page)
    assert parser.fetches == ["link href=data:,"]  # the empty favicon, inline
    assert not re.search(r"""url\(\s*['"]?(?!data:)""", page)  # no CSS fetch
    assert "import(" not in page and "fetch(" not in page
    # the trace's figures are inside, as JSON a script element cannot be closed by
    blob = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S)
    assert blob is not None and json.loads(blob.group(1))["source"] == "t.jsonl"


def test_text_that_looks_like_markup_stays_text(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    ids = tokenizer.encode("</script><script>alert(1)</script>")
    run(Scenario(SchedulerConfig(num_pages=8, max_model_len=512), [ids], [2]), tokenizer, path)
    page = render_report(path)
    assert "<script>alert(1)" not in page
    assert page.count("</script>") == 2  # the data block and the code, nothing from the trace


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not an sv trace"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"type":"step"}\n', "not an sv trace"),
        (
            b'{"type":"header","format":"sv-trace","version":99}\n',
            "version 99; this sv reads version 1",
        ),
        (b'{"type":"header","format":"sv-trace","version":1}\nnot json\n{}\n', ":2: not a JSON"),
        (b'{"type":"header","format":"sv-trace","version":1}\n[1]\n', ":2: a trace line"),
    ],
)
def test_bad_traces_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=re.escape(message)):
        read_trace(path)


def test_a_last_line_cut_short_is_dropped(trace: Path, tmp_path: Path) -> None:
    lines = trace.read_text(encoding="utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join([*lines[:-1], lines[-1][:10]]), encoding="utf-8")
    notes: list[str] = []
    records = read_trace(cut, notes.append)
    assert len(records) == len(lines) - 1
    assert report_data(records)["stats"] is None  # no end line: the page says so
    # ... and it is not dropped without a word (it was)
    assert notes == [
        f"{cut}:{len(lines)}: the last line is incomplete (10 bytes, not a JSON object): "
        "skipped (a trace still being written, or its writer killed)"
    ]
    notes.clear()
    read_trace(trace, notes.append)
    assert notes == []  # a whole trace: nothing to tell


def test_a_report_over_its_own_trace_is_refused(trace: Path, tmp_path: Path) -> None:
    """`-o` naming the trace itself (or a link to it) would replace the run's record with
    the page: refused, and the trace is left as it was."""
    copy = tmp_path / "t.jsonl"
    copy.write_bytes(trace.read_bytes())
    link = tmp_path / "link.jsonl"
    link.symlink_to(copy)
    for out in (copy, link):
        with pytest.raises(TraceError, match="would overwrite the trace it is drawn from"):
            write_report(copy, out)
    assert copy.read_bytes() == trace.read_bytes()


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"cannot read the trace file .*nope\.jsonl"):
        read_trace(tmp_path / "nope.jsonl")


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_any_bytes_are_a_trace_or_a_trace_error(
    trace: Path, tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "fuzz.jsonl"
    header = trace.read_bytes().splitlines(keepends=True)[0]  # a whole one: the bytes get checked
    path.write_bytes(header + content)
    try:
        records = read_trace(path)
    except TraceError:
        return
    assert records[0]["type"] == "header"
    assert all(isinstance(r["type"], str) for r in records)


DELETE = object()  # the field is removed


def changed(record: Any, path: tuple[Any, ...], value: Any) -> Any:
    """`record` with its field at `path` set to `value` (removed if DELETE), or `value` itself
    if the path is empty."""
    if not path:
        return value
    *parents, last = path
    holder = record
    for key in parents:
        holder = holder[key]
    if value is DELETE:
        del holder[last]
    else:
        holder[last] = value
    return record


def lines_of(trace: Path) -> list[Any]:
    return [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]


def written(tmp_path: Path, records: list[Any]) -> Path:
    out = tmp_path / "bad.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return out


# Lines of the fixture's trace (a 5-page pool): 1 header, 2-4 requests 1-3, 5-13 steps 0-8,
# 14 cancels request 1, 15 end.
@pytest.mark.parametrize(
    ("line", "path", "value", "message"),
    [
        (6, (), {"type": "step"}, "6: step line: 'step' is missing"),
        (6, ("timing",), DELETE, "6: step line: 'timing' is missing"),
        (6, ("pool",), None, "6: step line: 'pool' is null, expected an object"),
        (6, ("step",), "x", """6: step line: 'step' is "x", expected an integer >= 0"""),
        (6, ("step",), 0, "6: step line: 'step' is 0, but the step before it was 0"),
        (2, (), {"type": "request", "request": "x"}, "2: request line: 'at_ms' is missing"),
        (3, ("request",), 1, "3: request line: 'request' is 1, a request already queued"),
        (4, ("prompt_ids", 2), -1, "4: request line: 'prompt_ids[2]' is -1, expected an integer >= 0"),
        (1, ("num_pages",), -1, "1: header line: 'num_pages' is -1, expected an integer from 1 to 4,194,304"),
        (  # the page draws a cell per page: an array of 10**12 failed in the browser
            1, ("num_pages",), 10**12,
            "1: header line: 'num_pages' is 1000000000000, expected an integer from 1 to 4,194,304",
        ),
        (6, ("pages",), "x", """6: step line: 'pages' is "x", expected an array"""),
        (
            6, ("pool", "tables", 0, "pages", 1), 999,
            "6: step line: 'pool.tables[0].pages[1]' is 999, not a page of the 5-page pool",
        ),
        (
            9, ("pages", 0, "assigned", 0), 5,
            "9: step line: 'pages[0].assigned[0]' is 5, not a page of the 5-page pool",
        ),
        (
            6, ("pool", "free"), 2,
            "6: step line: 'pool' free + cached + assigned is 6, not 5 pages",
        ),
        (
            6, ("decodes", 0, "request"), 7,
            "6: step line: 'decodes[0].request' is 7, a request the trace never queued",
        ),
        (6, ("waiting", 0), True, "6: step line: 'waiting[0]' is true, expected an integer or a string"),
        (14, ("request",), 9, "14: cancel line: 'request' is 9, a request the trace never queued"),
        (
            6, ("sampled", 0, "top", 0, "logprob"), 0.5,
            "6: step line: 'sampled[0].top[0].logprob' is 0.5, expected a number <= 0",
        ),
        (6, ("wait", "reason"), "x", """6: step line: 'wait.reason' is "x", expected one of credits, pages, static_group, max_num_seqs, token_budget, shared_prefix"""),
        (6, ("timing", "span_ms"), -1, "6: step line: 'timing.span_ms' is -1, expected a finite number >= 0"),
        (15, ("stats", "free_pages"), DELETE, "15: end line: 'stats.free_pages' is missing"),
        (
            15, ("stats", "drafted_tokens"), "7",
            """15: end line: 'stats.drafted_tokens' is "7", expected an integer >= 0""",
        ),
        (
            6, ("type",), "header",
            """6: header line: 'type' is "header", but the header is the first line only""",
        ),
        (
            6, ("type",), "stpe",
            """6: stpe line: 'type' is "stpe", expected one of request, step, cancel, end""",
        ),
    ],
)  # fmt: skip
def test_a_bad_field_is_named_by_line_and_path(
    trace: Path, tmp_path: Path, line: int, path: tuple[Any, ...], value: Any, message: str
) -> None:
    records = lines_of(trace)
    records[line - 1] = changed(records[line - 1], path, value)
    bad = written(tmp_path, records)
    with pytest.raises(TraceError) as caught:
        read_trace(bad)
    assert str(caught.value) == f"{bad}:{message}"


def test_requests_queued_before_the_trace_started(trace: Path, tmp_path: Path) -> None:
    """A trace started on a busy engine has no request lines for the requests it found: they
    are running or waiting at its first step."""
    records = lines_of(trace)
    requests = report_data(read_trace(written(tmp_path, [records[0], *records[4:]])))["requests"]
    assert [r["id"] for r in requests] == [1, 2, 3]
    assert [r["prompt_tokens"] for r in requests] == [None, None, None]


def test_alternatives_a_grammar_masked_are_left_out(trace: Path, tmp_path: Path) -> None:
    """A masked alternative's -Infinity is valid in a trace line but not in the page's JSON
    (JSON.parse refuses it): the page leaves it out and stays strict JSON."""
    records = lines_of(trace)
    step = next(r for r in records if r["type"] == "step" and r["sampled"])
    top = step["sampled"][0]["top"]
    assert len(top) >= 2
    top[-1]["logprob"] = -math.inf
    page = render_report(written(tmp_path, records))
    blob = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S)
    assert blob is not None

    def refuse(constant: str) -> None:
        raise AssertionError(f"the page's JSON holds {constant}")

    data = json.loads(blob.group(1), parse_constant=refuse)
    (request,) = [r for r in data["requests"] if r["id"] == step["sampled"][0]["request"]]
    (token,) = [t for t in request["tokens"] if t[4] == step["step"]]
    assert [text for text, _ in token[3]] == [t["text"] for t in top[:-1]]


def test_numbers_json_cannot_write_are_null_in_the_page(trace: Path, tmp_path: Path) -> None:
    """Infinities in fields the report copies without checking (a header's extra figure) or in
    a chosen token's log-probability made the page's strict JSON fail with a traceback."""
    records = lines_of(trace)
    records[0]["max_step_tokens"] = math.inf  # (json.loads reads 1e400 as inf too)
    step = next(r for r in records if r["type"] == "step" and r["sampled"])
    step["sampled"][0]["logprob"] = -math.inf
    page = render_report(written(tmp_path, records))
    blob = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S)
    assert blob is not None
    data = json.loads(blob.group(1), parse_constant=lambda c: pytest.fail(f"the page holds {c}"))
    assert data["header"]["max_step_tokens"] is None
    (request,) = [r for r in data["requests"] if r["id"] == step["sampled"][0]["request"]]
    (token,) = [t for t in request["tokens"] if t[4] == step["step"]]
    assert token[2] is None


def test_a_line_nested_past_the_parser_is_named(trace: Path, tmp_path: Path) -> None:
    lines = trace.read_text(encoding="utf-8").splitlines()
    deep = tmp_path / "deep.jsonl"
    deep.write_text("\n".join([lines[0], "[" * 100_000 + "]" * 100_000, *lines[1:]]))
    with pytest.raises(
        TraceError, match=re.escape(f"{deep}:2: not a JSON object (nested too deeply)")
    ):
        read_trace(deep)


def test_a_file_name_that_is_not_utf8_is_shown_escaped(trace: Path, tmp_path: Path) -> None:
    """Its bytes reached the page's <title> as lone surrogates, which UTF-8 cannot write: a
    traceback, and an empty report file left behind."""
    odd = tmp_path / os.fsdecode(b"odd\xff.jsonl")
    odd.write_bytes(trace.read_bytes())
    out = tmp_path / "odd.html"
    write_report(odd, out)
    assert "<title>sv trace: odd\\xff.jsonl</title>" in out.read_text(encoding="utf-8")


def test_integer_and_string_request_ids_are_drawn_apart(trace: Path, tmp_path: Path) -> None:
    records = lines_of(trace)
    records[1]["request"] = "a"  # request 1 is then one the trace found running at step 0
    requests = report_data(read_trace(written(tmp_path, records)))["requests"]
    assert [r["id"] for r in requests] == [1, 2, 3, "a"]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field and item inside a JSON value, as key paths."""
    keys: list[Any] = []
    if isinstance(value, dict):
        keys = list(value)
    elif isinstance(value, list):
        keys = list(range(len(value)))
    return [p for k in keys for p in [(*path, k), *_paths(value[k], (*path, k))]]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 10**6) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=4,
)  # fmt: skip


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_mutated_trace_is_a_report_or_a_trace_error(
    trace: Path, tmp_path: Path, data: st.DataObject
) -> None:
    """Fields of real lines removed or replaced by any JSON value: the report is drawn or the
    reader names the line, never another exception."""
    records = lines_of(trace)
    for _ in range(data.draw(st.integers(1, 3))):
        line = data.draw(st.integers(1, len(records)))
        paths = _paths(records[line - 1])
        if paths:  # a line can lose every field
            path = data.draw(st.sampled_from(paths))
            records[line - 1] = changed(records[line - 1], path, data.draw(st.just(DELETE) | _JSON))
    bad = written(tmp_path, records)
    try:
        render_report(bad)
    except TraceError as e:
        assert str(e).startswith(f"{bad}")


def test_the_row_after_a_stop_is_not_on_the_timeline(tokenizer: Tokenizer) -> None:
    """Overlapped, a request that stops at step 3 was planned into step 4 too (its token
    dropped): the timeline ends at step 3."""
    header = {"type": "header", "format": "sv-trace", "version": 1}

    def step(
        n: int, decodes: list[int], sampled: list[tuple[int, bool]], finished: list[int]
    ) -> dict:
        return {
            "type": "step", "step": n, "at_ms": n, "prefills": [], "num_tokens": len(decodes),
            "decodes": [{"request": r, "position": 10 + n} for r in decodes],
            "admitted": [], "wait": None, "waiting": [], "preempted": [], "pages": [],
            "freed": [], "pool": {"num_pages": 4, "free": 4, "cached": 0, "assigned": 0,
                                  "cached_pages": [], "tables": []},
            "sampled": [{"request": r, "token": 5, "text": "x", "dropped": d} for r, d in sampled],
            "finished": [{"request": r, "reason": "stop"} for r in finished],
            "timing": {"clock": "wall", "host_ms": 1.0, "span_ms": 1.0, "device_ms": None},
        }  # fmt: skip

    records = [header, step(3, [1], [(1, False)], [1]), step(4, [1], [(1, True)], [])]
    (request,) = report_data(records)["requests"]
    assert request["decode"] == [3] and request["end_step"] == 3 and len(request["tokens"]) == 1
