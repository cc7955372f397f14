"""sv's cache folder, shared by everything the apps keep between runs (the converted default
model, the GEMV tuning results): $SV_CACHE_DIR, else ~/.cache/sv."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SV_CACHE_DIR, else ~/.cache/sv (read on each call, so a test can point it elsewhere)."""
    configured = os.environ.get("SV_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "sv"
