"""What `--trace` costs: the same batch generated with tracing off and on, interleaved.

    uv run python scripts/trace_overhead.py [--device cpu|cuda] [--model DIR] [--repeats N]

Tracing off, the engine's hooks are an `is None` test each (four per step, one in the runner);
on, every step writes a JSON line and computes the top-5 logprobs of its sampled rows. Prints
each run's wall time and process CPU time (all threads; less sensitive than wall time to a
machine shared with other work), and the overhead of the best traced run over the best
untraced one in both.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

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
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new", type=int, default=64)
    args = p.parse_args()
    model = Path(args.model) if args.model else default_model_dir()
    engine = Engine.from_model_dir(model, device=args.device)
    params = SamplingParams(max_new_tokens=args.max_new, ignore_eos=True)
    tokens = len(PROMPTS) * args.max_new
    engine.generate(PROMPTS, params)  # warm-up
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


if __name__ == "__main__":
    main()
