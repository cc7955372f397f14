"""A run cut short keeps what it measured: `--json` holds every row as soon as it is added
(it was written only at the end, so a run the device call's time limit ended left no file),
and Ctrl-C (SIGINT, how gpu-check.sh's budget ends a step) prints the rows so far as the
table and exits 130."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from sv_cli.bench import main
from sv_cli.bench.report import Report, Row


def test_each_row_reaches_the_json_file_when_it_is_added(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    report = Report(json_path=path)
    report.info["device"] = "a card"
    rows = [Row("decode-b1", 1234.5, "tok/s", 1730.0, "greedy"), Row("ttft", 9.0, "ms")]
    for i, row in enumerate(rows):
        report.add(row)
        written = json.loads(path.read_text())
        assert written["info"] == {"device": "a card"}
        assert [r["name"] for r in written["rows"]] == [r.name for r in rows[: i + 1]]
    assert written["rows"][0] == {
        "name": "decode-b1",
        "value": 1234.5,
        "unit": "tok/s",
        "roofline": 1730.0,
        "note": "greedy",
    }


def test_an_interrupted_run_prints_its_rows_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def first_row_then_ctrl_c(
        args: argparse.Namespace, modes: list[str], only: set[str] | None, report: Report
    ) -> None:
        report.add(Row("copy bandwidth", 4280.0, "GB/s"))
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(main, "_run_workloads", first_row_then_ctrl_c)
    path = tmp_path / "rows.json"
    assert main.bench_main(["--json", str(path), "--workdir", str(tmp_path)]) == 130
    captured = capsys.readouterr()
    assert "interrupted" in captured.err
    table = captured.out.split("\n\n")[-1]
    assert table.splitlines()[1].split()[:4] == ["copy", "bandwidth", "4,280.00", "GB/s"]
    assert [r["name"] for r in json.loads(path.read_text())["rows"]] == ["copy bandwidth"]
