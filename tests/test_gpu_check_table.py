"""scripts/gpu-check.sh's serving-mix table (the Python at its end) prints a row for each
report, also one with figures the serving benchmark leaves out (None: no request of that kind
succeeded, or none was sent, as with SV_MIX_ARGS="--omit-max-tokens 1")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check.sh"


def _table_program() -> str:
    text = SCRIPT.read_text()
    start = text.index("<<'PY'\n") + len("<<'PY'\n")
    return text[start : text.index("\nPY\n", start)]


def _report(p50: float | None) -> dict[str, object]:
    return {
        "requests_per_s": 12.5,
        "ttft_ms": {"p50": 20.0, "p99": 90.0},
        "ttft_ms_with_max_tokens": {"p50": p50, "p99": p50},
        "server_preemptions": 3,
        "server_recomputed_tokens": 400,
    }


def test_the_serving_mix_table_prints_missing_figures(tmp_path: Path) -> None:
    (tmp_path / "serve-mix-conservative.json").write_text(json.dumps(_report(15.0)))
    (tmp_path / "serve-mix-preemptive.json").write_text(json.dumps(_report(None)))
    done = subprocess.run(
        [sys.executable, "-", str(tmp_path)],
        input=_table_program(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("serving mix")
    assert lines[1].split() == ["conservative", "12.5", "20.0", "90.0", "15.0", "15.0", "3", "400"]
    assert lines[2].split() == ["preemptive", "12.5", "20.0", "90.0", "None", "None", "3", "400"]
