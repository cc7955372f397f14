"""Fixtures of the CLI tests: the default model (converted once, cached), and the path to
cli_test_support (the installed `sv` run as a user runs it) for the test modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # cli_test_support, for the test modules


@pytest.fixture(scope="session")
def default_model() -> Path:
    from sv_engine import EngineError
    from sv_engine.default_model import default_model_dir

    try:
        return default_model_dir(progress=lambda _m: None)
    except EngineError as e:
        pytest.skip(f"default model unavailable: {e}")
