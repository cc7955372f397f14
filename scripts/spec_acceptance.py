"""Prompt-lookup speculation on real text: acceptance rate, tokens per verify step and speedup.

Runs the input-grounded prompts of spec_prompts.json (summarize, rewrite, extract, edit code
given in the prompt) through the default model (SmolLM2-135M-Instruct) greedily, once plain and
once with `--speculate ngram`, all prompts batched in one run each; checks that the outputs are
the same and prints the figures for BENCHMARKS.md.

    uv run --frozen python scripts/spec_acceptance.py [--device cpu] [--max-new 64] [--k 16] [--n 3]
                                                      [--quantization auto|fp8|int8|none]

`--quantization` as the apps take it (auto: int8 on the CPU, none on CUDA); the default is none
(the unquantized model), with which every earlier figure and trace was taken.

With `--one-at-a-time --trace FILE` the trace also counts the plain steps the engine planned
only after resolving the step before (it waited for a draft that did not come): at batch 1
those are the steps that lose the overlap, which the replay costs unoverlapped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sv_engine import Engine, SamplingParams
from sv_engine.default_model import default_model_dir
from sv_engine.options import resolve_quantization
from sv_kernels.quantized import QUANT_KINDS
from sv_scheduler import SpeculationConfig
from sv_scheduler.speculation import DraftState

PROMPTS = Path(__file__).with_name("spec_prompts.json")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--k", type=int, default=SpeculationConfig().max_draft)
    p.add_argument("--n", type=int, default=SpeculationConfig().ngram)
    p.add_argument("--prompts", type=Path, default=PROMPTS, help="the prompts (a JSON list)")
    p.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    p.add_argument(
        "--quantization",
        default="none",
        choices=("auto", *QUANT_KINDS, "none"),
        help="the weights' type, as the apps take it (auto: int8 on the CPU, none on CUDA); "
        "default none",
    )
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="run the prompts one by one (batch 1) instead of all in one batch",
    )
    p.add_argument(
        "--trace",
        type=Path,
        help="write the acceptance trace here (JSON: output tokens, requests, and (drafted, "
        "accepted) per verification), for `sv bench --only spec --spec-trace FILE`",
    )
    args = p.parse_args()
    prompts = json.loads(args.prompts.read_text())
    if args.limit:
        prompts = prompts[: args.limit]
    model = default_model_dir()
    quantization = resolve_quantization(args.quantization, args.device)
    print(f"weights: {quantization or 'unquantized'} on {args.device}", flush=True)
    params = SamplingParams(max_new_tokens=args.max_new)
    # Every verification's (drafted, accepted), as the drafters record them.
    verifications: list[tuple[int, int]] = []
    record = DraftState.record

    def recording(state: DraftState, drafted: int, accepted: int, step: int) -> None:
        verifications.append((drafted, accepted))
        record(state, drafted, accepted, step)

    DraftState.record = recording  # type: ignore[method-assign,assignment]
    # Plain decode steps planned after the step before was resolved (previous=None).
    resolved_plain = {"plain": 0, "ngram": 0}
    launch_next = Engine._launch_next

    def launching(engine: Engine, previous: Any) -> Any:
        launched = launch_next(engine, previous)
        plan = None if launched is None else launched.plan
        if previous is None and plan is not None and plan.decodes and not plan.num_draft_tokens:
            resolved_plain["plain" if engine.scheduler.config.speculation is None else "ngram"] += 1
        return launched

    Engine._launch_next = launching  # type: ignore[method-assign,assignment]
    results = {}
    for name, spec in (
        ("plain", None),
        ("ngram", SpeculationConfig(max_draft=args.k, ngram=args.n)),
    ):
        engine = Engine.from_model_dir(
            model, device=args.device, speculation=spec, quantization=quantization
        )
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=2))  # warm
        before = engine.stats
        t0 = time.perf_counter()
        if args.one_at_a_time:
            completions = [engine.generate([prompt], params)[0] for prompt in prompts]
        else:
            completions = engine.generate(prompts, params)
        seconds = time.perf_counter() - t0
        s = engine.stats
        results[name] = (completions, seconds, s.steps - before.steps, s, before)
        print(f"{name}: done in {seconds:.1f} s", flush=True)
    plain, ngram = results["plain"], results["ngram"]
    same = [a.output_ids == b.output_ids for a, b in zip(plain[0], ngram[0], strict=True)]
    tokens = sum(len(c.output_ids) for c in plain[0])
    s, b = ngram[3], ngram[4]
    drafted = s.drafted_tokens - b.drafted_tokens
    accepted = s.accepted_tokens - b.accepted_tokens
    verifies = s.verifications - b.verifications
    print(
        f"prompts {len(prompts)}, output tokens {tokens}, identical outputs {sum(same)}/{len(same)}"
    )
    print(f"plain: {plain[2]} steps, {plain[1]:.1f} s, {tokens / plain[1]:.1f} tok/s")
    print(f"ngram: {ngram[2]} steps, {ngram[1]:.1f} s, {tokens / ngram[1]:.1f} tok/s")
    print(
        f"drafted {drafted}, accepted {accepted} ({accepted / max(drafted, 1):.1%}), "
        f"{verifies} verifications, {1 + accepted / max(verifies, 1):.2f} tokens per verify step"
    )
    print(f"speedup {plain[1] / ngram[1]:.2f}x wall, {plain[2] / ngram[2]:.2f}x fewer steps")
    print(
        f"decode steps planned after resolving the one before, without a draft: plain "
        f"{resolved_plain['plain']}, ngram {resolved_plain['ngram']}"
    )
    if args.trace is not None:
        trace = {
            "model": "SmolLM2-135M-Instruct",
            "prompts": args.prompts.name,
            "max_new_tokens": args.max_new,
            "max_draft": args.k,
            "ngram": args.n,
            "requests": len(prompts),
            "output_tokens": tokens,
            "verifications": verifications,
        }
        if args.one_at_a_time:
            trace["resolved_plain_steps"] = resolved_plain["ngram"]
        args.trace.write_text(json.dumps(trace) + "\n")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
