"""`sv bench --only logprobs`: what asking for top-20 log-probabilities costs, side by side.

decode-b1 (128-token prompt, 256 new tokens, greedy) and throughput (256 requests, 512 new
tokens) each run plain and with `logprobs=20`, twice in alternation, the best of each kept (a
slow stretch of the machine should not decide the ratio). The targets: decode-b1 with
logprobs >= 0.95 of plain, throughput >= 0.9.
"""

from __future__ import annotations

import random
import time
from typing import Any

from sv_cli.bench.inputs import random_prompts, vocab_size
from sv_cli.bench.report import Report, Row
from sv_cli.bench.workloads import bench_throughput

TOP = 20


def _decode_b1(engine: Any, prompt: list[int], new_tokens: int, logprobs: int | None) -> float:
    from sv_engine import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, logprobs=logprobs)
    times = [time.perf_counter() for _event in engine.stream([prompt], params)]
    return (len(times) - 1) / (times[-1] - times[0])


def bench_logprobs(report: Report, engine: Any, quick: bool) -> None:
    from sv_engine import SamplingParams

    rng = random.Random(1)
    # distinct: no prefix-cache hit; within the model's vocabulary
    warm, *prompts = random_prompts(rng, 5, 128, 128, vocab_size(engine))
    new_tokens = 64 if quick else 256
    for logprobs in (None, TOP):  # captures the logprob graphs before any timing
        engine.generate([warm], SamplingParams(max_new_tokens=8, logprobs=logprobs))
    best: dict[int | None, float] = {None: 0.0, TOP: 0.0}
    for i, logprobs in enumerate((None, TOP, None, TOP)):
        best[logprobs] = max(best[logprobs], _decode_b1(engine, prompts[i], new_tokens, logprobs))
    ratio = best[TOP] / best[None]
    report.add(Row("decode-b1 plain (logprobs pair)", best[None], "tok/s"))
    report.add(
        Row(f"decode-b1 logprobs top-{TOP}", best[TOP], "tok/s", note=f"{ratio:.3f} of plain")
    )

    count, new = (32, 64) if quick else (256, 512)
    runs: dict[int | None, float] = {None: 0.0, TOP: 0.0}
    for logprobs in (None, TOP, None, TOP):
        name = "throughput plain (logprobs pair)" if logprobs is None else f"throughput top-{TOP}"
        runs[logprobs] = max(
            runs[logprobs],
            bench_throughput(report, engine, name, count, False, new, logprobs=logprobs),
        )
    report.add(
        Row(
            f"throughput logprobs top-{TOP} / plain",
            runs[TOP] / runs[None],
            "ratio",
            note=f"best of 2: {runs[TOP]:,.0f} vs {runs[None]:,.0f} tok/s",
        )
    )
