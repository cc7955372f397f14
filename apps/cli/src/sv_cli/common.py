"""Options and helpers shared by the commands that load a model."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sv_engine import Engine, SamplingParams


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        metavar="DIR",
        help="model folder (config.json, model.safetensors, tokenizer); "
        "default: the embedded SmolLM2-135M-Instruct",
    )
    p.add_argument(
        "--kv-cache-mib",
        type=float,
        metavar="N",
        help="KV-cache pool size in MiB (default: most free GPU memory, or 256 MiB on the CPU)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (default: CUDA when present), cuda or cpu"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="context limit in tokens (default: the model's, capped by the pool)",
    )


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)"
    )
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="1.0 = off (default)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed")


def sampling_params(args: argparse.Namespace, max_new: int) -> SamplingParams:
    from sv_engine import SamplingParams

    return SamplingParams(
        max_new_tokens=max_new,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )


def open_engine(args: argparse.Namespace, **overrides: Any) -> Engine | None:
    """Load the engine for --model (or the embedded default); None after printing an error."""
    from sv_engine import Engine, EngineError
    from sv_weights import WeightsError, default_model_dir

    try:
        model_dir = args.model
        if model_dir is None:
            model_dir = default_model_dir(progress=lambda message: print(message, file=sys.stderr))
        return Engine.from_model_dir(
            model_dir,
            device=args.device,
            kv_cache_mib=args.kv_cache_mib,
            max_model_len=args.max_model_len,
            **overrides,
        )
    except (EngineError, WeightsError) as e:
        print(f"sv: error: {e}", file=sys.stderr)
        return None
