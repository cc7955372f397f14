"""Kernel tuning results kept on disk, so a process does not time the same shapes again.

The GEMV tuner (`linear_tuning.tune_gemv`) times cuBLAS and every tile config for each weight
shape: about 4.6 s of a 7.8 s engine start on the H200 with Triton's own cache warm
(BENCHMARKS.md run 54), for a choice that is the same every time on the same machine. So the
choices are kept in a JSON file, per *fingerprint*: the GPU's name and compute capability, the
torch and Triton versions and the candidate list. Another GPU, an upgrade or a changed
candidate list is another fingerprint, and its shapes are timed afresh.

    {"format": 1,
     "fingerprints": {"NVIDIA H200 (sm 9.0), torch 2.11.0, triton 3.6.0, configs 1f2e3d4c": {
         "3072x2048 torch.bfloat16": {"choice": [2, 512, 2], "us": 4.5, "cublas_us": 6.9},
         "2048x2048 torch.bfloat16": {"choice": null, "us": 6.5, "cublas_us": 6.5}}}}

Where the file lives and whether to trust it are the caller's to decide (an app reads its
cache folder and a "measure again" switch from its settings), given to the tuner as a
`TuningCache`; nothing here reads the environment.

A cache is only ever a shortcut: a file that cannot be read or parsed, or an entry that does not
look right, is a warning and a fresh measurement; a file that cannot be written is a warning.
Writes go to a temporary file renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1


@dataclass(frozen=True)
class TuningCache:
    """A tuning cache file and whether to use what it holds: `retune` measures every shape
    again (and replaces the file's entries for them)."""

    path: Path
    retune: bool = False


@dataclass(frozen=True)
class TunedShape:
    """The winner for one shape: a tile config, or None where cuBLAS won; and both timings."""

    choice: tuple[int, ...] | None
    us: float
    cublas_us: float


def load(path: Path, fingerprint: str) -> dict[str, TunedShape]:
    """The entries kept for `fingerprint` in the file at `path` ({} if none or unreadable)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        _warn(path, f"cannot read it ({exc})")
        return {}
    try:
        entries = _fingerprints(json.loads(text)).get(fingerprint, {})
        if not isinstance(entries, dict):
            raise ValueError(f"the entries of {fingerprint!r} are not an object")
        return {str(shape): _entry(raw) for shape, raw in entries.items()}
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        _warn(path, f"it is not a tuning cache ({exc}); measuring again")
        return {}


def store(path: Path, fingerprint: str, entries: dict[str, TunedShape]) -> None:
    """Add or replace `entries` under `fingerprint`, keeping every other fingerprint's."""
    try:
        document: dict[str, Any] = {"format": FORMAT, "fingerprints": {}}
        with contextlib.suppress(OSError, ValueError):  # missing or unreadable: a new file
            document["fingerprints"] = _fingerprints(json.loads(path.read_text(encoding="utf-8")))
        kept = document["fingerprints"].get(fingerprint)
        merged = {
            shape: raw
            for shape, raw in (kept.items() if isinstance(kept, dict) else ())
            if _is_entry(raw)  # a damaged entry (`load` warned) is dropped, not kept forever
        }
        for shape, tuned in entries.items():
            merged[shape] = {
                "choice": None if tuned.choice is None else list(tuned.choice),
                "us": tuned.us,
                "cublas_us": tuned.cublas_us,
            }
        document["fingerprints"][fingerprint] = merged
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(document, file, indent=1, sort_keys=True)
                file.write("\n")
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        _warn(path, f"cannot write it ({exc}); the choices hold for this process only")


def _fingerprints(document: object) -> dict[str, Any]:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f'expected an object with "format": {FORMAT}')
    fingerprints = document.get("fingerprints")
    if not isinstance(fingerprints, dict):
        raise ValueError('"fingerprints" is not an object')
    return fingerprints


def _entry(raw: object) -> TunedShape:
    if not isinstance(raw, dict):
        raise ValueError(f"an entry is not an object: {raw!r}")
    choice, us, cublas_us = raw.get("choice"), raw.get("us"), raw.get("cublas_us")
    if choice is not None and not (
        isinstance(choice, list)
        and choice
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in choice)
    ):
        raise ValueError(f"an entry's choice is neither null nor positive integers: {choice!r}")
    for name, value in (("us", us), ("cublas_us", cublas_us)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"an entry's {name} is not a non-negative number: {value!r}")
    assert isinstance(us, (int, float)) and isinstance(cublas_us, (int, float))
    return TunedShape(None if choice is None else tuple(choice), float(us), float(cublas_us))


def _is_entry(raw: object) -> bool:
    try:
        _entry(raw)
    except ValueError:
        return False
    return True


def _warn(path: Path, what: str) -> None:
    warnings.warn(f"{path}: kernel tuning cache: {what}", RuntimeWarning, stacklevel=3)
