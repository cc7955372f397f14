"""`sv serve`: load a model and serve it over HTTP (OpenAI's API) until interrupted."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from sv_engine.options import (
    OneLineErrorParser,
    add_engine_arguments,
    positive_float,
    positive_int,
)

if TYPE_CHECKING:
    from sv_tokenizer import Tokenizer

    from sv_server.serving import GracefulServer

EXIT_USAGE = 2
EXIT_FAILURE = 1
API_KEY_ENV = "SV_API_KEY"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _not_empty(what: str) -> Callable[[str], str]:
    """An argparse type: `text` unless blank (an unset shell variable, say), when the error
    names `what` the value would otherwise silently become; or not UTF-8 (a key or a name
    that no response or header can carry: every response was a 500, or the load a
    traceback)."""

    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"must not be empty ({what})")
        _check_utf8(text, "the value")
        return text

    return check


def _check_utf8(text: str, what: str) -> None:
    """An ArgumentTypeError if `text` holds bytes that were not UTF-8 (lone surrogates)."""
    from sv_tokenizer import TokenizerError, check_utf8

    try:
        check_utf8(text, what)
    except TokenizerError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def served_model_name(args: argparse.Namespace, model_dir: Path) -> str:
    """--served-model-name, else the model folder's name, a byte of which that is not UTF-8
    shown as U+FFFD (as a lone surrogate it failed every response that names the model)."""
    if args.served_model_name:
        return str(args.served_model_name)
    name = model_dir.resolve().name
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def build_parser() -> OneLineErrorParser:
    from sv_server.app import DEFAULT_MAX_QUEUE
    from sv_server.body import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_TIMEOUT_S
    from sv_server.reasoning import REASONING_PARSERS
    from sv_server.serving import DEFAULT_MAX_CONNECTIONS
    from sv_server.tool_parsers import TOOL_CALL_PARSERS

    p = OneLineErrorParser(
        prog="sv serve",
        description="Serve a model over an OpenAI-compatible HTTP API "
        "(/v1/completions, /v1/chat/completions, /v1/responses, /v1/models, /tokenize, "
        "/detokenize, /version, /health, /metrics, and a /dashboard page).",
    )
    p.add_argument(
        "model_dir",
        nargs="?",
        metavar="MODEL",
        help="model folder, as `vllm serve MODEL` takes it (the same as --model)",
    )
    add_engine_arguments(p, admission="preemptive")
    p.add_argument(
        "--host",
        type=_not_empty("an empty host would listen on every interface: say 0.0.0.0 for that"),
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every interface)",
    )
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument(
        "--max-queue",
        type=positive_int,
        default=DEFAULT_MAX_QUEUE,
        metavar="N",
        help=f"requests allowed to wait for admission; more get 429 (default {DEFAULT_MAX_QUEUE})",
    )
    p.add_argument(
        "--served-model-name",
        type=_not_empty("leave the flag out for the model folder's name"),
        metavar="NAME",
        help="the model id clients use (default: the model folder's name)",
    )
    p.add_argument(
        "--api-key",
        type=_not_empty("leave the flag out for no key"),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every /v1/* route and on /tokenize and "
        f"/detokenize (default: ${API_KEY_ENV}, else none); /health, /metrics and /version stay "
        "open",
    )
    p.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="N",
        help=f"largest request body; larger ones get 413 (default {DEFAULT_MAX_REQUEST_BYTES})",
    )
    p.add_argument(
        "--read-timeout",
        type=positive_float,
        default=DEFAULT_READ_TIMEOUT_S,
        metavar="S",
        help="seconds a client has to send its request headers, and then its body: a slow "
        f"body gets 408, slow headers a closed connection (default {DEFAULT_READ_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-connections",
        type=positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"connections served at once; past it, 503 (default {DEFAULT_MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--drain-seconds",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="on SIGINT/SIGTERM, let requests in flight finish for up to S seconds before "
        "ending them with an error; a second Ctrl-C ends the wait (default 0)",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        metavar="NAME",
        help="split each chat answer's thinking (between <think> and </think>) into "
        "message.reasoning and message.reasoning_content (vLLM's newer and older names), streamed "
        "as delta.reasoning and delta.reasoning_content, and the rest into "
        f"content, as vLLM's flag of that name: {' or '.join(REASONING_PARSERS)} (the same "
        "split; deepseek_r1 also takes an answer without <think> as thinking); the model's "
        "tokenizer must have the two tags; /v1/completions stays raw text (default: off)",
    )
    p.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        metavar="NAME",
        help="how the model writes tool calls, read into message.tool_calls and used to "
        f"constrain a required or named call, as vLLM's flag of that name: "
        f"{' or '.join(TOOL_CALL_PARSERS)} (default: hermes when the tokenizer has "
        "<tool_call> and </tool_call> tokens, as Qwen's do, else llama3_json)",
    )
    p.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a chat request's own `chat_template` field (a jinja template used instead "
        "of the model's, as vLLM's flag of that name); without it such a request gets 400: a "
        "template is the client's code run on the server",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe messages logged, by sv and by uvicorn (whose access log of "
        "every request is at info): one of %(choices)s (default %(default)s)",
    )
    return p


def wants_bos(model_dir: Path, tokenizer: Tokenizer) -> bool:
    """Whether raw-text prompts start with BOS, as the model's own tokenizer does it: yes when
    the tokenizer has a BOS token, unless tokenizer_config.json says `add_bos_token: false`
    (SmolLM2's `bos_token` is `<|im_start|>`, a chat marker that HF never prepends)."""
    if tokenizer.bos_id is None:
        return False
    config = model_dir / "tokenizer_config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, ValueError):
        data = {}
    return not (isinstance(data, dict) and data.get("add_bos_token") is False)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`sv serve`'s options; without --api-key, the key is $SV_API_KEY's (none when unset or
    empty; a blank one is an error that names the variable, not the flag)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model_dir is not None:
        if args.model is not None and args.model != args.model_dir:
            parser.error(f"give the model once: MODEL {args.model_dir!r} or --model {args.model!r}")
        args.model = args.model_dir
    from_env = os.environ.get(API_KEY_ENV, "")
    key_source = "--api-key" if args.api_key is not None else f"${API_KEY_ENV}"
    if args.api_key is None and from_env:
        if not from_env.strip():
            parser.error(f"${API_KEY_ENV} must not be blank (unset it, or give a key)")
        try:
            _check_utf8(from_env, f"${API_KEY_ENV}")
        except argparse.ArgumentTypeError as e:
            parser.error(str(e))
        args.api_key = from_env
    if args.api_key is not None and args.api_key != args.api_key.strip():
        # The key is compared with the header's token less its surrounding whitespace (which
        # HTTP drops anyway): such a key could never be sent, and every request got 401.
        parser.error(f"{key_source} must not start or end with whitespace (no client can send it)")
    return args


def serve_main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.log_level in ("debug", "info") and not _writable(sys.stdout):
        # Else every request's access line would fail, each a "Logging error" traceback.
        print(
            "sv serve: error: standard output is closed, and the access log of every request "
            "goes there: redirect it (>/dev/null to drop it) or pass --log-level warning",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    from sv_engine import EngineError
    from sv_engine.options import engine_from_args
    from sv_engine.tracing import stop_trace

    from sv_server.app import create_app
    from sv_server.reasoning import parser_for
    from sv_server.serving import build_server

    try:
        listeners = _listen(args.host, args.port)
    except (OSError, UnicodeError) as e:  # (UnicodeError: a name IDNA cannot encode, `a..b`)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        print(
            f"sv serve: error: cannot listen on {args.host} port {args.port} "
            f"(--host, --port): {reason}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    try:
        # --reasoning-parser needs the tokenizer's think tags: checked before the weights load.
        check = (
            None if args.reasoning_parser is None else partial(parser_for, args.reasoning_parser)
        )
        engine, model_dir = engine_from_args(args, check_tokenizer=check)
    except EngineError as e:
        for listener in listeners:
            listener.close()
        print(f"sv serve: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    name = served_model_name(args, model_dir)
    app = create_app(
        engine,
        model_name=name,
        max_queue=args.max_queue,
        add_bos=wants_bos(model_dir, engine.tokenizer),
        api_key=args.api_key,
        max_request_bytes=args.max_request_bytes,
        read_timeout_s=args.read_timeout,
        reasoning_parser=args.reasoning_parser,
        trust_request_chat_template=args.trust_request_chat_template,
        tool_call_parser=args.tool_call_parser,
    )
    tool_call_parser = app.state.server.tool_call_parser  # (the flag's, or the tokenizer's)
    print(
        f"sv serve: '{name}' on {base_url(args.host, listeners[0].getsockname()[1])}/v1 "
        f"(context {engine.runner.max_model_len} tokens, {engine.stats.pool_pages} KV pages, "
        f"{tool_call_parser} tool calls{', API key required' if args.api_key else ''})",
        file=sys.stderr,
    )
    pool_tokens = engine.stats.pool_pages * engine.runner.page_size
    if pool_tokens < engine.runner.max_model_len:
        # /v1/models advertises the context; a client sizing prompts by it should know.
        print(
            f"sv serve: note: the KV cache holds {pool_tokens:,} tokens in all, fewer than the "
            f"context: a request needing more is refused. Give the cache more memory "
            "(--kv-cache-mib) or set a shorter context (--max-model-len).",
            file=sys.stderr,
        )
    server = build_server(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        read_timeout_s=args.read_timeout,
        max_connections=args.max_connections,
        drain_s=args.drain_seconds,
    )
    status = _run_until_stopped(server, listeners)
    try:
        # The engine thread has stopped: nothing writes to the trace any more. (This raises
        # the error of a trace write that failed mid-run, for `sv` to report: after the line.)
        stop_trace(engine)
    finally:
        stats = engine.stats
        print(
            f"sv serve: stopped; {stats.free_pages} of {stats.pool_pages} KV pages free",
            file=sys.stderr,
        )
    return status


def _writable(stream: TextIO | None) -> bool:
    """Whether writing to `stream` can work: not a descriptor the process started without
    (None, or `sv`'s stand-in whose writes fail)."""
    if stream is None:
        return False
    try:
        stream.write("")
    except OSError:
        return False
    return True


def base_url(host: str, port: int) -> str:
    """The URL of the server at `host`:`port`, an IPv6 address in brackets (RFC 3986)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _listen(host: str, port: int) -> list[socket.socket]:
    """The server's sockets, bound as uvicorn's asyncio binds them (one per address `host`
    resolves to, SO_REUSEADDR), before the model loads: a port in use or a host not of this
    machine is refused at once in one line. Left to uvicorn, it came after the load, as
    uvicorn's log lines and its exit status 3."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # this address only, as asyncio binds it
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _run_until_stopped(server: GracefulServer, listeners: list[socket.socket]) -> int:
    """Serve on `listeners` until SIGINT or SIGTERM (exit status 0)."""
    # uvicorn shuts down cleanly on SIGINT and SIGTERM, then raises the signal again: let
    # SIGTERM be a KeyboardInterrupt too, so that both are a normal stop (exit 0), not a kill.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=listeners)
    return 0


def main() -> NoReturn:
    sys.exit(serve_main(sys.argv[1:]))
