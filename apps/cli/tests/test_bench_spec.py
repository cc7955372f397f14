"""The acceptance-trace replay of `sv bench --only spec`, on a hand-computed trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sv_cli.bench.report import Report
from sv_cli.bench.spec import replay_trace


def _trace(tmp_path: Path, verifications: list[list[int]], **extra: int) -> Path:
    path = tmp_path / "trace.json"
    trace = {"model": "m", "requests": 2, "output_tokens": 12, "verifications": verifications}
    path.write_text(json.dumps(trace | extra))
    return path


def test_replay_costs_plain_steps_and_each_verification(tmp_path: Path) -> None:
    # 12 tokens of 2 requests: 10 decoded; the verifications (3 drafted, 2 accepted) and (1, 0)
    # give 3 + 1 of them, so 6 come from plain steps: 6 x 1.0 ms + 1.5 ms + 1.25 ms = 8.75 ms.
    report = Report()
    replay_trace(report, [1.0, 1.25, 1.4, 1.5], _trace(tmp_path, [[3, 2], [1, 0]]), plain=1000.0)
    (row,) = report.rows
    assert row.value == pytest.approx(10 / 8.75e-3)
    assert row.note.startswith("1.14x the measured plain decode-b1 (1,000 tok/s; 1.14x plain")


def test_replay_refuses_drafts_longer_than_measured(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="longer than k = 3"):
        replay_trace(Report(), [1.0, 1.2, 1.3, 1.4], _trace(tmp_path, [[4, 1]]), plain=1000.0)


def test_replay_costs_overlapped_plain_steps_at_the_plain_rate(tmp_path: Path) -> None:
    # As above, but 2 of the 6 plain steps were resolved first: 4 x 1 ms (1,000 tok/s
    # overlapped) + 2 x 2.0 ms + 1.5 ms + 1.25 ms = 10.75 ms.
    report = Report()
    trace = _trace(tmp_path, [[3, 2], [1, 0]], resolved_plain_steps=2)
    replay_trace(report, [2.0, 1.25, 1.4, 1.5], trace, plain=1000.0)
    (row,) = report.rows
    assert row.value == pytest.approx(10 / 10.75e-3)
    assert "2 of 6 plain steps resolved first" in row.note


def test_replay_refuses_more_resolved_steps_than_plain_ones(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [[3, 2], [1, 0]], resolved_plain_steps=7)
    with pytest.raises(ValueError, match="resolved_plain_steps 7"):
        replay_trace(Report(), [1.0, 1.25, 1.4, 1.5], trace, plain=1000.0)
