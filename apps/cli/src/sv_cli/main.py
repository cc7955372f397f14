"""The `sv` command: generate, chat, tokenize, weights inspect, bench, serve."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from sv_engine.options import OneLineErrorParser

EXIT_INTERRUPTED = 130


def build_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(
        prog="sv",
        description="sv: a from-scratch LLM inference engine (Llama architecture, paged KV cache).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    sub.required = True

    from sv_cli import generate as generate_cmd

    generate_cmd.add_parser(sub)
    from sv_cli import chat as chat_cmd

    chat_cmd.add_parser(sub)
    sub.add_parser(
        "tokenize",
        help="encode text to token ids (or --decode ids to text)",
        add_help=False,
        prefix_chars="\0",
    ).add_argument("rest", nargs=argparse.REMAINDER)
    weights = sub.add_parser("weights", help="checkpoint tools: `sv weights inspect PATH`")
    weights_sub = weights.add_subparsers(dest="weights_command", metavar="SUBCOMMAND")
    weights_sub.required = True
    weights_sub.add_parser(
        "inspect",
        help="list a safetensors file's or model folder's tensors",
        add_help=False,
        prefix_chars="\0",
    ).add_argument("rest", nargs=argparse.REMAINDER)
    sub.add_parser(
        "bench",
        help="benchmarks (see `sv bench --help`)",
        add_help=False,
        prefix_chars="\0",
    ).add_argument("rest", nargs=argparse.REMAINDER)
    # sv-server: `sv serve` is delegated whole to sv_server.cli.serve_main.
    sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (see `sv serve --help`)",
        add_help=False,
        prefix_chars="\0",
    ).add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _delegate(main: Callable[[list[str]], int], rest: list[str]) -> int:
    return main(rest)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "tokenize":
            from sv_tokenizer.cli import tokenize_main

            return _delegate(tokenize_main, args.rest)
        if args.command == "weights":
            from sv_weights import inspect_main

            return _delegate(inspect_main, args.rest)
        if args.command == "bench":
            from sv_cli.bench import bench_main

            return _delegate(bench_main, args.rest)
        if args.command == "serve":  # sv-server
            from sv_server.cli import serve_main

            return _delegate(serve_main, args.rest)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except KeyboardInterrupt:
        print("\nsv: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
