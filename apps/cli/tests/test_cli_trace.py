"""`--trace FILE` on `sv generate` and `sv chat`, and `sv trace report`, on the embedded
default model (CPU): the trace against the `--stats` the same run prints."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_test_support import one_line_error, sv
from sv_cli.main import EXIT_WRITE_FAILED, main
from sv_trace import read_trace


def _stat(out: str, name: str) -> int:
    return int(re.search(rf"{name}:\s*(\d+)", out).group(1))  # type: ignore[union-attr]


def test_static_waits_in_the_stats_are_in_the_trace(
    default_model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Five prompts on an 11-page pool under --static: every admission wait --stats counts is
    a step of the trace whose head waited, for credits or for the group; the tokens each
    request printed are the ones the trace sampled for it."""
    trace = tmp_path / "t.jsonl"
    prompts = ["Name a colour.", "12", "Say hello.", "Name a fruit.", "Count to three.", "Hi."]
    argv = ["generate", "--static", "--stats", "--kv-cache-mib", "8", "--trace", str(trace)]
    assert main([*argv, *prompts]) == 0
    out = capsys.readouterr().out
    records = read_trace(trace)
    steps = [r for r in records if r["type"] == "step"]
    counted = [s["wait"] for s in steps if s["wait"] is not None and s["wait"]["counted"]]
    assert len(counted) == _stat(out, "admission waits") > 0
    assert {w["reason"] for w in counted} <= {"credits", "static_group"}
    assert "static_group" in {w["reason"] for w in counted}
    assert _stat(out, "peak assigned pages") == max(s["pool"]["assigned"] for s in steps)
    assert _stat(out, "final free pages") == records[-1]["stats"]["free_pages"]
    printed = {int(n): [int(i) for i in ids.split(", ")] for n, ids in re.findall(
        r"=== request (\d+) .*?\n.*?ids=\[([\d, ]+)\]", out, re.S)}  # fmt: skip
    for rid, ids in printed.items():
        traced = [x["token"] for s in steps for x in s["sampled"]
                  if x["request"] == rid and not x["dropped"]]  # fmt: skip
        assert traced == ids
    # static batching: nobody is admitted while a group runs
    for s in steps:
        if s["admitted"]:
            assert all(t["request"] in {a["request"] for a in s["admitted"]}
                       for t in s["pool"]["tables"])  # fmt: skip
    assert main(["trace", "report", str(trace), "-o", str(tmp_path / "r.html")]) == 0
    assert "sv step trace" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_chat_writes_a_trace(default_model: Path, tmp_path: Path) -> None:
    trace = tmp_path / "chat.jsonl"
    done = sv(
        "chat", "--device", "cpu", "--max-new", "4", "--trace", str(trace),
        input="Hi!\nAnd again?\n/exit\n",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = read_trace(trace)
    requests = [r for r in records if r["type"] == "request"]
    assert len(requests) == 2  # one per turn; the second re-sends the dialog
    assert requests[1]["prompt_ids"][: len(requests[0]["prompt_ids"])] == requests[0]["prompt_ids"]
    assert records[-1]["type"] == "end" and records[-1]["stats"]["prefix_cache_hit_tokens"] > 0


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read the trace file"), ("hello\n", "not a JSON object")],
)
def test_report_errors_are_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_text(content + "more\n", encoding="utf-8")
    line = one_line_error(sv("trace", "report", str(path), "-o", str(tmp_path / "out.html")))
    assert line.startswith("sv trace report: error: ") and message in line and "in.jsonl" in line
    assert not (tmp_path / "out.html").exists()


@pytest.mark.parametrize(("trace", "report", "name"), [("", "out.html", "FILE"), ("t", "", "-o")])
def test_an_empty_path_is_named_as_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: str, report: str, name: str
) -> None:
    """An unset shell variable (`sv trace report "$T" -o x.html`) was the current folder:
    "cannot read the trace file '': Is a directory", as other commands' empty paths are not."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t").write_text("{}\n", encoding="utf-8")
    line = one_line_error(sv("trace", "report", trace, "-o", report))
    assert line.startswith(f"sv trace report: error: {name}") and "must not be empty" in line


def test_a_missing_trace_beside_an_existing_report_is_the_commands_error(tmp_path: Path) -> None:
    """Redrawing a report whose trace is gone: the check that the report is not the trace
    compared the two files first, and the missing one came out as `sv: error: [Errno 2] ...`
    with status 1, not as the command's own error."""
    report = tmp_path / "out.html"
    report.write_text("an earlier report", encoding="utf-8")
    line = one_line_error(sv("trace", "report", str(tmp_path / "gone.jsonl"), "-o", str(report)))
    assert line.startswith("sv trace report: error: cannot read the trace file ")
    assert "gone.jsonl" in line
    assert report.read_text(encoding="utf-8") == "an earlier report"


def test_an_unwritable_trace_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(sv("generate", "--trace", str(tmp_path / "none" / "t.jsonl"), "Hi", "2"))
    assert "cannot write the trace file" in line and "none" in line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_trace_write_that_fails_names_the_file(default_model: Path) -> None:
    """The file opens, then its first write finds the disk full: that write's error named no
    file ("[Errno 28] No space left on device")."""
    done = sv("generate", "--device", "cpu", "--trace", "/dev/full", "Hi", "2")
    assert "Traceback" not in done.stderr and done.returncode == EXIT_WRITE_FAILED, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "sv: error: cannot write the trace file '/dev/full': No space left on device"
    )


def test_a_trace_that_filled_up_mid_run_still_leaves_the_stats(
    default_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A trace write that fails mid-run ends the trace, not the requests, and its error is
    raised when the trace is closed: that came before --stats, which were never printed."""
    import sv_engine.tracing

    def disk_full(engine: Any) -> None:  # what the recorder's close() raises then
        engine.tracer = None
        raise OSError("cannot write the trace file 't.jsonl': No space left on device")

    monkeypatch.setattr(sv_engine.tracing, "stop_trace", disk_full)
    argv = ["generate", "--stats", "--trace", str(tmp_path / "t.jsonl"), "Hi", "2"]
    assert main(argv) == EXIT_WRITE_FAILED
    out, err = capsys.readouterr()
    assert "[request 1] finish=" in out and "--- stats ---" in out, out
    assert "final free pages:" in out
    assert err.strip().splitlines()[-1].startswith("sv: error: cannot write the trace file")


def test_the_trace_file_is_checked_before_the_model_loads(tmp_path: Path) -> None:
    """Found first: a model that does not exist is not what the error names. And a load that
    fails leaves no empty trace file behind."""
    missing = str(tmp_path / "no-model")
    line = one_line_error(sv("generate", "--model", missing, "--trace", str(tmp_path), "Hi", "2"))
    assert line.startswith("sv generate: error: --trace: cannot write the trace file"), line
    trace = tmp_path / "t.jsonl"
    line = one_line_error(sv("generate", "--model", missing, "--trace", str(trace), "Hi", "2"))
    assert "no-model" in line and not trace.exists()


def test_a_trace_over_a_file_of_the_model_folder_is_refused(
    default_model: Path, tmp_path: Path
) -> None:
    """`--trace` naming the model's config.json (or a link to it) wrote the trace over it after
    the load: the folder no longer loaded. Refused before the load, the file untouched."""
    model = tmp_path / "model"
    model.mkdir()
    for entry in default_model.iterdir():
        if entry.suffix == ".safetensors":
            (model / entry.name).symlink_to(entry)
        elif entry.is_file():
            shutil.copy(entry, model / entry.name)
    config = (model / "config.json").read_bytes()
    link = tmp_path / "trace.jsonl"
    link.symlink_to(model / "config.json")
    for target in (model / "config.json", link):
        done = sv("generate", "--model", str(model), "--trace", str(target), "Hi", "2")
        line = one_line_error(done)
        assert "model folder's config.json" in line and done.returncode == 2, line
        assert (model / "config.json").read_bytes() == config
    trace = model / "new-trace.jsonl"  # a new file in the folder is no one's
    assert main(["generate", "--model", str(model), "--trace", str(trace), "Hi", "2"]) == 0
    assert read_trace(trace)[0]["type"] == "header"


@pytest.fixture(scope="module")
def real_trace(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("trace") / "run.jsonl"
    assert main(["generate", "--trace", str(trace), "Hi", "4"]) == 0
    return trace


def test_report_of_a_cut_trace_says_its_last_line_was_skipped(
    real_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace still being written (or whose writer was killed) ends mid-line: that line is
    dropped, as before, but no longer silently."""
    lines = real_trace.read_text(encoding="utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(line + "\n" for line in lines[:-1]) + lines[-1][:7], encoding="utf-8")
    out = tmp_path / "out.html"
    assert main(["trace", "report", str(cut), "-o", str(out)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"sv trace report: note: {cut}:{len(lines)}: the last line is incomplete (7 bytes, not a "
        "JSON object): skipped (a trace still being written, or its writer killed)",
        f"sv trace report: wrote {out}",
    ]
    assert out.exists()


DELETE = object()  # the field is removed


# The QA pass's bad lines, in a trace of one request: 1 header, 2 request, 3-6 steps 0-3.
@pytest.mark.parametrize(
    ("line", "path", "value", "message"),
    [
        (4, (), {"type": "step"}, "4: step line: 'step' is missing"),
        (4, ("timing",), DELETE, "4: step line: 'timing' is missing"),
        (4, ("pool",), None, "4: step line: 'pool' is null, expected an object"),
        (4, ("step",), "x", """4: step line: 'step' is "x", expected an integer >= 0"""),
        (4, (), {"type": "request", "request": "x"}, "4: request line: 'at_ms' is missing"),
        (
            4, ("pool", "tables", 0, "pages", 0), 999,
            "4: step line: 'pool.tables[0].pages[0]' is 999, not a page of the {pages}-page pool",
        ),
        (
            4, ("decodes", 0, "request"), 9,
            "4: step line: 'decodes[0].request' is 9, a request the trace never queued",
        ),
        (1, ("num_pages",), -1, "1: header line: 'num_pages' is -1, expected an integer from 1 to 4,194,304"),
        (4, ("pages",), "x", """4: step line: 'pages' is "x", expected an array"""),
    ],
)  # fmt: skip
def test_a_bad_trace_line_is_one_error_line(
    real_trace: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    line: int,
    path: tuple[Any, ...],
    value: Any,
    message: str,
) -> None:
    records = [json.loads(text) for text in real_trace.read_text(encoding="utf-8").splitlines()]
    if not path:
        records[line - 1] = value
    else:
        *parents, last = path
        holder = records[line - 1]
        for key in parents:
            holder = holder[key]
        if value is DELETE:
            del holder[last]
        else:
            holder[last] = value
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert main(["trace", "report", str(bad), "-o", str(tmp_path / "out.html")]) == 2
    expected = message.format(pages=records[0]["num_pages"])
    assert capsys.readouterr().err == f"sv trace report: error: {bad}:{expected}\n"
    assert not (tmp_path / "out.html").exists()
