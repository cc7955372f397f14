"""`sv bench`'s usage errors come before any work: a --json path that cannot be written (it was
written only after the whole GPU run), a --workdir with a file in the way, a --tokenizer-dir
without a tokenizer, a --spec-trace that cannot be read, and --spec-trace without the spec
workload (silently ignored) are each one line naming the flag and its value, exit code 2,
raised before the CUDA check (so a machine without a GPU finds them too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_test_support import one_line_error, sv
from sv_cli.bench import main

TRACE = {"model": "m", "requests": 1, "output_tokens": 3, "verifications": [[2, 1]]}


@pytest.fixture(autouse=True)
def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reaching the CUDA check fails the test: the checks must come first (and on a GPU
    machine nothing runs)."""

    def reached() -> bool:
        raise AssertionError("sv bench went past its usage checks to the CUDA check")

    monkeypatch.setattr(torch.cuda, "is_available", reached)


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `sv bench ARGV` fails with, exit code 2, before any work."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as caught:
        main.bench_main(argv)
    assert caught.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("sv bench: error: ") and captured.err.count("\n") == 1
    assert captured.err.rstrip().endswith("(see sv bench --help)")
    return captured.err


def _names(err: str, flag: str, value: object) -> None:
    assert f"{flag} {str(value)!r}" in err, err


def test_json_that_is_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _names(_usage_error(["--json", str(tmp_path)], capsys), "--json", tmp_path)


@pytest.mark.parametrize("parent", ["missing", "a-file"])
def test_json_that_cannot_be_written_is_refused_and_nothing_is_left(
    parent: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    path = tmp_path / parent / "rows.json"
    _names(_usage_error(["--json", str(path)], capsys), "--json", path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_json_that_can_be_written_is_taken_and_nothing_is_written_yet(tmp_path: Path) -> None:
    new = tmp_path / "rows.json"
    assert main.parse_args(["--json", str(new)]).json == str(new)
    assert not new.exists()  # written at the end of the run, not at the check
    old = tmp_path / "old.json"
    old.write_text('{"rows": []}')
    main.parse_args(["--json", str(old)])
    assert old.read_text() == '{"rows": []}'  # an existing file is kept until the run's end


def test_json_error_is_one_line_from_the_installed_command(tmp_path: Path) -> None:
    """As a user meets it; without a GPU it used to be "the benchmarks need a CUDA device"."""
    line = one_line_error(sv("bench", "--quick", "--json", str(tmp_path)))
    assert line.startswith("sv bench: error: --json ") and str(tmp_path) in line


@pytest.mark.parametrize("below", ["", "sub/dir"])
def test_workdir_that_is_a_file_is_refused(
    below: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint is written there after the rooflines: a file in the way ended the run
    with a traceback."""
    (tmp_path / "a-file").write_text("x")
    workdir = tmp_path / "a-file" / below if below else tmp_path / "a-file"
    err = _usage_error(["--workdir", str(workdir)], capsys)
    _names(err, "--workdir", workdir)
    assert "not a folder" in err


def test_workdir_that_is_or_can_be_a_folder_is_taken(tmp_path: Path) -> None:
    for workdir in (tmp_path, tmp_path / "new" / "bench"):
        assert main.parse_args(["--workdir", str(workdir)]).workdir == str(workdir)
    assert not (tmp_path / "new").exists()  # made by the run, not by the check


@pytest.mark.parametrize("kind", ["missing", "a file", "no tokenizer file", "only original/"])
def test_tokenizer_dir_without_a_tokenizer_is_refused(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "tok"
    if kind == "a file":
        folder.write_text("x")
    elif kind == "no tokenizer file":
        folder.mkdir()
        (folder / "tokenizer_config.json").write_text("{}")
    elif kind == "only original/":  # the checkpoint gets only the folder's top-level files
        (folder / "original").mkdir(parents=True)
        (folder / "original" / "tokenizer.model").write_text("x")
    _names(_usage_error(["--tokenizer-dir", str(folder)], capsys), "--tokenizer-dir", folder)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer.model"])
def test_tokenizer_dir_with_a_tokenizer_file_is_taken(name: str, tmp_path: Path) -> None:
    (tmp_path / name).write_text("x")
    assert main.parse_args(["--tokenizer-dir", str(tmp_path)]).tokenizer_dir == str(tmp_path)


@pytest.mark.parametrize(
    "content", [None, "not json", json.dumps([1, 2]), json.dumps({"model": "m"})]
)
def test_spec_trace_that_cannot_be_read_is_refused(
    content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(TRACE))
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    argv = ["--only", "spec", "--spec-trace", str(good), str(bad)]
    _names(_usage_error(argv, capsys), "--spec-trace", bad)


def test_spec_trace_that_is_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--only", "spec", "--spec-trace", str(tmp_path)]
    _names(_usage_error(argv, capsys), "--spec-trace", tmp_path)


@pytest.mark.parametrize("only", [[], ["--only", "decode"], ["--only", "load,memory"]])
def test_spec_trace_without_the_spec_workload_is_refused(
    only: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to be ignored: the run went on without replaying it."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(TRACE))
    err = _usage_error([*only, "--spec-trace", str(trace)], capsys)
    _names(err, "--spec-trace", trace)
    assert "spec" in err.split(":", 3)[-1]


def test_spec_traces_are_taken_with_the_spec_workload(tmp_path: Path) -> None:
    traces = [tmp_path / "a.json", tmp_path / "b.json"]
    for trace in traces:
        trace.write_text(json.dumps(TRACE))
    argv = ["--only", "decode,spec", "--spec-trace", *map(str, traces)]
    read = main.parse_args(argv).spec_trace
    assert [(t.file_name, t.model, t.verifications) for t in read] == [
        ("a.json", "m", [(2, 1)]),
        ("b.json", "m", [(2, 1)]),
    ]
    (default,) = main.parse_args(["--only", "spec"]).spec_trace  # the checkout's recorded trace
    assert default.file_name == main.DEFAULT_SPEC_TRACE.name and default.verifications
    assert main.parse_args([]).spec_trace == []  # not replayed without the spec workload
