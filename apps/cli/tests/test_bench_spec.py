"""The acceptance-trace replay of `sv bench --only spec`, on hand-computed traces, and the
checks a trace passes when it is read (before any GPU work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_cli.bench.report import Report
from sv_cli.bench.spec import MAX_MEASURED_DRAFT, load_trace, replay_trace


def _trace(tmp_path: Path, verifications: Any, **extra: Any) -> Path:
    path = tmp_path / "trace.json"
    trace = {"model": "m", "requests": 2, "output_tokens": 12, "verifications": verifications}
    path.write_text(json.dumps(trace | extra))
    return path


def test_replay_costs_plain_steps_and_each_verification(tmp_path: Path) -> None:
    # 12 tokens of 2 requests: 10 decoded; the verifications (3 drafted, 2 accepted) and (1, 0)
    # give 3 + 1 of them, so 6 come from plain steps: 6 x 1.0 ms + 1.5 ms + 1.25 ms = 8.75 ms.
    report = Report()
    trace = load_trace(_trace(tmp_path, [[3, 2], [1, 0]]))
    replay_trace(report, [1.0, 1.25, 1.4, 1.5], trace, plain=1000.0)
    (row,) = report.rows
    assert row.value == pytest.approx(10 / 8.75e-3)
    assert row.note.startswith("1.14x the measured plain decode-b1 (1,000 tok/s; 1.14x plain")
    assert "trace trace.json: m, 2 prompts, 2 verifications, 2 of 4 drafted" in row.note


def test_replay_refuses_drafts_longer_than_measured(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path, [[4, 1]]))
    with pytest.raises(ValueError, match="a draft of 4 tokens, longer than k = 3"):
        replay_trace(Report(), [1.0, 1.2, 1.3, 1.4], trace, plain=1000.0)


def test_replay_costs_overlapped_plain_steps_at_the_plain_rate(tmp_path: Path) -> None:
    # As above, but 2 of the 6 plain steps were resolved first: 4 x 1 ms (1,000 tok/s
    # overlapped) + 2 x 2.0 ms + 1.5 ms + 1.25 ms = 10.75 ms.
    report = Report()
    trace = load_trace(_trace(tmp_path, [[3, 2], [1, 0]], resolved_plain_steps=2))
    replay_trace(report, [2.0, 1.25, 1.4, 1.5], trace, plain=1000.0)
    (row,) = report.rows
    assert row.value == pytest.approx(10 / 10.75e-3)
    assert "2 of 6 plain steps resolved first" in row.note


@pytest.mark.parametrize(
    ("verifications", "extra", "named"),
    [
        ([[3, 2], [1, 0]], {"resolved_plain_steps": 7}, "resolved_plain_steps 7 is not within"),
        ([[3, 2], [1, 0]], {"resolved_plain_steps": -1}, "resolved_plain_steps -1"),
        ([[3, 2], [1, 0]], {"resolved_plain_steps": 1.5}, "resolved_plain_steps 1.5"),
        ([[3, 2], [17, 0]], {}, r"verification 1 \[17, 0\]: drafted must be 1..16"),
        ([[0, 0]], {}, r"verification 0 \[0, 0\]: drafted must be 1..16"),
        ([[2, 3]], {}, "more tokens accepted than drafted"),
        ([[2, -1]], {}, r"verification 0 \[2, -1\] is not a \[drafted, accepted\] pair"),
        ([[2, True]], {}, "verification 0 .* is not a"),
        ([[1, 0], [2]], {}, r"verification 1 \[2\] is not a"),
        ({"2": 1}, {}, "verifications {'2': 1} is not a list"),
        ([[9, 9], [1, 0]], {}, r"more tokens than the 10 decoded ones \(12 output tokens of 2"),
        ([], {"requests": "2"}, "requests '2' is not a whole number"),
        ([], {"output_tokens": None}, "output_tokens None is not a whole number"),
        ([], {"output_tokens": 2}, "2 output tokens of 2 requests leave no decoded token"),
    ],
)
def test_a_malformed_trace_is_refused_when_read(
    verifications: Any, extra: dict[str, Any], named: str, tmp_path: Path
) -> None:
    """Each used to pass the read and fail (or replay nonsense) after the GPU workloads."""
    with pytest.raises(ValueError, match=named):
        load_trace(_trace(tmp_path, verifications, **extra))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
# Near a trace (the keys there, counts near the edges) or any JSON at all.
_pair = st.integers(-1, MAX_MEASURED_DRAFT + 1).flatmap(
    lambda d: st.tuples(st.just(d), st.integers(-1, d + 1)).map(list)
)
_near = st.fixed_dictionaries(
    {
        "model": st.text(max_size=4),
        "requests": st.integers(-1, 5),
        "output_tokens": st.integers(-1, 80),
        "verifications": st.lists(_pair, max_size=5),
    },
    optional={"resolved_plain_steps": st.integers(-1, 60) | _json},
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_near | _json)
def test_any_json_is_read_as_a_trace_or_refused_by_name(body: Any, tmp_path: Path) -> None:
    """A trace that reads replays to a positive speed; anything else is one ValueError."""
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(body))
    try:
        trace = load_trace(path)
    except ValueError:
        return
    assert 0 <= trace.resolved_plain_steps <= trace.plain_steps
    report = Report()
    replay_trace(report, [1.0] * (MAX_MEASURED_DRAFT + 1), trace, plain=1000.0)
    assert report.rows[0].value > 0
