"""Options and helpers shared by the commands that load a model (the engine options themselves
live in `sv_engine.options`, shared with `sv serve`)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sv_engine import Engine, SamplingParams


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C ignored while the body runs: for the cleanup that a first Ctrl-C starts (pages
    back, --stats, the trace file closed), so that an impatient second one does not cut it
    short into a traceback. Only in the main thread, the one that handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)"
    )
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="1.0 = off (default)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed")
    p.add_argument("--min-p", type=float, default=0.0, metavar="P", help="0 = off (default)")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        metavar="R",
        help="divide a seen token's positive logit by R, multiply a negative one (1 = off)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        metavar="F",
        help="subtract F per earlier occurrence from a token's logit, F in [-2, 2] (0 = off)",
    )
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        metavar="F",
        help="subtract F from the logit of a token already generated, F in [-2, 2] (0 = off)",
    )
    p.add_argument(
        "--min-tokens",
        type=int,
        default=0,
        metavar="N",
        help="no stop token before N tokens are generated (0 = off)",
    )
    p.add_argument(
        "--allowed-token-ids",
        type=_token_ids,
        default=None,
        metavar="ID,ID,...",
        help="generate only these token ids (vLLM's allowed_token_ids; default: any)",
    )
    p.add_argument(
        "--bad-words",
        nargs="+",
        action="extend",
        default=[],
        metavar="WORD",
        help="never generate these words, at the start of the text or inside it (vLLM's "
        "bad_words); its words run to the next flag: end them with -- before a prompt",
    )


def _token_ids(text: str) -> list[int]:
    fields = [t.strip() for t in text.split(",")]
    if not all(t.isascii() and t.isdigit() for t in fields):  # (no sign: ids are >= 0)
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}")
    return [int(t) for t in fields]


# The sampling flags: each sets the SamplingParams field of its name (--top-k sets top_k).
SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "min_tokens",
    "allowed_token_ids",
    "bad_words",
)


def sampling_params(args: argparse.Namespace, max_new: int) -> SamplingParams:
    """The engine's SamplingParams of the flags: its own checks, with the field a message
    names called by the flag the user typed (`--top-p must be in (0, 1], got 2.0`)."""
    from sv_engine import EngineError, SamplingParams
    from sv_engine.options import check_flag_utf8

    for word in args.bad_words:
        # (a byte that is not UTF-8 would be encoded as U+FFFD: another word banned)
        check_flag_utf8(word, "--bad-words")
    try:
        return SamplingParams(
            max_new_tokens=max_new, **{name: getattr(args, name) for name in SAMPLING_FIELDS}
        )
    except EngineError as e:
        raise flag_named(e) from None


def flag_named(error: Exception) -> Exception:
    """An engine error with the sampling field it names called by its flag (a bad_words entry
    is found when the request is added, with the model's tokenizer); any other as it is."""
    from sv_engine import EngineError

    if not isinstance(error, EngineError) or error.field not in SAMPLING_FIELDS:
        return error
    return error.named(f"--{error.field.replace('_', '-')}")


def open_engine(args: argparse.Namespace, **overrides: Any) -> Engine:
    """Load the engine for --model (or the embedded default). A failure is an EngineError
    (one line), for the subcommand to print under its own name."""
    from sv_engine.options import engine_from_args

    return engine_from_args(args, **overrides)[0]


def pool_hint(error: Exception, engine: Any) -> str:
    """For a request refused because the KV-cache pool is too small: the option that sizes it."""
    if "KV-cache pool" not in str(error):
        return ""
    pages = engine.stats.pool_pages
    kv = engine.runner.kv
    page_bytes = kv.k[:, 0].nbytes + kv.v[:, 0].nbytes  # one page: K and V in every layer
    mib = pages * page_bytes / 2**20
    return f" (--kv-cache-mib N sets the pool: now {mib:.3g} MiB, {pages} pages)"
