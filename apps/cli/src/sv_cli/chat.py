"""`sv chat`: interactive multi-turn chat, streamed.

Every turn re-encodes the whole dialog; the prefix cache recognises the pages of the turns
before, so only the new turn is prefilled.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, TextIO

from sv_engine.options import add_engine_arguments, positive_int

from sv_cli.common import add_sampling_arguments, open_engine, pool_hint, sampling_params

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
    p.add_argument("--system", metavar="TEXT", help="a system message for the conversation")
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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sv_engine import EngineError
    from sv_engine.tracing import stop_trace

    try:
        params = sampling_params(args, args.max_new)
    except EngineError as e:
        print(f"sv chat: error: {e}", file=sys.stderr)
        return 2
    engine = open_engine(args)
    if engine is None:
        return 2
    try:
        return chat_loop(engine, params, args.system, sys.stdin, sys.stdout)
    finally:
        stop_trace(engine)


def chat_loop(engine: Any, params: Any, system: str | None, inp: TextIO, out: TextIO) -> int:
    from sv_engine import EngineError
    from sv_scheduler import AdmissionError
    from sv_tokenizer import Message, TokenizerError

    def fresh() -> list[Message]:
        return [Message("system", system)] if system else []

    dialog = fresh()
    interactive = inp.isatty()
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
            return 0
        if not line:
            return 0
        text = line.strip()
        if not text:
            continue
        if COMMAND.fullmatch(text):
            if text in ("/exit", "/quit"):
                return 0
            if text == "/reset":
                dialog = fresh()
                print("(conversation reset)", file=out)
            elif text in ("/help", "/?"):
                print(HELP, file=out)
            else:
                print(f"sv chat: unknown command {text} ({HELP})", file=sys.stderr)
            continue
        dialog.append(Message("user", text))
        reply: list[str] = []
        finished = None
        try:
            for event in engine.stream([dialog], params):
                reply.append(event.text)
                out.write(event.text)
                out.flush()
                finished = event.completion if event.finished else finished
        except KeyboardInterrupt:
            out.write(" [stopped]")
        except (EngineError, AdmissionError, TokenizerError) as e:
            dialog.pop()
            print(f"sv chat: {e}{pool_hint(e, engine)} (try /reset)", file=sys.stderr)
            continue
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
