"""Test setup for sv-weights: the shared helpers beside this file (json_strategies.py) are
imported by name, which importlib mode allows only with this folder on the path."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
