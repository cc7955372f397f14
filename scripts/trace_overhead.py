"""What `--trace` costs: the same batch generated with tracing off and on, interleaved.

    uv run python scripts/trace_overhead.py [--device cpu|cuda] [--model DIR] [--repeats N]

Tracing off, the engine's hooks are an `is None` test each (four per step, one in the runner);
on, every step writes a JSON line and computes the top-5 logprobs of its sampled rows. Prints
the time spent inside the recorder's hooks as a share of a traced run (robust on a busy
machine: both sides slow down alike), and each A/B run's wall time and process CPU time (all threads; less sensitive than wall time to a
machine shared with other work), and the overhead of the best traced run over the best
untraced one in both.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sv_engine import Engine, SamplingParams
from sv_engine.default_model import default_model_dir
from sv_engine.tracing import start_trace, stop_trace

PROMPTS = [
    "Write a haiku about the sea.",
    "Name three rivers of Europe.",
    "What is 2 + 2?",
    "Explain what a page table is.",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--repeats", type=int, default=3, help="A/B pairs (0: only the hook share)")
    p.add_argument("--max-new", type=int, default=64)
    args = p.parse_args()
    model = Path(args.model) if args.model else default_model_dir()
    engine = Engine.from_model_dir(model, device=args.device)
    params = SamplingParams(max_new_tokens=args.max_new, ignore_eos=True)
    tokens = len(PROMPTS) * args.max_new
    with tempfile.TemporaryDirectory() as folder:
        share = hook_share(engine, Path(folder) / "hooks.jsonl", params)
    print(f"time inside the trace hooks: {100 * share:.2f}% of a traced run", flush=True)
    if args.repeats < 1:
        return
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.repeats):
            for traced in (False, True):
                engine.clear_prefix_cache()
                if traced:
                    start_trace(engine, Path(folder) / f"t{i}.jsonl", model=str(model))
                started, cpu = time.perf_counter(), time.process_time()
                engine.generate(PROMPTS, params)
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
                stop_trace(engine)
                times[traced].append((elapsed, cpu))
                label = "on " if traced else "off"
                print(
                    f"run {i} trace {label}: wall {elapsed:.3f} s ({tokens / elapsed:.1f} tok/s), "
                    f"cpu {cpu:.3f} s",
                    flush=True,
                )
    for index, name in ((0, "wall"), (1, "cpu")):
        off = min(t[index] for t in times[False])
        on = min(t[index] for t in times[True])
        print(
            f"device {engine.runner.device}, {len(PROMPTS)} requests x {args.max_new} tokens, "
            f"best {name} time: off {off:.3f} s, on {on:.3f} s: tracing costs "
            f"{100 * (on / off - 1):+.1f}%"
        )


def hook_share(engine: Engine, path: Path, params: SamplingParams) -> float:
    """One traced run (it warms the engine up too), each recorder hook timed."""
    recorder = start_trace(engine, path, model="")
    spent = [0.0]

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        return wrapper

    for name in ("queued", "planned", "launched", "resolved", "cancelled"):
        setattr(recorder, name, timed(getattr(recorder, name)))
    engine.runner.logits_observer = timed(recorder.on_logits)
    started = time.perf_counter()
    engine.generate(PROMPTS, params)
    elapsed = time.perf_counter() - started
    stop_trace(engine)
    return spent[0] / elapsed


if __name__ == "__main__":
    main()
