"""The installed `sv` console script run in a subprocess, as a user runs it, and the one-line
error every bad input must give."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SV = Path(sys.executable).parent / "sv"


def sv(
    *argv: str, env: dict[str, str] | None = None, input: str | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """`sv ARGV...` to its end: stdin is `input`, or nothing (a run never waits on a terminal)."""
    return subprocess.run(
        [str(SV), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        env=None if env is None else {**os.environ, **env},
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error line of a run that failed with exit code 2 (and nothing else on stderr)."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.returncode == 2, done.stderr
    return lines[0]
