"""Cost of the scheduler on the CPU, per model step.

    uv run python packages/sv-scheduler/bench/bench_step.py [--seqs 256] [--steps 4000]

1. steady decode: N sequences all decoding, none finishing; one step = schedule() +
   complete_step() with N sampled tokens. Prompt lengths are staggered
   (random.Random(0).randint(100, 1024), like the throughput benchmark) so page-boundary crossings
   spread over steps as in real serving: each sequence needs a new page once every 16 steps.
2. whole run: N requests like DESIGN.md's throughput-var benchmark (prompts randint(100, 1024),
   new tokens randint(100, 1024), ignore EOS) from arrival to the last finish, including
   admission, chunked prefill (max_step_tokens 8192), finishes and prefix-cache registration.

The sampled tokens come as one Python list, as the engine passes `tensor.tolist()`; building that
list is the engine's cost and is not timed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from sv_scheduler import Request, Scheduler, SchedulerConfig

PAGE_SIZE = 16
TOKENS = [random.Random(1).randint(0, 127_999) for _ in range(8192)]


def new_scheduler(lengths: list[tuple[int, int]], num_seqs: int, prefix_caching: bool) -> Scheduler:
    rng = random.Random(0)
    pages = sum(-(-(n + m) // PAGE_SIZE) for n, m in lengths)
    sched = Scheduler(
        SchedulerConfig(
            num_pages=pages,
            max_model_len=max(n + m for n, m in lengths) + 1,
            max_num_seqs=num_seqs,
            max_step_tokens=max(8192, num_seqs),
            prefix_caching=prefix_caching,
        )
    )
    for i, (n, m) in enumerate(lengths):
        prompt = [rng.randint(0, 127_999) for _ in range(n)]
        sched.add(
            Request(i, prompt, m, stop_ids=frozenset({128_001, 128_008, 128_009}), ignore_eos=True)
        )
    return sched


def steady_decode(num_seqs: int, steps: int, prefix_caching: bool) -> list[float]:
    rng = random.Random(0)
    lengths = [(rng.randint(100, 1024), steps + 64) for _ in range(num_seqs)]
    sched = new_scheduler(lengths, num_seqs, prefix_caching)
    while True:  # warm-up: prefill everything until all sequences decode
        plan = sched.schedule()
        sched.complete_step(plan, TOKENS[: len(plan.sampling)])
        if len(plan.decodes) == num_seqs and not plan.prefills:
            break
    tokens = TOKENS[:num_seqs]
    clock = time.perf_counter_ns
    schedule, complete = sched.schedule, sched.complete_step
    timings = []
    for _ in range(steps):
        t0 = clock()
        plan = schedule()
        complete(plan, tokens)
        timings.append((clock() - t0) / 1000)
    assert len(plan.decodes) == num_seqs, "a sequence finished during the measurement"
    return timings


def whole_run(num_seqs: int, prefix_caching: bool) -> tuple[int, float]:
    rng = random.Random(0)
    lengths = [(rng.randint(100, 1024), rng.randint(100, 1024)) for _ in range(num_seqs)]
    sched = new_scheduler(lengths, num_seqs, prefix_caching)
    clock = time.perf_counter_ns
    total = 0
    steps = 0
    while sched.has_unfinished():
        t0 = clock()
        plan = sched.schedule()
        t1 = clock()
        tokens = TOKENS[: len(plan.sampling)]
        t2 = clock()
        sched.complete_step(plan, tokens)
        total += (t1 - t0) + (clock() - t2)
        steps += 1
    return steps, total / steps / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for prefix_caching in (True, False):
        runs = [steady_decode(args.seqs, args.steps, prefix_caching) for _ in range(args.repeats)]
        best = min(runs, key=statistics.median)
        ordered = sorted(best)
        median = statistics.median(best)
        print(
            f"steady decode, {args.seqs} sequences, prefix_caching={prefix_caching!s:5}: "
            f"median {median:5.1f} us/step ({median / args.seqs * 1000:.0f} ns/sequence), "
            f"mean {statistics.fmean(best):5.1f}, p99 {ordered[int(0.99 * (len(ordered) - 1))]:5.1f}"
        )
    for prefix_caching in (True, False):
        steps, mean = min(
            (whole_run(args.seqs, prefix_caching) for _ in range(args.repeats)), key=lambda r: r[1]
        )
        print(
            f"whole run, {args.seqs} requests (throughput-var), prefix_caching={prefix_caching!s:5}: "
            f"{steps} steps, mean {mean:5.1f} us/step"
        )


if __name__ == "__main__":
    main()
