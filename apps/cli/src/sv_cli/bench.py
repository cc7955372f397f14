"""`sv bench`: the benchmarks of BENCHMARKS.md, measured in one run, each beside its roofline.

All at Llama-3.2-1B shapes unless `--preset` names another model's published shapes (see
`sv_weights.PRESETS`), bf16, random weights (seed 0), EOS ignored. The rooflines are
measured in the same run (device-to-device copy bandwidth, bf16 GEMM rate, pinned
host-to-device bandwidth), so every figure is also printed as a fraction of what the hardware
could do. Needs a CUDA device; `--quick` shrinks every workload (for a smoke test).
"""

from __future__ import annotations

import contextlib
import gc
import json
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

MIB = 1 << 20
DEFAULT_PRESET = "llama-3.2-1b"
# The names `--only` takes: each selects a workload below (a name it did not know used to
# run nothing but the rooflines, after the checkpoint had been written).
ONLY_NAMES = (
    "load", "memory", "decode", "prefill", "throughput", "plain", "var", "long", "logprobs",
    "grammar", "spec", "tp", "gemv",
)  # fmt: skip
# Prompt token ids are drawn below this (Llama 3's vocabulary); a smaller vocabulary (Mistral's
# 32,000) takes them modulo its size, so the 1B workloads stay the ones of BENCHMARKS.md.
PROMPT_ID_BOUND = 128000


@dataclass
class Row:
    name: str
    value: float
    unit: str
    roofline: float | None = None
    note: str = ""

    @property
    def fraction(self) -> str:
        if not self.roofline:
            return ""
        return f"{self.value / self.roofline:.2f}"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        frac = f" ({row.fraction} of {row.roofline:,.0f})" if row.roofline else ""
        print(f"[bench] {row.name}: {row.value:,.2f} {row.unit}{frac} {row.note}", flush=True)

    def table(self) -> str:
        lines = [f"preset {self.info['preset']}"] if "preset" in self.info else []
        lines += [f"{'benchmark':34} {'value':>14} {'unit':10} {'roofline':>12} {'frac':>5}  note"]
        for r in self.rows:
            roof = f"{r.roofline:,.0f}" if r.roofline else ""
            lines.append(
                f"{r.name:34} {r.value:>14,.2f} {r.unit:10} {roof:>12} {r.fraction:>5}  {r.note}"
            )
        return "\n".join(lines)


def cuda_ms(fn: Callable[[], object], iters: int = 10, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    times.sort()
    return times[len(times) // 2]


def back_to_back(replay: Callable[[], object], replays: int) -> Callable[[], None]:
    """A call that queues `replay` (a graph's bare replay) `replays` times without waiting."""

    def replay_all() -> None:
        for _ in range(replays):
            replay()

    return replay_all


def replayed_ms(replay: Callable[[], object], replays: int = 20) -> float:
    """GPU ms of one `replay`, queued `replays` times back to back between two events so that
    the host's speed cannot leave the GPU idle in the timed span."""
    return cuda_ms(back_to_back(replay, replays), iters=5, warmup=1) / replays


def _copy_bandwidth(nbytes: int) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    import torch

    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / (cuda_ms(lambda: dst.copy_(src)) / 1e3)


def _gemm_rate(n: int) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return 2 * n**3 / (cuda_ms(lambda: a @ b) / 1e3)


def _h2d_bandwidth(nbytes: int) -> float:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return nbytes / (cuda_ms(lambda: dev.copy_(host, non_blocking=True), iters=5) / 1e3)


def host_probe_ms() -> float:
    """Milliseconds for a fixed pure-Python loop: how fast the host is right now. The device
    host's speed drifts (0.12-0.29 s for this loop within one session, 2026-11-30), and every
    host-bound figure (load, throughput, serving) moves with it; the report records it at the
    start and the end of a run."""
    t0 = time.perf_counter()
    sum(range(10**7))
    return (time.perf_counter() - t0) * 1e3


def measure_rooflines(report: Report) -> dict[str, float]:
    import torch

    roof = {
        "copy_bw": _copy_bandwidth(1 << 30),
        "gemm": _gemm_rate(8192),
        "h2d": _h2d_bandwidth(1 << 30),
    }
    torch.cuda.empty_cache()
    report.add(Row("roofline: d2d copy bandwidth", roof["copy_bw"] / 1e9, "GB/s"))
    report.add(Row("roofline: bf16 GEMM 8192^3", roof["gemm"] / 1e12, "TFLOP/s"))
    report.add(Row("roofline: pinned h2d copy", roof["h2d"] / 1e9, "GB/s"))
    report.add(Row("host probe at start", host_probe_ms(), "ms", note="sum(range(10**7))"))
    return roof


def prepare_checkpoint(
    root: Path, tokenizer_dir: Path | None, preset: str = DEFAULT_PRESET
) -> Path:
    """The random-weight checkpoint of `preset` (seed 0, drawn on the GPU: an 8B one in
    seconds), written once and reused."""
    import torch
    from sv_weights import preset_config, write_random_checkpoint

    model_dir = root / f"{preset}-random"
    if not (model_dir / "model.safetensors").exists():
        t0 = time.perf_counter()
        print(f"[bench] writing the random {preset} checkpoint to {model_dir} ...", flush=True)
        write_random_checkpoint(
            model_dir, preset_config(preset), seed=0, dtype=torch.bfloat16, device="cuda"
        )
        print(f"[bench] ... done in {time.perf_counter() - t0:.1f} s", flush=True)
    if tokenizer_dir is not None:
        for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
            if (tokenizer_dir / name).exists() and not (model_dir / name).exists():
                shutil.copy(tokenizer_dir / name, model_dir / name)
    return model_dir


def bench_load(report: Report, model_dir: Path, roof: dict[str, float]) -> None:
    import torch
    from sv_weights import device_load as dl
    from sv_weights import load_checkpoint

    path = model_dir / "model.safetensors"
    size = path.stat().st_size
    with path.open("rb") as f:  # bring the file into the page cache
        while f.read(64 * MIB):
            pass

    def load_seconds() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tensors = load_checkpoint(model_dir, device="cuda")
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        del tensors
        torch.cuda.empty_cache()
        return seconds

    # The first load of a process also allocates (pins) the staging ring; later ones reuse it.
    first = load_seconds()
    default = (dl.DEVICE_READERS, dl.DEVICE_CHUNK_BYTES, dl.DEVICE_BUFFERS)
    # Ring shapes (readers, chunk MiB, buffers), the default first, measured in interleaved
    # rounds: the host's speed drifts within a minute (see host_probe_ms), and a config timed
    # only in a slow stretch would look worse than it is. The default's best is the figure.
    default_ring = (default[0], default[1] // MIB, default[2])
    others = [(6, 4, 12), (8, 4, 12), (8, 4, 24), (12, 4, 24), (8, 2, 32), (8, 8, 8)]
    rings = [default_ring] + [ring for ring in others if ring != default_ring]
    best_seconds = dict.fromkeys(rings, float("inf"))
    rounds = 5
    for _ in range(rounds):
        for ring in rings:
            dl.DEVICE_READERS, chunk_mib, dl.DEVICE_BUFFERS = ring
            dl.DEVICE_CHUNK_BYTES = chunk_mib * MIB
            best_seconds[ring] = min(best_seconds[ring], load_seconds())
    dl.DEVICE_READERS, dl.DEVICE_CHUNK_BYTES, dl.DEVICE_BUFFERS = default
    sweep = [f"{r}x{c}MiBx{k} {size / t / 1e9:.1f}" for (r, c, k), t in best_seconds.items()]
    print(f"[bench] load sweep (readers x chunk x buffers: GB/s): {'; '.join(sweep)}", flush=True)
    best = best_seconds[default_ring]
    setting = f"{default[0]} readers x {default[1] // MIB} MiB x {default[2]} buffers"
    report.add(
        Row(
            "load checkpoint -> GPU",
            size / best / 1e9,
            "GB/s",
            roof["h2d"] / 1e9,
            f"{size / 1e9:.2f} GB in {best * 1e3:.0f} ms "
            f"(page cache, {setting}, best of {rounds} rounds)",
        )
    )
    report.add(
        Row(
            "load checkpoint -> GPU, first in process",
            size / first / 1e9,
            "GB/s",
            roof["h2d"] / 1e9,
            f"{first * 1e3:.0f} ms, including pinning the staging ring",
        )
    )


def bench_memory(report: Report, model_dir: Path) -> None:
    """GPU memory the weights keep, loaded as the engine loads them (load_checkpoint, packing,
    the state dropped), beside the packed weights' own size (the roofline): the bytes of the
    distinct storages their tensors view, and torch.cuda.memory_allocated after vs before."""
    import torch
    from sv_model import ModelWeights
    from sv_weights import ModelConfig, load_checkpoint

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    config = ModelConfig.from_model_dir(model_dir)
    state = load_checkpoint(model_dir, device="cuda")
    weights = ModelWeights.from_state_dict(config, state, "cuda", torch.bfloat16)
    del state
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated() - before
    packed = weights.weight_bytes() / MIB
    note = f"packed weights {packed:,.0f} MiB"
    report.add(
        Row(
            "weights resident: distinct storages",
            weights.storage_bytes() / MIB,
            "MiB",
            packed,
            note,
        )
    )
    report.add(Row("weights resident: memory_allocated", allocated / MIB, "MiB", packed, note))
    del weights
    torch.cuda.empty_cache()


def _engine(model_dir: Path, **kwargs: Any) -> Any:
    from sv_engine import Engine
    from sv_engine.options import default_tuning_cache

    kwargs.setdefault("tuning_cache", default_tuning_cache())
    return Engine.from_model_dir(model_dir, device="cuda", **kwargs)


def _random_prompts(
    rng: random.Random, count: int, lo: int, hi: int, vocab: int = PROMPT_ID_BOUND
) -> list[list[int]]:
    return [
        [rng.randint(0, PROMPT_ID_BOUND - 1) % vocab for _ in range(rng.randint(lo, hi))]
        for _ in range(count)
    ]


def _vocab(engine: Any) -> int:
    return int(engine.runner.config.vocab_size)


def bench_decode_b1(
    report: Report, engine: Any, roof: dict[str, float], new_tokens: int, tag: str = ""
) -> None:
    from sv_engine import SamplingParams

    from sv_cli.bench_runner import weight_bytes_per_decode_step

    weight_bytes = weight_bytes_per_decode_step(engine.runner.model.weights)
    rng = random.Random(1)
    warm, prompt = _random_prompts(
        rng, 2, 128, 128, _vocab(engine)
    )  # distinct: no prefix-cache hit
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    sampled = SamplingParams(
        max_new_tokens=new_tokens, ignore_eos=True, temperature=0.7, top_k=50, top_p=0.9, seed=0
    )
    roofline = roof["copy_bw"] / weight_bytes  # every weight read once per token
    for name, p, overlap in (
        ("decode-b1", params, True),
        ("decode-b1 sampled (T 0.7, top-k 50, top-p 0.9)", sampled, True),
        ("decode-b1, plain step loop (no overlap)", params, False),
    ):
        engine.overlap = overlap
        engine.generate([warm], replace(p, max_new_tokens=8))  # also captures the sampling graph
        t0 = time.perf_counter()
        times = [time.perf_counter() for _event in engine.stream([prompt], p)]
        engine.overlap = True
        ttft = times[0] - t0
        decode = (len(times) - 1) / (times[-1] - times[0])
        report.add(
            Row(
                name + tag,
                decode,
                "tok/s",
                roofline,
                f"TTFT {ttft * 1e3:.1f} ms; {weight_bytes / 1e9:.2f} GB of weights per token",
            )
        )


def bench_long_context(
    report: Report,
    model_dir: Path,
    roof: dict[str, float],
    contexts: list[int],
    new_tokens: int,
    quantization: list[str],
) -> None:
    """One prompt of each length in `contexts`, then `new_tokens` greedy tokens: TTFT and the
    decode rate, for a BF16 and an FP8 KV cache in turn (one engine each, sized for the
    longest context), then for each mode of `quantization` its weights with an FP8 KV cache
    (rows tagged [mode]). Each decode step reads the weights and the context's K and V once:
    that over the copy bandwidth is the roofline."""
    import torch
    from sv_engine import SamplingParams

    from sv_cli.bench_runner import weight_bytes_per_decode_step

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    rng = random.Random(7)
    prompts = {n: _random_prompts(rng, 1, n, n)[0] for n in contexts}
    runs = [(None, "auto"), (None, "fp8")] + [(mode, "fp8") for mode in quantization]
    for mode, kv_dtype in runs:
        engine = _engine(
            model_dir,
            max_model_len=max(contexts) + new_tokens,
            kv_cache_dtype=kv_dtype,
            quantization=mode,
        )
        config, kv = engine.runner.config, engine.runner.kv
        weight_bytes = weight_bytes_per_decode_step(engine.runner.model.weights)
        kv_bytes_per_token = (
            2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
        ) * kv.k.element_size()
        engine.generate([prompts[min(contexts)][:512]], replace(params, max_new_tokens=8))
        name = (
            ("BF16" if kv_dtype == "auto" else "FP8")
            + " KV"
            + ("" if mode is None else f" [{mode}]")
        )
        for n in contexts:
            engine.clear_prefix_cache()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            times = [time.perf_counter() for _event in engine.stream([prompts[n]], params)]
            ttft = times[0] - t0
            decode = (len(times) - 1) / (times[-1] - times[0])
            context_bytes = kv_bytes_per_token * (n + new_tokens // 2)
            report.add(
                Row(
                    f"long context {n:,}, {name}: decode",
                    decode,
                    "tok/s",
                    roof["copy_bw"] / (weight_bytes + context_bytes),
                    f"TTFT {ttft * 1e3:.0f} ms; per token {weight_bytes / 1e9:.2f} GB of "
                    f"weights + {context_bytes / 1e9:.2f} GB of K/V",
                )
            )
        del engine
        free_device_memory()


def bench_decode_step(
    report: Report, engine: Any, roof: dict[str, float], batch: int, tag: str = ""
) -> None:
    """The GPU time of one graph-replayed decode step alone (no scheduler, no host round trip):
    how far the end-to-end figure is from what the kernels themselves allow. Twenty replays are
    queued back to back between two events, so the host's speed cannot leave the GPU idle
    inside the timed span (timing `runner.logits` did: its input copy and Python ran in it)."""
    from sv_cli.bench_runner import decode_replay, weight_bytes_per_decode_step

    runner = engine.runner
    ms = replayed_ms(decode_replay(runner, _scratch_decode_step(runner, batch)))
    weight_bytes = weight_bytes_per_decode_step(runner.model.weights)
    report.add(
        Row(
            f"decode step GPU time, batch {batch}{tag}",
            ms * 1e3,
            "us",
            None,
            f"{batch / ms * 1e3:,.0f} tok/s if the host cost nothing; weights alone "
            f"{weight_bytes / roof['copy_bw'] * 1e6:.0f} us",
        )
    )


def _scratch_decode_step(runner: Any, batch: int) -> Any:
    """A decode step of `batch` sequences at position 700 of the scratch table row: the step
    the decode graphs run, without a request (its K/V are one page, read from L2)."""
    from sv_model import StepInputs

    return StepInputs(
        token_ids=[1] * batch,
        positions=[700] * batch,
        table_rows=[runner.scratch_table_row] * batch,
        query_lens=[1] * batch,
        seq_lens=[701] * batch,
        sample_rows=list(range(batch)),
    )


def bench_prefill(report: Report, engine: Any, roof: dict[str, float], tag: str = "") -> None:
    import torch
    from sv_engine import SamplingParams

    from sv_cli.bench_runner import num_parameters

    config = engine.runner.config
    prompt = _random_prompts(random.Random(2), 1, 2048, 2048, _vocab(engine))[0]
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    best = float("inf")
    for i in range(6):
        # a different prompt each time, so the prefix cache does not serve it
        p = [(t + i + 1) % 128000 for t in prompt]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.generate([p], params)
        if i > 0:  # the first run is a warm-up
            best = min(best, time.perf_counter() - t0)
    # Every matrix but the LM head (which sees only the last token), plus causal attention.
    n = len(prompt)
    matrices = (
        num_parameters(engine.runner.model.weights, include_embedding=False)
        - config.vocab_size * config.hidden_size
    )
    flops = 2 * matrices * n + 2 * config.vocab_size * config.hidden_size
    flops += 2 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * n * n
    report.add(
        Row(
            "prefill 2048 tokens (TTFT)" + tag,
            best * 1e3,
            "ms",
            None,
            f"{flops / best / 1e12:.0f} TFLOP/s = {flops / best / roof['gemm']:.2f} of GEMM peak; "
            f"floor {flops / roof['gemm'] * 1e3:.1f} ms",
        )
    )


def bench_throughput(
    report: Report,
    engine: Any,
    name: str,
    count: int,
    variable: bool,
    new_tokens: int,
    logprobs: int | None = None,
) -> float:
    """Adds the row; returns its output tok/s. `logprobs`: every request asks for them."""
    import torch
    from sv_engine import SamplingParams

    from sv_cli.bench_runner import kv_pool_bytes

    rng = random.Random(0)
    prompts = _random_prompts(rng, count, 100, 1024, _vocab(engine))
    news = [rng.randint(100, 1024) if variable else new_tokens for _ in prompts]
    # Each benchmark starts cold: no prompt may be served by an earlier run's prefix cache.
    engine.clear_prefix_cache()
    torch.cuda.reset_peak_memory_stats()
    ids = [
        engine.add_request(
            p,
            SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=logprobs),
            stream_text=False,
        )
        for p, n in zip(prompts, news, strict=True)
    ]
    t0 = time.perf_counter()
    out_tokens = steps = 0
    pending = set(ids)
    with collector_time() as collected, step_times(engine.runner) as times:
        while pending:
            steps += 1
            for event in engine.step():
                out_tokens += event.token_id is not None
                if event.finished is not None:
                    pending.discard(event.request_id)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30
    pool = kv_pool_bytes(engine.runner.kv) / 2**30
    report.add(
        Row(
            name,
            out_tokens / wall,
            "tok/s",
            None,
            f"{count} requests, {out_tokens} tokens in {wall:.1f} s, {steps} steps ({times}); "
            f"peak GPU mem {peak:.1f} GiB, KV pool {pool:.1f} GiB; {collected}",
        )
    )
    return float(out_tokens / wall)


def free_device_memory() -> None:
    """Give a dropped engine's device memory back now: an engine holds reference cycles, so
    its KV pool would wait for a full collection, which then runs inside the next timed
    benchmark (146 ms in run 87's throughput-b64) while that one's engine sizes its pool on
    the memory not yet freed."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()


class CollectorTime:
    """Time spent in Python's garbage collector, and its full collections, while open."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.full += info["generation"] == 2

    def __str__(self) -> str:
        return f"garbage collector {self.seconds * 1e3:.0f} ms, {self.full} full collections"


class StepTimes:
    """Each launched step's host time (queueing it) and GPU time (CUDA events around it),
    apart for steps that feed a chunk of several tokens (prompts; a verify step's drafts too)
    and for decode steps: a step whose host time reaches its GPU time left the GPU waiting on
    Python (BENCHMARKS.md, run 162)."""

    def __init__(self) -> None:
        self._steps: list[tuple[bool, float, Any, Any]] = []

    def record(self, prompt: bool, host_s: float, start: Any, end: Any) -> None:
        self._steps.append((prompt, host_s, start, end))

    def __str__(self) -> str:
        parts = []
        for prompt, name in ((True, "prompt"), (False, "decode")):
            steps = [s for s in self._steps if s[0] == prompt]
            if steps:
                gpu = sum(start.elapsed_time(end) for _, _, start, end in steps)
                host = sum(s[1] for s in steps) * 1e3
                parts.append(f"{len(steps)} {name}: GPU {gpu:,.0f} ms, host {host:,.0f} ms")
        return "; ".join(parts)


@contextlib.contextmanager
def step_times(runner: Any) -> Iterator[StepTimes]:
    """Time every `runner.launch` while open (the GPU figures are read when printed, after the
    run: reading them synchronizes)."""
    import torch

    times = StepTimes()
    launch = runner.launch

    def timed(step: Any) -> Any:
        started = time.perf_counter()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        pending = launch(step)
        end.record()
        times.record(any(n > 1 for n in step.query_lens), time.perf_counter() - started, start, end)
        return pending

    runner.launch = timed
    try:
        yield times
    finally:
        runner.launch = launch


@contextlib.contextmanager
def collector_time() -> Iterator[CollectorTime]:
    """A collection that walks every live object can stall a step by 100+ ms (BENCHMARKS.md,
    run 83): the throughput rows say how much of their time it took."""
    timer = CollectorTime()
    gc.callbacks.append(timer)
    try:
        yield timer
    finally:
        gc.callbacks.remove(timer)


def bench_quantized(
    report: Report,
    model_dir: Path,
    roof: dict[str, float],
    mode: str,
    workloads: set[str],
    quick: bool,
    bf16_throughput: float | None,
    kv_cache_dtype: str = "auto",
    profile_dir: Path | None = None,
) -> None:
    """decode-b1, throughput and the resident weight bytes with the matrices quantized at load
    to `mode` (fp8 or int8), each row tagged [mode]; run beside the BF16 rows of the same call.
    With kv_cache_dtype="fp8" the cache holds FP8 pages too (rows tagged [mode + fp8 KV]), as
    an engine serving for throughput runs both. With `profile_dir`, where a 256-row decode
    step's GPU time goes, as `--profile` shows it for BF16."""

    from sv_cli.bench_runner import weight_bytes_per_decode_step

    engine = _engine(model_dir, max_num_seqs=256, quantization=mode, kv_cache_dtype=kv_cache_dtype)
    tag = f" [{mode}]" if kv_cache_dtype == "auto" else f" [{mode} + {kv_cache_dtype} KV]"
    weights = engine.runner.model.weights
    if kv_cache_dtype == "auto":  # the weights are the same with either cache
        for shape, choice in engine.runner.linear_choices.items():
            print(f"[bench] {mode} linear {shape[0]}x{shape[1]}: {choice}", flush=True)
        read = weight_bytes_per_decode_step(weights) / MIB
        report.add(
            Row(
                "weights resident: distinct storages" + tag,
                weights.storage_bytes() / MIB,
                "MiB",
                weights.weight_bytes() / MIB,
                f"{read:,.0f} MiB read per decode step",
            )
        )
    if "decode" in workloads:
        bench_decode_b1(report, engine, roof, 64 if quick else 256, tag)
        # The kernels' own time beside BF16's: what the mode saves where the host is no limit.
        for batch in (1, 256):
            bench_decode_step(report, engine, roof, batch, tag)
    if "prefill" in workloads:
        bench_prefill(report, engine, roof, tag)
    if "throughput" in workloads:
        rate = bench_throughput(
            report, engine, "throughput" + tag, 32 if quick else 256, False, 64 if quick else 512
        )
        if bf16_throughput:
            report.add(Row("throughput vs BF16" + tag, rate / bf16_throughput, "x"))
    if profile_dir is not None:
        for batch in (1, 256):
            profile_decode_path(engine, tag, profile_dir, batch)
        profile_decode_batch(engine, tag, profile_dir)
    del engine, weights
    free_device_memory()


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
    """What each kernel adds to a decode step of `batch` rows (`sv_cli.critical_path`): the
    step's graph replayed `replays` times back to back under the profiler, the first four
    replays left out. The step is `_scratch_decode_step`'s: every row attends to the same 701
    cached tokens, which stay in L2, so the attention's share is its fixed cost, not a real
    context's reads. At 256 rows the table shows what the matmuls and the small kernels between
    them (FP8 activations and scales, norms, SwiGLU) add to a throughput step."""
    import torch
    from torch.profiler import DeviceType, ProfilerActivity, profile

    from sv_cli.bench_runner import decode_replay
    from sv_cli.critical_path import KernelSpan, critical_path, format_path, split_steps

    replay = decode_replay(engine.runner, _scratch_decode_step(engine.runner, batch))
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
    one = _random_prompts(rng, 1, 128, 128, _vocab(engine))
    profile_steps(
        "decode-b1, 32 tokens",
        lambda: engine.generate(one, SamplingParams(max_new_tokens=32, ignore_eos=True)),
        out_dir,
    )
    long = _random_prompts(rng, 1, 2048, 2048, _vocab(engine))
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

    for p in _random_prompts(random.Random(6), 256, 100, 1024, _vocab(engine)):
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


def bench_peer(report: Report, model_dir: Path, quick: bool) -> None:
    """transformers on the same checkpoint: generate() at batch 1, and its continuous batching
    (generate_batch) on the first requests of the throughput workload."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = model.cuda().eval()
    vocab = int(model.config.vocab_size)
    prompt = torch.tensor([_random_prompts(random.Random(1), 1, 128, 128, vocab)[0]], device="cuda")
    new = 16 if quick else 64
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    model.generate(prompt, max_new_tokens=4, min_new_tokens=4, **kwargs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **kwargs)
    torch.cuda.synchronize()
    report.add(Row("peer: transformers generate b1", new / (time.perf_counter() - t0), "tok/s"))
    count, new = (16, 64) if quick else (64, 512)
    prompts = _random_prompts(random.Random(0), count, 100, 1024, vocab)
    try:
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None
        )
        t0 = time.perf_counter()
        outputs = model.generate_batch(inputs=prompts, generation_config=config)
        wall = time.perf_counter() - t0
        tokens = sum(len(o.generated_tokens) for o in outputs.values())
        report.add(
            Row(
                "peer: transformers generate_batch",
                tokens / wall,
                "tok/s",
                None,
                f"first {count} throughput requests, {new} new tokens each",
            )
        )
    except Exception as e:  # a peer failing must not cost the run its own figures
        print(f"[bench] peer generate_batch: n/a ({type(e).__name__}: {e})", flush=True)
    del model
    torch.cuda.empty_cache()


def _preset_names() -> list[str]:
    from sv_weights import PRESETS

    return list(PRESETS)


def bench_main(argv: list[str]) -> int:
    from sv_engine.options import OneLineErrorParser, add_tensor_parallel_argument

    p = OneLineErrorParser(prog="sv bench", description=__doc__)
    p.add_argument("--workdir", default="/tmp/sv-bench", help="where the random checkpoint goes")
    p.add_argument("--tokenizer-dir", help="folder with the Llama 3.2 tokenizer files")
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        help="the published shapes to run (random weights): " + ", ".join(_preset_names()),
    )
    p.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    p.add_argument("--peer", action="store_true", help="also run the transformers peer")
    p.add_argument("--kernels", action="store_true", help="also run the kernel benchmarks")
    p.add_argument(
        "--only",
        help="comma-separated subset: load,memory,decode,prefill,throughput,plain,var,long,"
        "logprobs,grammar,spec (logprobs: decode-b1 and throughput with and without top-20 "
        "log-probabilities; long: 32k and 100k contexts with a BF16 and an FP8 KV cache; "
        "grammar: JSON-schema constrained decoding beside unconstrained; spec: verify-step cost "
        "for k = 1..16, decode-b1 and 64-request throughput with --speculate ngram beside plain; "
        "tp: decode-b1 and throughput at --tensor-parallel-size N beside 1; "
        "gemv: every batch-1 GEMV tile on every decode-step matrix in BF16, FP8 and int8, "
        "also part of --kernels; long, spec, tp and gemv are not in the default set)",
    )
    add_tensor_parallel_argument(p)
    p.add_argument(
        "--profile",
        action="store_true",
        help="print where GPU time goes, per workload, and what each kernel adds to a decode step of 1 and of 256 rows",
    )
    p.add_argument(
        "--spec-trace",
        default=[
            str(Path(__file__).resolve().parents[4] / "scripts" / "spec_trace_smollm2_cpu.json")
        ],
        nargs="+",
        metavar="FILE",
        help="with --only spec: the acceptance traces to replay, each against the same costs "
        "(scripts/spec_acceptance.py --trace; default: the one recorded on the CPU from the "
        "default model)",
    )
    p.add_argument("--json", help="write the rows here as JSON")
    p.add_argument(
        "--quantization",
        default="",
        help="comma-separated fp8,int8: also run decode-b1, prefill and throughput (as --only "
        "allows) and report the resident weights with the matrices quantized at load, each "
        "tagged [fp8] / [int8], beside the BF16 rows; with fp8, throughput also with FP8 KV "
        "pages ([fp8 + fp8 KV]); with --only long, each mode's weights with FP8 KV pages too",
    )
    args = p.parse_args(argv)
    if (args.tensor_parallel_size > 1) != (args.only is not None and "tp" in args.only.split(",")):
        p.error("--tensor-parallel-size N (N > 1) and --only tp go together")
    unknown_only = [name for name in (args.only or "").split(",") if name not in ONLY_NAMES]
    if args.only is not None and unknown_only:
        p.error(f"unknown --only {unknown_only[0]!r} (names: {','.join(ONLY_NAMES)})")
    if args.preset not in _preset_names():
        p.error(f"unknown preset {args.preset!r} (presets: {', '.join(_preset_names())})")
    modes = [m for m in args.quantization.split(",") if m]
    unknown = [m for m in modes if m not in ("fp8", "int8")]
    if unknown:
        print(
            f"sv bench: error: unknown --quantization {unknown[0]!r} (fp8, int8)", file=sys.stderr
        )
        return 2

    import torch
    from sv_tokenizer.cli import installed_llama_tokenizer_dir

    if not torch.cuda.is_available():
        print("sv bench: error: the benchmarks need a CUDA device", file=sys.stderr)
        return 2
    only = set(args.only.split(",")) if args.only else None

    def want(name: str) -> bool:
        return only is None or name in only

    bf16_throughput: float | None = None
    report = Report()
    report.info["device"] = torch.cuda.get_device_name()
    report.info["preset"] = args.preset
    roof = measure_rooflines(report)
    tokenizer_dir = (
        Path(args.tokenizer_dir) if args.tokenizer_dir else installed_llama_tokenizer_dir()
    )
    model_dir = prepare_checkpoint(Path(args.workdir), tokenizer_dir, args.preset)
    if want("load"):
        bench_load(report, model_dir, roof)
    if want("memory"):
        bench_memory(report, model_dir)
    if args.kernels:
        from sv_kernels import bench as kernel_bench

        kernel_bench.main(["--json", str(Path(args.workdir) / "kernels.json")])
    elif only is not None and "gemv" in only:  # the GEMV sweep alone (--kernels runs it too)
        from sv_kernels import bench as kernel_bench

        kernel_bench.main(["--only", "gemv", "--json", str(Path(args.workdir) / "gemv.json")])
    if only is not None and "long" in only:
        contexts = [4096] if args.quick else [32768, 100000]
        bench_long_context(report, model_dir, roof, contexts, 32 if args.quick else 128, modes)
    engine_workloads = {"decode", "prefill", "throughput", "plain", "var", "logprobs", "grammar"}
    if args.profile or any(want(name) for name in engine_workloads):
        from sv_cli.bench_runner import kv_pool_bytes

        engine = _engine(model_dir, max_num_seqs=256)
        report.info["kv_pool_gib"] = kv_pool_bytes(engine.runner.kv) / 2**30
        for shape, choice in engine.runner.linear_choices.items():
            print(f"[bench] linear {shape[0]}x{shape[1]} at batch 1: {choice}", flush=True)
        if want("decode"):
            bench_decode_b1(report, engine, roof, 64 if args.quick else 256)
            for batch in (1, 256):
                bench_decode_step(report, engine, roof, batch)
        if want("prefill"):
            bench_prefill(report, engine, roof)
        count = 32 if args.quick else 256
        if want("throughput"):
            bf16_throughput = bench_throughput(
                report, engine, "throughput", count, False, 64 if args.quick else 512
            )
        if want("plain"):  # the same without the overlapped step loop, for comparison
            engine.overlap = False
            bench_throughput(
                report,
                engine,
                "throughput, plain step loop",
                count,
                False,
                64 if args.quick else 512,
            )
            engine.overlap = True
        if want("var"):
            bench_throughput(report, engine, "throughput-var", count, True, 0)
        if want("logprobs"):
            from sv_cli.bench_logprobs import bench_logprobs

            bench_logprobs(report, engine, args.quick)
        if want("grammar"):  # JSON-schema constrained decoding beside unconstrained
            from sv_cli.bench_grammar import bench_grammar

            bench_grammar(report, engine, 64 if args.quick else 256, 16 if args.quick else 64)
        if args.profile:
            run_profiles(engine, Path(args.workdir))
        del engine
        free_device_memory()
    workloads = {name for name in ("decode", "prefill", "throughput") if want(name)}
    profile_dir = Path(args.workdir) if args.profile else None
    for mode in modes:
        bench_quantized(
            report,
            model_dir,
            roof,
            mode,
            workloads,
            args.quick,
            bf16_throughput,
            profile_dir=profile_dir,
        )
    if "fp8" in modes and "throughput" in workloads:
        bench_quantized(
            report,
            model_dir,
            roof,
            "fp8",
            {"throughput"},
            args.quick,
            bf16_throughput,
            kv_cache_dtype="fp8",
            profile_dir=profile_dir,
        )
    if only is not None and "spec" in only:
        from sv_cli import bench_spec

        engine = _engine(model_dir, max_num_seqs=256)
        costs = bench_spec.bench_verify_steps(
            report, engine, profile_dir=Path(args.workdir) if args.profile else None
        )
        del engine
        free_device_memory()
        plain = bench_spec.bench_spec_decode_b1(report, model_dir, 64 if args.quick else 256)
        for trace in args.spec_trace:
            bench_spec.replay_trace(report, costs, Path(trace), plain)
        from sv_scheduler import SpeculationConfig

        # At 64 the default max_batch (32) turns drafting off; without the limit, what
        # drafting would cost there; at 32 what it costs where the default still drafts.
        unlimited = SpeculationConfig(max_batch=None)
        for batch, label, spec in (
            (64, "", None),
            (64, " --speculate ngram", SpeculationConfig()),
            (64, " --speculate ngram --spec-max-batch 0", unlimited),
            (32, "", None),
            (32, " --speculate ngram", SpeculationConfig()),
        ):
            engine = _engine(model_dir, max_num_seqs=256, speculation=spec)
            bench_throughput(report, engine, f"throughput-b{batch}{label}", batch, False, 256)
            del engine
            free_device_memory()
    if only is not None and "tp" in only:
        from sv_cli.bench_tp import bench_tensor_parallel

        bench_tensor_parallel(report, model_dir, roof, args.tensor_parallel_size, args.quick)
    if args.peer:
        bench_peer(report, model_dir, args.quick)
    report.add(Row("host probe at end", host_probe_ms(), "ms", note="sum(range(10**7))"))
    print("\n" + report.table())
    if args.json:
        Path(args.json).write_text(
            json.dumps({"info": report.info, "rows": [r.__dict__ for r in report.rows]}, indent=1)
        )
    return 0
