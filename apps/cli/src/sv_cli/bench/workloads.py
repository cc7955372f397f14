"""The benchmarks `sv bench` runs, one function each: load, memory, decode-b1, long
context, the decode step's GPU time, prefill, throughput, the quantized modes beside BF16, and
the transformers peer. Each measures on the engine or checkpoint it is given and adds its rows
to the report."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sv_cli.bench.inputs import (
    PROMPT_ID_BOUND,
    bench_engine,
    random_prompts,
    scratch_decode_step,
    vocab_size,
)
from sv_cli.bench.profiles import profile_decode_batch, profile_decode_path
from sv_cli.bench.report import Report, Row
from sv_cli.bench.timing import (
    collector_time,
    free_device_memory,
    replayed_ms,
    step_times,
)

MIB = 1 << 20


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


def bench_decode_b1(
    report: Report, engine: Any, roof: dict[str, float], new_tokens: int, tag: str = ""
) -> None:
    from sv_engine import SamplingParams

    from sv_cli.bench.runner import weight_bytes_per_decode_step

    weight_bytes = weight_bytes_per_decode_step(engine.runner.model.weights)
    rng = random.Random(1)
    warm, prompt = random_prompts(
        rng, 2, 128, 128, vocab_size(engine)
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
        # The rows share the prompt: without this, the ones after the first found it in the
        # prefix cache, and their TTFT was a cached prompt's.
        engine.clear_prefix_cache()
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
    from sv_weights import ModelConfig

    from sv_cli.bench.runner import weight_bytes_per_decode_step

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    rng = random.Random(7)
    # Drawn before the first engine, within the model's vocabulary (a smaller one than Llama's
    # was refused at the first prompt): its config says it.
    vocab = ModelConfig.from_model_dir(model_dir).vocab_size
    prompts = {n: random_prompts(rng, 1, n, n, vocab)[0] for n in contexts}
    runs = [(None, "auto"), (None, "fp8")] + [(mode, "fp8") for mode in quantization]
    for mode, kv_dtype in runs:
        engine = bench_engine(
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
    from sv_cli.bench.runner import decode_replay, weight_bytes_per_decode_step

    runner = engine.runner
    ms = replayed_ms(decode_replay(runner, scratch_decode_step(runner, batch)))
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


def bench_prefill(report: Report, engine: Any, roof: dict[str, float], tag: str = "") -> None:
    import torch
    from sv_engine import SamplingParams

    from sv_cli.bench.runner import num_parameters

    config = engine.runner.config
    vocab = vocab_size(engine)
    prompt = random_prompts(random.Random(2), 1, 2048, 2048, vocab)[0]
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    best = float("inf")
    for i in range(6):
        # a different prompt each time, so the prefix cache does not serve it; kept within
        # Llama's ids (the workload of BENCHMARKS.md) and the model's vocabulary (a smaller
        # one, as Mistral's 32,000, refuses an id shifted past it, ending the run)
        p = [(t + i + 1) % PROMPT_ID_BOUND % vocab for t in prompt]
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

    from sv_cli.bench.runner import kv_pool_bytes

    rng = random.Random(0)
    prompts = random_prompts(rng, count, 100, 1024, vocab_size(engine))
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

    from sv_cli.bench.runner import weight_bytes_per_decode_step

    engine = bench_engine(
        model_dir, max_num_seqs=256, quantization=mode, kv_cache_dtype=kv_cache_dtype
    )
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


def bench_peer(report: Report, model_dir: Path, quick: bool) -> None:
    """transformers on the same checkpoint: generate() at batch 1, and its continuous batching
    (generate_batch) on the first requests of the throughput workload."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = model.cuda().eval()
    vocab = int(model.config.vocab_size)
    prompt = torch.tensor([random_prompts(random.Random(1), 1, 128, 128, vocab)[0]], device="cuda")
    new = 16 if quick else 64
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    model.generate(prompt, max_new_tokens=4, min_new_tokens=4, **kwargs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **kwargs)
    torch.cuda.synchronize()
    report.add(Row("peer: transformers generate b1", new / (time.perf_counter() - t0), "tok/s"))
    count, new = (16, 64) if quick else (64, 512)
    prompts = random_prompts(random.Random(0), count, 100, 1024, vocab)
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
