"""Fixtures: real servers on 127.0.0.1 (uvicorn in a thread) of the default model (the
`default_model` fixture of the repository root's conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # server_test_support, for the test modules

from server_test_support import RunningServer


@pytest.fixture(scope="session")
def make_server(default_model: Path) -> Any:
    """A factory for extra servers with their own options (stop them when done)."""
    return lambda **options: RunningServer(default_model, **options)


@pytest.fixture(scope="session")
def server(default_model: Path) -> Iterator[RunningServer]:
    """The shared server: the default model on the CPU, the default 256 MiB pool."""
    running = RunningServer(default_model)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def speculating(make_server: Any) -> Iterator[RunningServer]:
    """A server that speculates (one per test module): a step verifies a draft, and several of
    a request's tokens reach its stream at once."""
    from sv_scheduler import SpeculationConfig

    running = make_server(speculation=SpeculationConfig())
    yield running
    running.stop()


@pytest.fixture(scope="session")
def oracle_engine(default_model: Path) -> Any:
    """A second, in-process engine of the same model: what the server must reproduce."""
    from sv_engine import Engine

    return Engine.from_model_dir(default_model, device="cpu")
