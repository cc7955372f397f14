"""`sv serve`: load a model and serve it over HTTP (OpenAI's API) until interrupted."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from sv_tokenizer import Tokenizer

EXIT_USAGE = 2
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> _Parser:
    from sv_server.app import DEFAULT_MAX_QUEUE

    p = _Parser(
        prog="sv serve",
        description="Serve a model over an OpenAI-compatible HTTP API "
        "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).",
    )
    p.add_argument(
        "--model",
        metavar="DIR",
        help="model folder (config.json, model.safetensors, tokenizer); "
        "default: the embedded SmolLM2-135M-Instruct",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument(
        "--kv-cache-mib",
        type=_positive_float,
        metavar="N",
        help="KV-cache pool size in MiB (default: most free GPU memory, or 256 MiB on the CPU)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (default: CUDA when present), cuda or cpu"
    )
    p.add_argument(
        "--max-model-len",
        type=_positive_int,
        metavar="N",
        help="context limit in tokens (default: the model's, capped by the pool)",
    )
    p.add_argument(
        "--max-queue",
        type=_positive_int,
        default=DEFAULT_MAX_QUEUE,
        metavar="N",
        help=f"requests allowed to wait for admission; more get 429 (default {DEFAULT_MAX_QUEUE})",
    )
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the model id clients use (default: the model folder's name)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
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


def serve_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    import uvicorn
    from sv_engine import Engine, EngineError
    from sv_weights import WeightsError, default_model_dir

    from sv_server.app import create_app

    try:
        model_dir = (
            Path(args.model)
            if args.model
            else default_model_dir(progress=lambda message: print(message, file=sys.stderr))
        )
        engine = Engine.from_model_dir(
            model_dir,
            device=args.device,
            kv_cache_mib=args.kv_cache_mib,
            max_model_len=args.max_model_len,
        )
    except (EngineError, WeightsError) as e:
        print(f"sv serve: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    name = args.served_model_name or model_dir.resolve().name
    app = create_app(
        engine,
        model_name=name,
        max_queue=args.max_queue,
        add_bos=wants_bos(model_dir, engine.tokenizer),
    )
    print(
        f"sv serve: '{name}' on http://{args.host}:{args.port}/v1 "
        f"(context {engine.runner.max_model_len} tokens, {engine.stats.pool_pages} KV pages)",
        file=sys.stderr,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
    )
    try:
        uvicorn.Server(config).run()
    except KeyboardInterrupt:
        # uvicorn shuts down cleanly on Ctrl-C / SIGINT, then re-raises the signal: a normal stop
        return 0
    except OSError as e:
        print(f"sv serve: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def main() -> NoReturn:
    sys.exit(serve_main(sys.argv[1:]))
