"""The trace format's name and version, its JSON Schema (schema.json beside this module), and a
reader that checks what a report needs (sv_trace.check)."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from sv_trace.check import TraceChecker
from sv_trace.errors import TraceError

SCHEMA_NAME = "sv-trace"
# Bumped on any change a reader of version N could misread; a reader refuses other versions.
SCHEMA_VERSION = 1


def trace_schema() -> dict[str, Any]:
    """The JSON Schema every line of a trace satisfies."""
    text = resources.files("sv_trace").joinpath("schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def read_trace(path: str | Path, note: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every record of a trace file, in order. Raises TraceError naming the file, the line and
    the field when it is not a trace of this version: a field the report reads is missing or
    out of its range, or a line contradicts an earlier one (a page outside the pool, a request
    never queued). A last line cut short (a trace still being written, or its writer killed)
    is dropped, and `note` is told so in one sentence naming the file and the line."""
    name = str(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise TraceError(f"cannot read the trace file {name!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{name}: not a trace (not UTF-8 text)") from None
    numbered: list[tuple[int, dict[str, Any]]] = []
    cut = ""  # the note on a dropped last line: told only of a trace that is read, not refused
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except RecursionError:
            raise TraceError(f"{name}:{number}: not a JSON object (nested too deeply)") from None
        except ValueError:
            if number == len(lines):  # the writer was killed mid-line, or is still writing
                cut = (
                    f"{name}:{number}: the last line is incomplete ({len(line.encode())} bytes, "
                    "not a JSON object): skipped (a trace still being written, or its writer "
                    "killed)"
                )
                break
            raise TraceError(f"{name}:{number}: not a JSON object") from None
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            raise TraceError(f"{name}:{number}: a trace line is a JSON object with a 'type'")
        numbered.append((number, record))
    records = [record for _, record in numbered]
    if not records or records[0]["type"] != "header" or records[0].get("format") != SCHEMA_NAME:
        raise TraceError(f"{name}: not an sv trace (its first line is not an sv-trace header)")
    version = records[0].get("version")
    if version != SCHEMA_VERSION:
        raise TraceError(
            f"{name}: trace format version {version!r}; this sv reads version {SCHEMA_VERSION}"
        )
    checker = TraceChecker(name)
    for number, record in numbered:
        checker.check(number, record)
    if cut and note is not None:
        note(cut)
    return records
