"""The JSON files beside the weights (config.json, model.safetensors.index.json), read one way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sv_weights.errors import WeightsError


def read_json_file(path: Path, what: str) -> Any:
    """The value of the JSON file `path` (`what` it is, for the message). WeightsError names
    the file for anything that keeps it from being read: a missing or unreadable file, text that
    is not UTF-8 or not JSON, and JSON nested past the parser's recursion limit."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc})") from exc
    try:
        return json.loads(text)
    except RecursionError:
        raise WeightsError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise WeightsError(f"{path}: not valid JSON ({exc})") from exc
