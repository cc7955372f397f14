"""`sv chat`: interactive multi-turn chat, streamed.

Every turn re-encodes the whole dialog; the prefix cache recognises the pages of the turns
before, so only the new turn is prefilled.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from sv_engine.options import add_engine_arguments, positive_int

from sv_cli.common import add_sampling_arguments, open_engine, pool_hint, sampling_params

HELP = "commands: /reset (start over), /exit (or Ctrl-D). Ctrl-C stops a response."


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
        "--max-new",
        type=positive_int,
        default=512,
        metavar="N",
        help="output-token limit per response (default 512)",
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
        if text == "/exit":
            return 0
        if text == "/reset":
            dialog = fresh()
            print("(conversation reset)", file=out)
            continue
        dialog.append(Message("user", text))
        reply: list[str] = []
        try:
            for event in engine.stream([dialog], params):
                reply.append(event.text)
                out.write(event.text)
                out.flush()
        except KeyboardInterrupt:
            out.write(" [stopped]")
        except (EngineError, AdmissionError, TokenizerError) as e:
            dialog.pop()
            print(f"sv chat: {e}{pool_hint(e, engine)} (try /reset)", file=out)
            continue
        print(file=out)
        dialog.append(Message("assistant", "".join(reply)))
