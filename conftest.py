"""Fixtures every package's tests share (pytest loads this file for all tests below the root)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The embedded default model (SmolLM2-135M-Instruct), converted once into the cache;
    the test is skipped when it cannot be had."""
    from sv_engine import EngineError
    from sv_engine.default_model import default_model_dir

    try:
        return default_model_dir(progress=lambda _message: None)
    except EngineError as e:
        pytest.skip(f"default model unavailable: {e}")
