"""What a speculation policy would give at batch 1, modelled over the real model's greedy outputs.

Greedy speculation's output is plain decoding's, so for a fixed set of greedy outputs every
draft's accepted run follows from the outputs alone: this script runs the default model once
(plain, greedy, all of spec_prompts.json in one batch, on the CPU), then replays the drafter of
sv_scheduler (`DraftState`: `may_draft`, `propose`, `record`, exactly as the scheduler calls
them one sequence at a time) over each output, and costs each step as the engine would run it
at batch 1: a plain step the engine overlapped at the overlapped plain step's cost, a plain
step planned after resolving the one before (it waited for a draft that did not come) at the
resolved plain step's, and a verify step at the verify step's (about flat in k on the H200).
A model, not a measurement: the costs are arguments, taken from `sv bench --only spec` runs
(a verify step of k draft tokens costs `--verify-ms` + (k - 1) x `--verify-ms-per-token`).

`--grid` models every policy of a grid of settings and prints the best: choose on one prompt
set (`--prompts scripts/spec_prompts_heldout.json`) and check the choice on the other, so the
figure reported for spec_prompts.json is not that of a policy fitted to it.

    uv run --frozen python scripts/spec_policy_model.py [--prompts FILE] [--outputs FILE]
        [--k 4,8,15] [--overlapped-ms 0.813] [--resolved-ms 1.03] [--verify-ms 1.30]
        [--verify-ms-per-token 0] [--grid]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from sv_scheduler import SpeculationConfig
from sv_scheduler.speculation import DraftState, accepted_run

PROMPTS = Path(__file__).with_name("spec_prompts.json")


@dataclass
class Costs:
    overlapped: float
    resolved: float
    verify: float  # a verify step of one draft token
    verify_per_token: float = 0.0  # each further draft token

    def verify_step(self, drafted: int) -> float:
        return self.verify + (drafted - 1) * self.verify_per_token


def greedy_outputs(prompts: Path, max_new: int) -> list[tuple[list[int], list[int]]]:
    from sv_engine import Engine, SamplingParams
    from sv_engine.default_model import default_model_dir

    engine = Engine.from_model_dir(default_model_dir(), device="cpu")
    done = engine.generate(json.loads(prompts.read_text()), SamplingParams(max_new_tokens=max_new))
    return [(c.prompt_ids, c.output_ids) for c in done]


def model(
    outputs: list[tuple[list[int], list[int]]], cfg: SpeculationConfig, costs: Costs, max_new: int
) -> dict[str, float]:
    decoded = ms = 0.0
    counts = {"verify": 0, "accepted": 0, "drafted": 0, "overlapped": 0, "resolved": 0}
    for prompt, out in outputs:
        state = DraftState(cfg)
        tokens = [*prompt, *out[:1]]  # the first token comes from the prefill
        finish_len = len(prompt) + max_new
        i, step = 1, 1
        while i < len(out):
            step += 1
            # The engine plans this step before the newest token is known unless it may draft.
            if not state.may_draft(tokens[:-1], step):
                ms += costs.overlapped
                counts["overlapped"] += 1
                tokens.append(out[i])
                i += 1
                continue
            limit = min(state.k, finish_len - len(tokens) - 1)
            draft = state.propose(tokens, limit, step) if limit > 0 else []
            if not draft:
                ms += costs.resolved
                counts["resolved"] += 1
                tokens.append(out[i])
                i += 1
                continue
            accepted = accepted_run(draft, out[i:])
            kept = min(1 + accepted, len(out) - i)
            state.record(len(draft), accepted, step)
            ms += costs.verify_step(len(draft))
            counts["verify"] += 1
            counts["accepted"] += accepted
            counts["drafted"] += len(draft)
            tokens += out[i : i + kept]
            i += kept
        decoded += len(out) - 1
    return {"speedup": decoded * costs.overlapped / ms, "decoded": decoded, **counts}


GRID = {
    "ngram": (3, 4, 5),
    "min_ngram": (1, 2, 3),
    "miss_limit": (2, 4, 6, 8),
    "first_pause": (2, 4, 8, 16),
}


def grid(
    outputs: list[tuple[list[int], list[int]]], costs: Costs, ks: list[int], max_new: int
) -> int:
    """Every setting of GRID at each k, best first; the defaults' row marked."""
    rows = []
    names = list(GRID)
    for k in ks:
        for values in itertools.product(*GRID.values()):
            settings = dict(zip(names, values, strict=True))
            if settings["min_ngram"] > settings["ngram"]:
                continue
            cfg = SpeculationConfig(max_draft=k, **settings)
            rows.append((model(outputs, cfg, costs, max_new)["speedup"], k, settings))
    default = SpeculationConfig()
    rows.sort(key=lambda r: -r[0])
    for rank, (speedup, k, settings) in enumerate(rows):
        is_default = k == default.max_draft and all(
            getattr(default, n) == v for n, v in settings.items()
        )
        if rank < 15 or is_default:
            mark = "  <- the defaults" if is_default else ""
            print(f"{rank + 1:4d}. {speedup:.3f}x k={k} {settings}{mark}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=Path, default=PROMPTS, help="the prompts (a JSON list)")
    p.add_argument(
        "--outputs", type=Path, help="greedy outputs JSON of --prompts (written on first use)"
    )
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--k", default="4,8,15", help="max_draft values to model")
    p.add_argument("--overlapped-ms", type=float, default=0.813)
    p.add_argument("--resolved-ms", type=float, default=1.03)
    p.add_argument("--verify-ms", type=float, default=1.30)
    p.add_argument("--verify-ms-per-token", type=float, default=0.0)
    p.add_argument("--grid", action="store_true", help="model a grid of policies at --k")
    args = p.parse_args()
    if args.outputs is not None and args.outputs.exists():
        outputs = [(a, b) for a, b in json.loads(args.outputs.read_text())]
    else:
        outputs = greedy_outputs(args.prompts, args.max_new)
        if args.outputs is not None:
            args.outputs.write_text(json.dumps(outputs))
    costs = Costs(args.overlapped_ms, args.resolved_ms, args.verify_ms, args.verify_ms_per_token)
    if args.grid:
        return grid(outputs, costs, [int(v) for v in args.k.split(",")], args.max_new)
    for k in (int(v) for v in args.k.split(",")):
        for label, cfg in (
            ("defaults", SpeculationConfig(max_draft=k)),
            (
                "min_ngram 1, pause after 2 misses",
                SpeculationConfig(max_draft=k, min_ngram=1, miss_limit=2),
            ),
        ):
            r = model(outputs, cfg, costs, args.max_new)
            print(
                f"k={k:2d} {label:32s} {r['speedup']:.3f}x plain: {r['verify']:.0f} verify steps, "
                f"{r['accepted']:.0f} of {r['drafted']:.0f} drafted accepted, plain steps "
                f"{r['overlapped']:.0f} overlapped and {r['resolved']:.0f} resolved "
                f"({r['decoded']:.0f} tokens decoded)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
