"""The report page: what it gathers from a trace, that it needs nothing from the network, and
the reader's errors (fuzzed)."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_scheduler import SchedulerConfig
from sv_tokenizer import Tokenizer
from sv_trace import TraceError, read_trace, render_report
from sv_trace.report import report_data

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
    records = read_trace(cut)
    assert len(records) == len(lines) - 1
    assert report_data(records)["stats"] is None  # no end line: the page says so


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"cannot read the trace file .*nope\.jsonl"):
        read_trace(tmp_path / "nope.jsonl")


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_any_bytes_are_a_trace_or_a_trace_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b'{"type":"header","format":"sv-trace","version":1}\n' + content)
    try:
        records = read_trace(path)
    except TraceError:
        return
    assert records[0]["type"] == "header"
    assert all(isinstance(r["type"], str) for r in records)


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
