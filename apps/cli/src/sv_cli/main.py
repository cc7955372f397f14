"""The `sv` command: generate, chat, tokenize, weights inspect, trace report, bench, serve."""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.metadata
import io
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from sv_engine.options import OneLineErrorParser

# Only the standard library above: the console script imports this module before main() runs,
# and torch (under sv_engine) takes a second or two to import; main() imports it, so that a
# Ctrl-C meanwhile ends as any other does (`sv: interrupted`, 130), not with a traceback.

EXIT_INTERRUPTED = 130
INTERRUPTED = "\nsv: interrupted"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a Unix tool killed by a closed pipe exits with
EXIT_WRITE_FAILED = 1  # as `cat` to a full disk


class _Version(argparse.Action):
    """--version: the installed package's, looked up only when asked (a source tree run from
    PYTHONPATH, as on the GPU machine, has no package metadata)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        try:
            version = importlib.metadata.version("sv-cli")
        except importlib.metadata.PackageNotFoundError:
            version = "(from a source tree, not an installed package)"
        print(f"sv {version}")
        parser.exit()


def build_parser() -> OneLineErrorParser:
    from sv_engine.options import OneLineErrorParser

    parser = OneLineErrorParser(
        prog="sv",
        description="sv: a from-scratch LLM inference engine (Llama architecture, paged KV cache).",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print sv's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    sub.required = True

    from sv_cli import generate as generate_cmd

    generate_cmd.add_parser(sub)
    from sv_cli import chat as chat_cmd

    chat_cmd.add_parser(sub)
    from sv_cli import trace_report as trace_cmd

    trace_cmd.add_parser(sub)
    _add_passthrough(
        sub, "tokenize", "encode text to token ids (or --decode ids to text)",
        "sv_cli.tokenize", "tokenize_main",
    )  # fmt: skip
    weights = sub.add_parser("weights", help="checkpoint tools: `sv weights inspect PATH`")
    weights_sub = weights.add_subparsers(dest="weights_command", metavar="SUBCOMMAND")
    weights_sub.required = True
    _add_passthrough(
        weights_sub, "inspect", "list a safetensors file's or model folder's tensors",
        "sv_cli.weights_inspect", "inspect_main",
    )  # fmt: skip
    _add_passthrough(
        sub, "bench", "benchmarks (see `sv bench --help`)", "sv_cli.bench.main", "bench_main"
    )
    _add_passthrough(
        sub, "serve", "serve a model over an OpenAI-compatible HTTP API (see `sv serve --help`)",
        "sv_server.cli", "serve_main",
    )  # fmt: skip
    return parser


def _add_passthrough(sub: Any, name: str, help: str, module: str, function: str) -> None:
    """A subcommand with a parser of its own: everything after its name goes to
    `module.function(argv)`, imported only when that subcommand runs."""
    p = sub.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args: argparse.Namespace) -> int:
        entry: Callable[[list[str]], int] = getattr(importlib.import_module(module), function)
        return entry(args.rest)

    p.set_defaults(handler=run)


class _ClosedStream(io.TextIOBase):
    """sys.stdin or sys.stdout of a process started with that descriptor closed (`sv ... >&-`,
    `<&-`), where Python leaves None: every use of it was an AttributeError's traceback, and a
    print() to None wrote nothing and went on to exit 0. A read or write here fails as the
    descriptor itself would (EBADF), for `main` to report in one line, as `cat` does; flushing
    what was never written succeeds, as for any stream."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def _fail(self) -> NoReturn:
        raise OSError(errno.EBADF, f"{self.name}: {os.strerror(errno.EBADF)}")

    def read(self, size: int | None = -1) -> str:
        self._fail()

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]  # (typeshed: bytes)
        self._fail()

    def write(self, text: str) -> int:
        self._fail()


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdin is None:
        sys.stdin = _ClosedStream("standard input")
    if sys.stdout is None:
        sys.stdout = _ClosedStream("standard output")
    if sys.stderr is None:
        # `2>&-`: messages have nowhere to go, as for any Unix tool; print(file=None) put them
        # on standard output, into the output (an error, a note, the first run's progress).
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's)
    if isinstance(sys.stdin, io.TextIOWrapper):
        # Bytes that are not UTF-8 come through as lone surrogates, which each command refuses
        # naming the byte (sv_tokenizer.check_utf8), rather than as a UnicodeDecodeError's
        # traceback from deep inside, or as U+FFFD put silently into a prompt.
        sys.stdin.reconfigure(errors="surrogateescape")
    if isinstance(sys.stdout, io.TextIOWrapper):
        # A character that standard output's encoding cannot hold (an ASCII or Latin-1 locale,
        # PYTHONIOENCODING=ascii, a Windows console's code page) is written as its \u escape,
        # as Python writes it to stderr, not a UnicodeEncodeError's traceback mid-reply.
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        try:
            _import_engine()
            args = build_parser().parse_args(argv)
            handler: Callable[[argparse.Namespace], int] = args.handler
            code = handler(args)
        except SystemExit:
            # argparse's exit after --help (or a subcommand's): its text is flushed here too,
            # or a failure is only seen at interpreter exit, which reports it as a traceback
            # and exit status 120 (`sv --help > /dev/full`).
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, where a closed pipe is handled, not at interpreter exit
        return code
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():
            # Exiting: a second Ctrl-C would land in the interpreter's own shutdown (joining
            # threads) and print a traceback there.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`sv weights inspect DIR | head`): stop quietly, as Unix tools
        # do.
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as e:
        # A write that failed: stdout's on a full disk (`sv generate ... > out.txt`), or a
        # --trace file's. One line, as other errors, not a traceback.
        try:
            sys.stdout.flush()  # what it holds, if it can still take it
        except OSError:
            _drop_stdout()
        print(f"sv: error: {e}", file=sys.stderr)
        return EXIT_WRITE_FAILED


def _drop_stdout() -> None:
    """Send stdout to /dev/null: what is still buffered for it would fail again when the
    interpreter flushes it at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _import_engine() -> None:
    """Import sv_engine (torch, numpy) with a Ctrl-C meanwhile ending the process at once.

    Not as a KeyboardInterrupt: one raised inside numpy's C initialisation (numpy is imported
    under torch) comes out as an ImportError, or as a half-made numpy that fails later or not
    at all. Nothing is there to undo yet: no file written, no page held."""
    if (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        or threading.current_thread() is not threading.main_thread()
    ):
        # Not this code's Ctrl-C to handle: SIGINT is ignored (a shell's background job) or
        # has someone else's handler, or this is not the main thread (which alone runs them).
        importlib.import_module("sv_engine.options")
        return

    def exit_interrupted(_signum: int, _frame: FrameType | None) -> None:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        os._exit(EXIT_INTERRUPTED)

    signal.signal(signal.SIGINT, exit_interrupted)
    try:
        importlib.import_module("sv_engine.options")
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
