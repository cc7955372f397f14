"""`sv generate`: each PROMPT is an Instruct user message; MAX_NEW applies to every prompt."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from sv_engine.options import add_engine_arguments

from sv_cli.common import add_sampling_arguments, open_engine, sampling_params

DEFAULT_MAX_NEW = 128
_INTEGER = re.compile(r"[+-]?\d+")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="generate a response to each PROMPT",
        description=(
            "Generate a response to each PROMPT (an Instruct user message). MAX_NEW, the "
            f"output-token limit, defaults to {DEFAULT_MAX_NEW} and applies to every prompt. "
            "One prompt streams to the terminal; several are batched and printed as they finish."
        ),
        usage="sv generate [options] PROMPT [MAX_NEW] [PROMPT ...]",
    )
    add_engine_arguments(p, admission="conservative")
    policy = p.add_mutually_exclusive_group()
    policy.add_argument(
        "--continuous",
        dest="policy",
        action="store_const",
        const="continuous",
        help="admit requests as soon as their page budget fits (default)",
    )
    policy.add_argument(
        "--static",
        dest="policy",
        action="store_const",
        const="static",
        help="admit the next group only when the current group has finished",
    )
    p.set_defaults(policy="continuous")
    p.add_argument(
        "--stats",
        action="store_true",
        help="print KV-pool and batching statistics at the end",
    )
    add_sampling_arguments(p)
    p.add_argument("items", nargs="+", metavar="PROMPT", help="PROMPT [MAX_NEW] [PROMPT ...]")
    p.set_defaults(handler=run)


def split_prompts(items: list[str]) -> tuple[list[str], int]:
    """PROMPT [MAX_NEW] [PROMPT ...]: the second item is MAX_NEW when it is an integer."""
    prompts = list(items)
    max_new = DEFAULT_MAX_NEW
    if len(prompts) >= 2 and _INTEGER.fullmatch(prompts[1].strip()):
        max_new = int(prompts.pop(1))
        if max_new < 1:
            raise ValueError(f"MAX_NEW must be a positive integer, got {max_new}")
    for i, prompt in enumerate(prompts):
        if not prompt.strip():
            raise ValueError(f"prompt {i + 1} is empty")
    return prompts, max_new


def run(args: argparse.Namespace) -> int:
    from sv_engine import EngineError
    from sv_scheduler import AdmissionError

    try:
        prompts, max_new = split_prompts(args.items)
        params = sampling_params(args, max_new)
    except (ValueError, EngineError) as e:
        print(f"sv generate: error: {e}", file=sys.stderr)
        return 2
    engine = open_engine(args, policy=args.policy)
    if engine is None:
        return 2
    try:
        if len(prompts) == 1:
            _stream_one(engine, prompts[0], params)
        else:
            _run_many(engine, prompts, params)
    except (EngineError, AdmissionError) as e:
        print(f"sv generate: error: {e}", file=sys.stderr)
        return 2
    finally:
        engine.cancel_all()  # Ctrl-C lands here too: every page goes back before exit
        if args.stats:
            print_stats(engine)
    return 0


def _stream_one(engine: Any, prompt: str, params: Any) -> None:
    for event in engine.stream([prompt], params):
        sys.stdout.write(event.text)
        sys.stdout.flush()
        if event.completion is not None:
            c = event.completion
            print(f"\n[request {c.request_id}] finish={c.finish_reason} ids={c.output_ids}")


def _run_many(engine: Any, prompts: list[str], params: Any) -> None:
    for event in engine.stream(prompts, params):
        c = event.completion
        if c is not None:
            print(f"=== request {c.request_id} (finish={c.finish_reason}) ===")
            print(c.text)
            print(f"ids={c.output_ids}")
            sys.stdout.flush()


def print_stats(engine: Any) -> None:
    s = engine.stats
    print("--- stats ---")
    print(f"pool size:              {s.pool_pages} pages of {engine.runner.page_size} tokens")
    print(f"peak active requests:   {s.peak_running}")
    print(f"largest decode batch:   {s.largest_decode_batch}")
    print(f"peak assigned pages:    {s.peak_assigned_pages}")
    print(f"admission waits:        {s.admission_waits}")
    print(f"prefix-cache hit tokens:{s.prefix_cache_hit_tokens:>7}")
    print(f"preemptions:            {s.preemptions} ({s.recomputed_tokens} tokens recomputed)")
    print(f"final free pages:       {s.free_pages}")
