"""Command-line options shared by every app that loads a model (`sv generate`, `sv chat`,
`sv serve`): one definition, so the apps cannot drift apart."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from sv_kernels import TuningCache
from sv_scheduler import Admission

from sv_engine.cache_folder import cache_dir
from sv_engine.default_model import default_model_dir
from sv_engine.engine import Engine
from sv_engine.tracing import start_trace

EXIT_USAGE = 2


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


ADMISSION_HELP = {
    "conservative": "reserve each request's whole budget (prompt + max new tokens) when it "
    "starts: never preempts, but a long request holds pages it may never use",
    "preemptive": "start a request when its prompt's pages fit, grow on demand, and when pages "
    "run out preempt the newest running request (it recomputes later)",
}


def add_engine_arguments(p: argparse.ArgumentParser, *, admission: Admission) -> None:
    """--model, --kv-cache-mib, --device, --max-model-len, --admission, --trace, --no-overlap.
    `admission` is this app's default policy."""
    p.add_argument(
        "--model",
        metavar="DIR",
        help="model folder (config.json, model.safetensors, tokenizer); "
        "default: the embedded SmolLM2-135M-Instruct",
    )
    p.add_argument(
        "--kv-cache-mib",
        type=positive_float,
        metavar="N",
        help="KV-cache pool size in MiB (default: most free GPU memory, or 256 MiB on the CPU)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (default: CUDA when present), cuda or cpu"
    )
    p.add_argument(
        "--max-model-len",
        type=positive_int,
        metavar="N",
        help="context limit in tokens (default: the model's max_position_embeddings)",
    )
    p.add_argument(
        "--admission",
        choices=sorted(ADMISSION_HELP),
        default=admission,
        help=f"how requests share the KV-cache pool (default {admission}): "
        + "; ".join(f"{name}: {text}" for name, text in sorted(ADMISSION_HELP.items())),
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="record every step into FILE, one JSON line each (the plan, admissions and waits, "
        "pages, sampled tokens with their top-5 logprobs, timings); `sv trace report FILE` "
        "draws it",
    )
    p.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="run the plain step loop: wait for each step's tokens before planning the next "
        "(same output, slower; for debugging and comparison)",
    )


GEMV_TUNING_FILE = "gemv-tuning.json"


def default_tuning_cache() -> TuningCache:
    """The apps' GEMV tuning cache: gemv-tuning.json in sv's cache folder ($SV_CACHE_DIR, else
    ~/.cache/sv); SV_RETUNE=1 in the environment measures again (and replaces what was kept)."""
    retune = os.environ.get("SV_RETUNE", "") not in ("", "0")
    return TuningCache(cache_dir() / GEMV_TUNING_FILE, retune=retune)


def engine_from_args(args: argparse.Namespace, **overrides: Any) -> tuple[Engine, Path]:
    """The engine the options of `add_engine_arguments` ask for, and its model folder.

    Without --model the embedded default model is used (converted into the cache on first
    use, with a progress line on stderr). A GPU warm-up reports its phases on stderr too.
    Every failure is an EngineError with a one-line message."""
    if args.model is not None:
        model_dir = Path(args.model)
    else:
        model_dir = default_model_dir(progress=lambda message: print(message, file=sys.stderr))
    engine = Engine.from_model_dir(
        model_dir,
        device=args.device,
        kv_cache_mib=args.kv_cache_mib,
        max_model_len=args.max_model_len,
        admission=args.admission,
        tuning_cache=default_tuning_cache(),
        progress=lambda message: print(f"sv: {message}", file=sys.stderr, flush=True),
        **overrides,
    )
    engine.overlap = getattr(args, "overlap", True)
    trace = getattr(args, "trace", None)
    if trace is not None:
        start_trace(engine, trace, model=str(model_dir))
    return engine, model_dir
