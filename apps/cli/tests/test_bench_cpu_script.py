"""scripts/cpu-bench.py's usage errors come before any model is loaded: one line, exit code 2
(a bad value used to fail after minutes of loading and measuring, with a traceback, or to be
ignored)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "cpu-bench.py"


@pytest.fixture
def cpu_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("cpu_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def reached(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("cpu-bench went past its usage checks to loading a model")

    monkeypatch.setattr(module.Engine, "from_model_dir", reached)
    return module


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--tokens", "1"], "--tokens"),  # one token gives no decode rate: ZeroDivisionError
        (["--tokens", "0"], "--tokens"),
        (["--rounds", "0"], "--rounds"),  # no round: KeyError at the table
        (["--threads", "0"], "--threads"),  # ignored: torch's own thread count was used
        (["--threads", "-2"], "--threads"),  # a RuntimeError from torch
        (["--model", "/nonexistent/model"], "--model"),
    ],
)
def test_a_bad_flag_is_one_line_before_any_model_loads(
    argv: list[str],
    flag: str,
    cpu_bench: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "argv", ["cpu-bench.py", *argv])
    with pytest.raises(SystemExit) as caught:
        cpu_bench.main()
    assert caught.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith("cpu-bench.py: error: ") and flag in err, err
