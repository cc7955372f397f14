"""`sv bench --only spec`: what speculative decoding costs on the GPU at the benchmark's shapes.

- verify-b1 k=K (1..16): one sequence (128 tokens of context) feeding its newest token and K draft
  tokens, with a choice at every position, run as the engine runs it (K + 1 decode rows through
  the graph of their bucket), in ms per step beside the plain decode step (k=0). A draft of K
  tokens with a accepted pays when (1 + a) decode steps cost more than one verify step.
- decode-b1 --speculate ngram: the end-to-end decode-b1 figure with prompt-lookup speculation
  on, on random-token prompts, in turns with plain (best of 2 each); random weights accept next
  to nothing, so this is the cost of trying (a random context rarely ends in an n-gram seen
  before, so the loop mostly overlaps); the note gives drafted and accepted tokens. Target: at
  least 0.97x the plain decode-b1 row.
- throughput-b64 with and without --speculate ngram (run by `sv bench` itself): 64 requests of
  256 tokens. Target: the speculating row at least 0.97x the plain one. Beside it, the same
  without the batch limit (`--spec-max-batch 0`), and the pair at batch 32, where the default
  limit still drafts.
- decode-b1, acceptance trace replayed: random weights accept nothing real, so the acceptance
  the default model showed on the CPU (scripts/spec_acceptance.py --trace: drafted and accepted
  tokens of every verification on the input-grounded prompts) is replayed against the step
  costs measured above: tokens / (plain steps x the k=0 cost + each verification's k cost),
  reported against the measured (overlapped) plain decode-b1. Plain steps the engine planned
  after resolving the step before (it waited for a draft) are costed unoverlapped (launch +
  wait), the others at the plain decode-b1's time per token (see `replay_trace`). A model of
  the run, labelled as such, not an end-to-end measurement.
"""

from __future__ import annotations

import json
import random
import reprlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sv_cli.bench.report import Report, Row
from sv_cli.bench.timing import free_device_memory

# The longest draft whose verify step `bench_verify_steps` measures; a trace's drafts must fit.
MAX_MEASURED_DRAFT = 16


def bench_verify_steps(
    report: Report, engine: Any, max_k: int = MAX_MEASURED_DRAFT, profile_dir: Path | None = None
) -> list[float]:
    """The rows above; returns the ms per step for k = 0..max_k (launch + wait). Each row's
    note also gives, for the steps the decode graphs run (k < 16), the step's GPU time alone
    (its graph replayed back to back, no host work) and the host's time to launch its graph, so
    what a verify step adds splits into device and host. With `profile_dir`, the kernels of
    the k = 0 and k = 15 steps' graphs are profiled (`--profile`: where a verify step's extra
    GPU time goes)."""
    import torch
    from sv_model import StepInputs
    from sv_model.step_packing import DECODE_ROWS_MAX_CHUNK

    runner = engine.runner
    context = 128
    pages = -(-(context + max_k) // runner.page_size)
    runner.set_block_tables([(0, list(range(pages)))])
    rng = random.Random(2)
    tokens = [rng.randrange(runner.config.vocab_size) for _ in range(context + max_k)]
    costs: list[float] = []
    for k in range(max_k + 1):
        step = StepInputs(
            token_ids=tokens[context - 1 : context + k],
            positions=list(range(context - 1, context + k)),
            table_rows=[0],
            query_lens=[1 + k],
            seq_lens=[context + k],
            sample_rows=[0],
            logits_at=list(range(1 + k)) if k else None,
        )
        for _ in range(3):
            runner.launch(step).result()
        torch.cuda.synchronize()
        reps = 30
        t0 = time.perf_counter()
        for _ in range(reps):
            runner.launch(step).result()
        ms = (time.perf_counter() - t0) / reps * 1e3
        costs.append(ms)
        name = "decode-b1 step (graph), k=0" if k == 0 else f"verify-b1 step, k={k}"
        note = f"{ms / costs[0]:.2f}x the decode step; launch + wait"
        if 1 + k <= DECODE_ROWS_MAX_CHUNK:  # a longer run is packed, outside the graphs
            note += "; " + _graph_alone(runner, step, k, profile_dir)
        report.add(Row(name, ms, "ms", note=note))
    return costs


def _graph_alone(runner: Any, step: Any, k: int, profile_dir: Path | None) -> str:
    """The step's graph replayed 20 times back to back: its GPU time alone, and the host's time
    to launch it (queued without waiting; an unoverlapped step pays it before its GPU work)."""
    from sv_cli.bench.profiles import profile_steps
    from sv_cli.bench.runner import decode_replay
    from sv_cli.bench.timing import back_to_back, cuda_ms, replayed_ms

    replay = decode_replay(runner, step)
    replays = 20
    gpu_ms = replayed_ms(replay, replays)
    replay_all = back_to_back(replay, replays)
    t0 = time.perf_counter()
    replay_all()
    launch_ms = (time.perf_counter() - t0) / replays * 1e3
    # One replay from an idle GPU, event to event: near the GPU time alone if the GPU starts
    # while the host is still launching the graph, near the sum if it waits for the launch.
    idle_ms = cuda_ms(replay, iters=9, warmup=0)
    if profile_dir is not None and k in (0, 15):
        profile_steps(
            f"decode rows of a k={k} step, {replays} graph replays", replay_all, profile_dir
        )
    return (
        f"GPU alone {gpu_ms * 1e3:.0f} us, host launch {launch_ms * 1e3:.0f} us, one replay "
        f"from idle {idle_ms * 1e3:.0f} us"
    )


# What an acceptance trace (scripts/spec_acceptance.py --trace) must hold for `replay_trace`.
TRACE_KEYS = ("model", "requests", "output_tokens", "verifications")


@dataclass(frozen=True)
class AcceptanceTrace:
    """One acceptance trace, checked: `verifications` holds (drafted, accepted) per verify
    step, `resolved_plain_steps` the plain steps planned only after the step before was
    resolved (every plain step where the trace does not say)."""

    file_name: str
    model: str
    requests: int
    output_tokens: int
    verifications: list[tuple[int, int]]
    resolved_plain_steps: int

    @property
    def decoded(self) -> int:
        """Tokens from decode steps: each request's first token comes from its prefill."""
        return self.output_tokens - self.requests

    @property
    def plain_steps(self) -> int:
        """Decoded tokens not from a verification (each gives 1 + accepted)."""
        return self.decoded - sum(1 + a for _, a in self.verifications)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_trace(trace_file: Path) -> AcceptanceTrace:
    """The acceptance trace in `trace_file`, read once. Raises OSError (unreadable) or
    ValueError naming what is wrong: not JSON, a key of TRACE_KEYS missing, a count that is
    not a whole number, a verification that is not a [drafted, accepted] pair the bench can
    cost, more tokens verified than decoded, no decoded token, or more plain steps resolved
    than the trace has. `sv bench` calls it before any work starts, so a bad --spec-trace
    fails at once, not after the GPU workloads."""
    trace = json.loads(trace_file.read_text())
    if not isinstance(trace, dict):
        raise ValueError("not a JSON object")
    missing = [key for key in TRACE_KEYS if key not in trace]
    if missing:
        raise ValueError(f"no {', '.join(missing)} (a trace has {', '.join(TRACE_KEYS)})")
    for key in ("requests", "output_tokens"):
        if not _count(trace[key]):
            raise ValueError(f"{key} {reprlib.repr(trace[key])} is not a whole number >= 0")
    read = AcceptanceTrace(
        trace_file.name,
        str(trace["model"]),
        trace["requests"],
        trace["output_tokens"],
        _verifications(trace["verifications"]),
        resolved_plain_steps=0,
    )
    if read.decoded <= 0:
        raise ValueError(
            f"{read.output_tokens} output tokens of {read.requests} requests leave no decoded "
            "token to replay (each request's first token comes from its prefill)"
        )
    if read.plain_steps < 0:
        raise ValueError(
            f"its verifications give more tokens than the {read.decoded} decoded ones "
            f"({read.output_tokens} output tokens of {read.requests} requests)"
        )
    resolved = trace.get("resolved_plain_steps", read.plain_steps)
    if not _count(resolved) or resolved > read.plain_steps:
        raise ValueError(
            f"resolved_plain_steps {reprlib.repr(resolved)} is not within the trace's "
            f"{read.plain_steps} plain steps"
        )
    return replace(read, resolved_plain_steps=resolved)


def _verifications(pairs: object) -> list[tuple[int, int]]:
    """A trace's verifications as (drafted, accepted) pairs, each checked; ValueError names
    the first that is not one the bench can cost."""
    if not isinstance(pairs, list):
        raise ValueError(f"verifications {reprlib.repr(pairs)} is not a list")
    checked = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(_count(n) for n in pair)):
            raise ValueError(
                f"verification {i} {reprlib.repr(pair)} is not a [drafted, accepted] pair of "
                "whole numbers >= 0"
            )
        drafted, accepted = pair
        if not 1 <= drafted <= MAX_MEASURED_DRAFT:
            raise ValueError(
                f"verification {i} {pair}: drafted must be 1..{MAX_MEASURED_DRAFT} (the "
                "longest draft whose verify step the bench measures)"
            )
        if accepted > drafted:
            raise ValueError(f"verification {i} {pair}: more tokens accepted than drafted")
        checked.append((drafted, accepted))
    return checked


def replay_trace(report: Report, costs: list[float], trace: AcceptanceTrace, plain: float) -> None:
    """The replayed row, as a fraction of `plain` (the measured decode-b1 tok/s, overlapped).

    A trace recorded one request at a time says how many of its plain steps were planned only
    after the step before was resolved (`resolved_plain_steps`: the engine waited for a draft
    that did not come); they cost the k=0 step unoverlapped, the others the measured plain
    decode-b1's time per token. Without that count every plain step is costed unoverlapped.
    `costs` is the ms per verify step for k = 0..len(costs) - 1."""
    longest = max((d for d, _ in trace.verifications), default=0)
    if longest >= len(costs):
        raise ValueError(
            f"{trace.file_name}: a draft of {longest} tokens, longer than k = "
            f"{len(costs) - 1} were measured"
        )
    resolved = trace.resolved_plain_steps
    ms = (
        (trace.plain_steps - resolved) * 1e3 / plain
        + resolved * costs[0]
        + sum(costs[d] for d, _ in trace.verifications)
    )
    speed = trace.decoded / ms * 1e3
    accepted = sum(a for _, a in trace.verifications)
    drafted = sum(d for d, _ in trace.verifications)
    report.add(
        Row(
            "decode-b1, acceptance trace replayed (model, not measured end to end)",
            speed,
            "tok/s",
            note=f"{speed / plain:.2f}x the measured plain decode-b1 ({plain:,.0f} tok/s; "
            f"{speed / (1e3 / costs[0]):.2f}x plain steps unoverlapped); trace "
            f"{trace.file_name}: {trace.model}, {trace.requests} prompts, "
            f"{len(trace.verifications)} verifications, {accepted} of {drafted} drafted "
            f"tokens accepted, {resolved} of {trace.plain_steps} plain steps resolved first",
        )
    )


def bench_spec_decode_b1(report: Report, model_dir: Any, new_tokens: int) -> float:
    """The two decode-b1 rows above, plain and speculating in turns twice on one runner (two
    schedulers), the best of each kept (the host's speed drifts within a run); returns the
    plain one's tok/s."""
    from sv_engine import Engine, SamplingParams
    from sv_scheduler import Scheduler, SpeculationConfig

    from sv_cli.bench.inputs import PROMPT_ID_BOUND, bench_engine, vocab_size

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    plain_engine = bench_engine(model_dir, max_num_seqs=256)
    rng = random.Random(1)
    vocab = vocab_size(plain_engine)  # a smaller vocabulary than Llama's refused an id past it
    warm, prompt = (
        [rng.randint(0, PROMPT_ID_BOUND - 1) % vocab for _ in range(128)] for _ in range(2)
    )
    spec_config = replace(plain_engine.scheduler.config, speculation=SpeculationConfig())
    engines = {
        "decode-b1 (same engine settings)": plain_engine,
        "decode-b1 --speculate ngram": Engine(
            plain_engine.tokenizer,
            plain_engine.runner,
            Scheduler(spec_config),
            plain_engine.stop_ids,
        ),
    }
    best: dict[str, tuple[float, str]] = {}
    for name, engine in [*engines.items()] * 2:
        engine.clear_prefix_cache()  # the two schedulers share the runner's pages
        engine.generate([warm], replace(params, max_new_tokens=8))
        before = engine.stats
        t0 = time.perf_counter()
        times = [time.perf_counter() for _event in engine.stream([prompt], params)]
        decode = (len(times) - 1) / (times[-1] - times[0])
        s = engine.stats
        drafted = s.drafted_tokens - before.drafted_tokens
        accepted = s.accepted_tokens - before.accepted_tokens
        note = (
            f"best of 2 in turns; TTFT {(times[0] - t0) * 1e3:.1f} ms; {len(times)} events, "
            f"drafted {drafted}, accepted {accepted}"
        )
        if decode > best.get(name, (0.0, ""))[0]:
            best[name] = (decode, note)
    for name, (decode, note) in best.items():
        report.add(Row(name, decode, "tok/s", note=note))
    plain = best["decode-b1 (same engine settings)"][0]
    spec = best["decode-b1 --speculate ngram"][0]
    report.add(Row("decode-b1 --speculate ngram / plain", spec / plain, "ratio"))
    del engines, plain_engine, engine
    free_device_memory()
    return plain
