"""`sv chat`: interactive multi-turn chat, streamed.

Every turn re-encodes the whole dialog; the prefix cache recognises the pages of the turns
before, so only the new turn is prefilled.
"""

from __future__ import annotations

import argparse
import re
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

from sv_engine.options import add_engine_arguments, check_flag_utf8, positive_int

from sv_cli.common import (
    add_sampling_arguments,
    flag_named,
    open_engine,
    pool_hint,
    sampling_params,
    uninterrupted,
)

if TYPE_CHECKING:
    from sv_server.reasoning import ReasoningParser

# ANSI faint and reset: the thinking of a reasoning model, shown dimmed on a terminal.
DIM, UNDIM = "\x1b[2m", "\x1b[0m"

HELP = "commands: /reset (start over), /exit or /quit (or Ctrl-D), /help. Ctrl-C stops a response."
# A line that is one word after a slash is a command: known ones run, others are refused (a
# mistyped /exit must not reach the model as a message). Text with spaces is a message.
COMMAND = re.compile(r"/[A-Za-z?]+")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "chat",
        help="interactive multi-turn chat",
        description="Interactive multi-turn chat with streaming. " + HELP,
    )
    add_engine_arguments(p, admission="conservative")
    add_sampling_arguments(p)
    p.add_argument(
        "--system",
        metavar="TEXT",
        help="a system message for the conversation (an empty one replaces the default "
        "system message some chat templates add)",
    )
    p.add_argument(
        "-n",
        "--max-new-tokens",
        "--max-new",
        dest="max_new",
        type=positive_int,
        default=512,
        metavar="N",
        help="output-token limit per response (default 512); --max-new is the older name",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=("qwen3", "deepseek_r1"),
        metavar="NAME",
        help="on a terminal, show a thinking model's <think>...</think> dimmed, without the "
        "tags, split as `sv serve --reasoning-parser NAME` splits it: qwen3 or deepseek_r1",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sv_engine import EngineError
    from sv_engine.tracing import stop_trace

    thinking = None
    if args.reasoning_parser is not None:
        from sv_server.reasoning import parser_for

        thinking = partial(parser_for, args.reasoning_parser)
    try:
        if args.system is not None:
            check_flag_utf8(args.system, "--system")
        params = sampling_params(args, args.max_new)
        # The tokenizer is checked for the parser's tags before the weights load.
        engine = open_engine(args, check_tokenizer=thinking)
    except EngineError as e:
        print(f"sv chat: error: {e}", file=sys.stderr)
        return 2
    parser = thinking(engine.tokenizer) if thinking is not None else None
    if not sys.stdout.isatty():
        parser = None  # no terminal to dim on: the text as the model wrote it
    try:
        return chat_loop(engine, params, args.system, sys.stdin, sys.stdout, parser)
    finally:
        with uninterrupted():
            stop_trace(engine)


def chat_loop(
    engine: Any,
    params: Any,
    system: str | None,
    inp: TextIO,
    out: TextIO,
    thinking: ReasoningParser | None = None,
) -> int:
    """Read turns from `inp`, stream the answers to `out`. `thinking`: show each answer's
    thinking dimmed and without its tags (the history keeps the text as written). The exit
    status is 0, or 1 when `inp` is not a terminal and a turn was refused or a command
    mistyped: a script sees what went wrong, as a person at the terminal does; 130 for Ctrl-C
    at the prompt (an interrupt, as every sv command's; Ctrl-C during a reply stops only it)."""
    from sv_engine import EngineError
    from sv_scheduler import AdmissionError
    from sv_tokenizer import Message, TokenizerError, check_utf8

    def fresh() -> list[Message]:
        # (an empty one too: it replaces the default some templates add without one)
        return [Message("system", system)] if system is not None else []

    dialog = fresh()
    interactive = inp.isatty()
    failures = 0

    def status() -> int:
        return 1 if failures and not interactive else 0

    if interactive:
        print(HELP, file=out)
    while True:
        if interactive:
            out.write("> ")
            out.flush()
        try:
            line = inp.readline()
        except KeyboardInterrupt:
            print(file=out)
            return 130
        if not line:
            return status()
        text = line.strip()
        if not text:
            continue
        try:
            check_utf8(text, "the line")
        except TokenizerError as e:
            failures += 1
            print(f"sv chat: {e}", file=sys.stderr)
            continue
        if COMMAND.fullmatch(text):
            if text in ("/exit", "/quit"):
                return status()
            if text == "/reset":
                dialog = fresh()
                print("(conversation reset)", file=out)
            elif text in ("/help", "/?"):
                print(HELP, file=out)
            else:
                failures += 1
                print(f"sv chat: unknown command {text} ({HELP})", file=sys.stderr)
            continue
        dialog.append(Message("user", text))
        reply: list[str] = []
        finished = None
        show = _ThinkingDimmer(engine, dialog, thinking, out) if thinking else None
        try:
            for event in engine.stream([dialog], params):
                reply.append(event.text)
                if show is not None:
                    show.push(event.text)
                else:
                    out.write(event.text)
                out.flush()
                finished = event.completion if event.finished else finished
        except KeyboardInterrupt:
            if show is not None:
                show.finish()
            out.write(" [stopped]")
        except (EngineError, AdmissionError, TokenizerError) as e:
            failures += 1
            dialog.pop()
            # /reset helps only where earlier turns take room
            reset = " (try /reset)" if len(dialog) > len(fresh()) else ""
            print(f"sv chat: {flag_named(e)}{pool_hint(e, engine)}{reset}", file=sys.stderr)
            continue
        if show is not None:
            show.finish()
        print(file=out)
        if finished is not None and finished.finish_reason == "length":
            _note_cut(finished, params.max_new_tokens, engine.runner.max_model_len)
        dialog.append(Message("assistant", "".join(reply)))


def _note_cut(completion: Any, max_new: int, context: int) -> None:
    """Say why a reply stopped short: the per-response limit, or a full context (where only
    /reset lets the conversation go on)."""
    if len(completion.output_ids) >= max_new:
        why = f"the limit of {max_new} new tokens (--max-new-tokens)"
    else:
        why = f"the end of the model's context ({context} tokens): /reset to go on"
    print(f"sv chat: note: the reply stopped at {why}", file=sys.stderr)


class _ThinkingDimmer:
    """One answer's text to the terminal: its thinking (split as the server splits it) between
    DIM and UNDIM, the rest as is."""

    def __init__(self, engine: Any, dialog: Any, thinking: ReasoningParser, out: TextIO) -> None:
        from sv_server.reasoning import ReasoningStream

        prompt = engine.tokenizer.chat_format.encode_dialog(dialog)
        self._split = ReasoningStream(thinking.opens_in_thinking(prompt))
        self._out = out
        self._dimmed = False

    def push(self, text: str) -> None:
        self._write(*self._split.push(text))

    def finish(self) -> None:
        self._write(*self._split.finish())
        if self._dimmed:
            self._out.write(UNDIM)
            self._dimmed = False

    def _write(self, reasoning: str, content: str) -> None:
        if reasoning:
            if not self._dimmed:
                self._out.write(DIM)
                self._dimmed = True
            self._out.write(reasoning)
        if content:
            if self._dimmed:
                self._out.write(UNDIM)
                self._dimmed = False
            self._out.write(content)
