"""`sv generate`: each PROMPT is an Instruct user message; MAX_NEW applies to every prompt."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, TextIO

from sv_engine.options import add_engine_arguments, positive_int
from sv_engine.params import MAX_LOGPROBS
from sv_tokenizer import TokenizerError, check_utf8

from sv_cli import logprobs_view
from sv_cli.common import (
    add_sampling_arguments,
    flag_named,
    open_engine,
    pool_hint,
    sampling_params,
    uninterrupted,
)

DEFAULT_MAX_NEW = 128
# A second argument that starts like a number and holds no space is meant as MAX_NEW (so
# `Hi 1e3` or `Hi 10**9` is an error, not a second prompt); anything else is a prompt.
_NUMBER_LIKE = re.compile(r"[+-]?\.?\d\S*")
_DIGITS = re.compile(r"\d+")

GRAMMAR = (
    "The second argument is MAX_NEW, the output-token limit of every prompt (default "
    f"{DEFAULT_MAX_NEW}), when it starts like a number (a digit, or a sign or point and a digit) "
    "and has no spaces; it must then be a positive integer (`Hi 1e3`, `Hi 0` are errors). Any "
    "other argument is a prompt. With -n/--max-new-tokens every argument is a prompt. A "
    'PROMPT of "-" is read from standard input (`cat question.txt | sv generate - 64`).'
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="generate a response to each PROMPT",
        description=(
            "Generate a response to each PROMPT (an Instruct user message). "
            + GRAMMAR
            + " One prompt streams to the terminal; several are batched and printed as they "
            "finish, each with its request number (1 for the first prompt) and token ids."
        ),
        usage="sv generate [options] PROMPT [MAX_NEW] [PROMPT ...]",
    )
    add_engine_arguments(p, admission="conservative")
    p.add_argument(
        "-n",
        "--max-new-tokens",
        type=positive_int,
        metavar="N",
        help=f"output-token limit of every prompt (default {DEFAULT_MAX_NEW}); every "
        "positional argument is then a prompt",
    )
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
    p.add_argument(
        "--logprobs",
        type=_logprobs_count,
        default=None,
        metavar="K",
        help=f"after each response, every token's probability and the K most likely "
        f"alternatives at its position (0..{MAX_LOGPROBS})",
    )
    p.add_argument("items", nargs="+", metavar="PROMPT", help="PROMPT [MAX_NEW] [PROMPT ...]")
    p.set_defaults(handler=run)


def _logprobs_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= MAX_LOGPROBS:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_LOGPROBS}, got {value}")
    return value


def split_prompts(
    items: list[str], max_new_tokens: int | None = None, stdin: TextIO | None = None
) -> tuple[list[str], int]:
    """The prompts and MAX_NEW of `PROMPT [MAX_NEW] [PROMPT ...]` (see GRAMMAR); with
    `max_new_tokens` (-n) given, every item is a prompt. A PROMPT of "-" is `stdin`'s whole
    text (as for cat; once: a second "-" would read nothing), less its final newline."""
    prompts = list(items)
    if prompts.count("-") > 1:
        raise ValueError('"-" (the prompt from standard input) may be given once')
    max_new = DEFAULT_MAX_NEW if max_new_tokens is None else max_new_tokens
    # MAX_NEW is read from the items as given: standard input's text is a prompt, even "7".
    if max_new_tokens is None and len(prompts) >= 2 and _NUMBER_LIKE.fullmatch(prompts[1]):
        text = prompts.pop(1)
        if not _DIGITS.fullmatch(text) or int(text) < 1:
            raise ValueError(
                f"MAX_NEW must be a positive integer, got {text!r} (to send it as a prompt, "
                "give the limit with -n N)"
            )
        max_new = int(text)
    if "-" in prompts:
        text = (stdin or sys.stdin).read()
        prompts[prompts.index("-")] = text[:-1] if text.endswith("\n") else text
    for number, prompt in enumerate(prompts, start=1):
        if not prompt.strip():
            raise ValueError(f"request {number} rejected: the prompt is empty")
        try:
            check_utf8(prompt, f"request {number}'s prompt")
        except TokenizerError as e:
            raise ValueError(str(e)) from None
    return prompts, max_new


def run(args: argparse.Namespace) -> int:
    from sv_engine import EngineError
    from sv_engine.tracing import stop_trace
    from sv_scheduler import AdmissionError
    from sv_tokenizer import TokenizerError

    try:
        prompts, max_new = split_prompts(args.items, args.max_new_tokens, sys.stdin)
        params = replace(sampling_params(args, max_new), logprobs=args.logprobs)
        engine = open_engine(args, policy=args.policy)
    except (ValueError, EngineError) as e:
        print(f"sv generate: error: {e}", file=sys.stderr)
        return 2
    try:
        prompt_ids = [engine.encode_prompt(prompt) for prompt in prompts]
        events = engine.stream(prompt_ids, params)  # queues them all: a refusal is raised here
        _note_lowered_max_new(engine, prompt_ids, max_new)
        if len(prompts) == 1:
            _stream_one(engine, events, sys.stdout)
        else:
            _run_many(engine, events)
    except (EngineError, AdmissionError, TokenizerError) as e:
        print(f"sv generate: error: {flag_named(e)}{pool_hint(e, engine)}", file=sys.stderr)
        return 2
    finally:
        with uninterrupted():
            engine.cancel_all()  # Ctrl-C lands here too: every page goes back before exit
            try:
                stop_trace(engine)  # (raises the error of a trace write that failed mid-run)
            finally:
                if args.stats:  # the requests finished all the same
                    print_stats(engine)
    return 0


def _note_lowered_max_new(engine: Any, prompt_ids: list[list[int]], max_new: int) -> None:
    """One line on stderr for each request whose MAX_NEW the context cut short (the scheduler
    clamps it silently): otherwise its finish=length comes early without a word."""
    from sv_scheduler import clamp_max_new_tokens

    context = engine.scheduler.config.max_model_len
    for number, ids in enumerate(prompt_ids, start=1):
        used = clamp_max_new_tokens(len(ids), max_new, context)
        if used < max_new:
            print(
                f"sv generate: note: request {number}: MAX_NEW {max_new} lowered to {used}, all "
                f"that the context of {context} tokens leaves after its {len(ids)}-token prompt",
                file=sys.stderr,
            )


def _stream_one(engine: Any, events: Iterator[Any], out: TextIO) -> None:
    line_open = False  # the streamed text has started a line it has not ended
    try:
        for event in events:
            if event.text:
                line_open = not event.text.endswith("\n")  # first: Ctrl-C may land in write()
                out.write(event.text)
                out.flush()
            if event.completion is not None:
                c = event.completion
                print(
                    f"\n[request {c.request_id}] finish={c.finish_reason} ids={c.output_ids}",
                    file=out,
                )
                line_open = False
                _print_logprobs(engine, c, out)
    except KeyboardInterrupt:
        if line_open:  # what follows (--stats) starts on a line of its own
            out.write("\n")
        raise


def _run_many(engine: Any, events: Iterator[Any]) -> None:
    for event in events:
        c = event.completion
        if c is not None:
            print(f"=== request {c.request_id} (finish={c.finish_reason}) ===")
            print(c.text)
            print(f"ids={c.output_ids}")
            _print_logprobs(engine, c, sys.stdout)
            sys.stdout.flush()


def _print_logprobs(engine: Any, completion: Any, out: TextIO) -> None:
    if completion.logprobs is not None:
        print("logprobs (token, its probability, the top alternatives):", file=out)
        for line in logprobs_view.lines(engine.tokenizer, completion.logprobs):
            print(line, file=out)


def print_stats(engine: Any) -> None:
    s = engine.stats
    rows = [
        ("pool size", f"{s.pool_pages} pages of {engine.runner.page_size} tokens"),
        ("peak active requests", s.peak_running),
        ("largest decode batch", s.largest_decode_batch),
        ("peak assigned pages", s.peak_assigned_pages),
        ("admission waits", s.admission_waits),
        ("prefix-cache hit tokens", s.prefix_cache_hit_tokens),
        ("preemptions", f"{s.preemptions} ({s.recomputed_tokens} tokens recomputed)"),
        ("final free pages", s.free_pages),
    ]
    if s.verifications:
        rows.append(
            (
                "speculation",
                f"{s.drafted_tokens} drafted, {s.accepted_tokens} accepted "
                f"({s.accepted_tokens / s.drafted_tokens:.0%}), "
                f"{1 + s.accepted_tokens / s.verifications:.2f} tokens per verify step",
            )
        )
    print("--- stats ---")
    width = max(len(label) for label, _ in rows) + 2  # the values in one column
    for label, value in rows:
        print(f"{label + ':':<{width}}{value}")
