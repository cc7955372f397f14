"""`sv bench --only grammar`: JSON-schema constrained decoding beside unconstrained, in one run.

decode-b1: one request (128-token prompt, 256 new tokens, greedy) with and without a JSON
schema; the target is constrained >= 0.9 of unconstrained. Throughput at batch 64: 64 requests
(prompts of 100-1024 random tokens, 256 new tokens each), with and without the schema. The
schema's free string keeps a random-weight model inside the grammar for the whole budget (it
rarely picks the closing quote), so both runs generate about as many tokens; the note gives the
counts. Unconstrained runs ignore EOS; a constrained run stops only at its grammar's end.
"""

from __future__ import annotations

import random
import time
from typing import Any

from sv_cli.bench.inputs import random_prompts, vocab_size
from sv_cli.bench.report import Report, Row

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "kind": {"enum": ["note", "task", "event"]},
        "text": {"type": "string"},
    },
    "required": ["id", "kind", "text"],
    "additionalProperties": False,
}


def bench_grammar(report: Report, engine: Any, new_tokens: int, batch: int) -> None:
    import importlib.util

    from sv_engine import SamplingParams
    from sv_engine.grammar import Grammar

    if importlib.util.find_spec("llguidance") is None:  # the rest of the run goes on
        print("[bench] grammar: skipped, llguidance is not installed (carry .grammar-deps)")
        return

    grammar = Grammar.json_schema(SCHEMA)
    plain = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    constrained = SamplingParams(max_new_tokens=new_tokens, grammar=grammar)
    rng = random.Random(2)
    vocab = vocab_size(engine)
    warm, prompt = random_prompts(rng, 2, 128, 128, vocab)
    figures = {}
    for name, params in (("plain", plain), ("json-schema", constrained)):
        engine.generate([warm], params)  # builds the grammar vocabulary once, off the clock
        engine.clear_prefix_cache()  # the second run's TTFT was the cached prompt's
        t0 = time.perf_counter()
        times = [time.perf_counter() for _event in engine.stream([prompt], params)]
        figures[name] = (len(times) - 1) / (times[-1] - times[0])
        ratio = f"; {figures[name] / figures['plain']:.3f} of unconstrained" if figures else ""
        report.add(
            Row(
                f"decode-b1 {name}",
                figures[name],
                "tok/s",
                note=f"TTFT {(times[0] - t0) * 1e3:.1f} ms, {len(times)} tokens{ratio}",
            )
        )
    prompts = random_prompts(random.Random(0), batch, 100, 1024, vocab)
    throughput = {}
    for name, params in (("plain", plain), ("json-schema", constrained)):
        engine.clear_prefix_cache()
        ids = {engine.add_request(p, params, stream_text=False) for p in prompts}
        t0 = time.perf_counter()
        tokens = 0
        while ids:
            for event in engine.step():
                tokens += event.token_id is not None
                if event.finished is not None:
                    ids.discard(event.request_id)
        wall = time.perf_counter() - t0
        throughput[name] = tokens / wall
        ratio = f"; {throughput[name] / throughput['plain']:.3f} of unconstrained"
        report.add(
            Row(
                f"throughput b{batch} {name}",
                throughput[name],
                "tok/s",
                note=f"{batch} requests, {tokens} tokens in {wall:.1f} s{ratio}",
            )
        )
