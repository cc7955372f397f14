"""The CLI tests' path to cli_test_support (the installed `sv` run as a user runs it); their
`default_model` fixture is the repository root's conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # cli_test_support, for the test modules
