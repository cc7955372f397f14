"""`sv bench --profile`: where a workload's GPU and host time goes (torch's profiler,
cProfile), and what each kernel adds to a decode step's critical path (`critical_path`).
Each profile is printed and appended to profiles.txt in the work folder."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sv_cli.bench.inputs import random_prompts, scratch_decode_step, vocab_size


def profile_steps(label: str, run: Callable[[], object], out_dir: Path) -> None:
    """Where the time of `run` goes: the top CUDA kernels and the host time around them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    gpu_total = sum(e.self_device_time_total for e in events)
    lines = [f"--- profile: {label}: wall {wall * 1e3:.1f} ms, GPU busy {gpu_total / 1e3:.1f} ms"]
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:16]:
        share = e.self_device_time_total / max(gpu_total, 1)
        lines.append(
            f"  {e.self_device_time_total / 1e3:8.2f} ms {share:5.1%} {e.count:6d}x  {e.key[:90]}"
        )
    _report_profile("\n".join(lines), out_dir)


def profile_decode_path(
    engine: Any, tag: str, out_dir: Path, batch: int = 1, replays: int = 24
) -> None:
    """What each kernel adds to a decode step of `batch` rows (`critical_path`): the
    step's graph replayed `replays` times back to back under the profiler, the first four
    replays left out. The step is `scratch_decode_step`'s: every row attends to the same 701
    cached tokens, which stay in L2, so the attention's share is its fixed cost, not a real
    context's reads. At 256 rows the table shows what the matmuls and the small kernels between
    them (FP8 activations and scales, norms, SwiGLU) add to a throughput step."""
    import torch
    from torch.profiler import DeviceType, ProfilerActivity, profile

    from sv_cli.bench.critical_path import KernelSpan, critical_path, format_path, split_steps
    from sv_cli.bench.runner import decode_replay

    replay = decode_replay(engine.runner, scratch_decode_step(engine.runner, batch))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    kernels = [
        KernelSpan(e.name, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]
    rows = "decode-b1 step" if batch == 1 else f"decode step of {batch} rows"
    label = f"{rows}, 701-token context{tag}"
    try:
        text = format_path(label, *critical_path(split_steps(kernels, replays)[4:]))
    except ValueError as e:  # the profiler's records were not whole replays: say so, go on
        text = f"--- critical path: {label}: not computed: {e}"
    _report_profile(text, out_dir)


def host_profile(label: str, run: Callable[[], object], out_dir: Path) -> None:
    """Where the host's time goes (cProfile, by own time)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()][:22]
    body = "\n".join(f"  {ln}" for ln in lines)
    _report_profile(f"--- host profile: {label}\n{body}", out_dir)


def _report_profile(text: str, out_dir: Path) -> None:
    """Print one profile's text and append it to out_dir/profiles.txt."""
    print(text, flush=True)
    with (out_dir / "profiles.txt").open("a") as f:
        f.write(text + "\n")


def run_profiles(engine: Any, out_dir: Path) -> None:
    from sv_engine import SamplingParams

    rng = random.Random(5)
    one = random_prompts(rng, 1, 128, 128, vocab_size(engine))
    profile_steps(
        "decode-b1, 32 tokens",
        lambda: engine.generate(one, SamplingParams(max_new_tokens=32, ignore_eos=True)),
        out_dir,
    )
    long = random_prompts(rng, 1, 2048, 2048, vocab_size(engine))
    profile_steps(
        "prefill 2048",
        lambda: engine.generate(long, SamplingParams(max_new_tokens=1, ignore_eos=True)),
        out_dir,
    )
    for batch in (1, 256):
        profile_decode_path(engine, "", out_dir, batch)
    profile_decode_batch(engine, "", out_dir, host=True)
    host_profile(
        "decode-b1, 32 tokens",
        lambda: engine.generate(one, SamplingParams(max_new_tokens=32, ignore_eos=True)),
        out_dir,
    )


def profile_decode_batch(engine: Any, tag: str, out_dir: Path, host: bool = False) -> None:
    """256 sequences decoding together (contexts ~100..1,024): the GPU (and with `host` the
    host) profile of 16 steps after their prefill."""
    from sv_engine import SamplingParams

    for p in random_prompts(random.Random(6), 256, 100, 1024, vocab_size(engine)):
        engine.add_request(p, SamplingParams(max_new_tokens=40, ignore_eos=True), stream_text=False)
    while any(not s.decoding for s in engine.scheduler.running()) or engine.scheduler.num_waiting:
        engine.step()

    def decode_steps() -> None:
        for _ in range(16):
            engine.step()

    profile_steps("decode batch 256, 16 steps" + tag, decode_steps, out_dir)
    if host:
        host_profile("decode batch 256, 16 steps" + tag, decode_steps, out_dir)
    while engine.has_unfinished():
        engine.step()
