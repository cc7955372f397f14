"""`sv bench`'s workloads run on the CPU (the engine on a tiny random model, CUDA's timing calls
stubbed): what they feed the engine and what their rows count, not their figures."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from sv_cli.bench import grammar, inputs, logprobs, spec, workloads
from sv_cli.bench.report import Report
from sv_engine import Engine
from sv_weights import tiny_llama_config, write_random_checkpoint

ROOF = {"copy_bw": 1e11, "gemm": 1e12, "h2d": 1e10}
# The tokenizer's (the default model's, 49,152 ids: a grammar needs the model's vocabulary to be
# its tokenizer's), and one smaller, where a shifted id reaches past it.
TOKENIZER_VOCAB, SMALL_VOCAB = 49152, 1000


class _Event:
    """A CUDA event's stand-in (the throughput rows time every step with two)."""

    def __init__(self, **_kwargs: object) -> None:
        pass

    def record(self) -> None:
        pass

    def elapsed_time(self, _end: _Event) -> float:
        return 0.0


@pytest.fixture(scope="module")
def small_vocab_dirs(
    default_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, Path]:
    """Tiny random models with the default model's tokenizer, by vocabulary size (both
    smaller than Llama's 128,000 prompt ids, as Mistral's 32,000 is)."""
    dirs = {}
    for vocab in (TOKENIZER_VOCAB, SMALL_VOCAB):
        d = dirs[vocab] = tmp_path_factory.mktemp(f"vocab-{vocab}")
        config = tiny_llama_config(vocab_size=vocab, bos_token_id=1, eos_token_ids=(2,))
        write_random_checkpoint(d, config, seed=0, dtype=torch.float32)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (default_model / name).exists():
                shutil.copy(default_model / name, d / name)
    return dirs


@pytest.fixture
def cpu_engine(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`bench_engine` on the CPU, and CUDA's synchronize, peak-memory reset and events as
    no-ops, so the workloads run here as they run on the GPU."""

    def open_engine(model_dir: Path, **kwargs: Any) -> Any:
        kwargs.setdefault("kv_cache_mib", 64)
        return Engine.from_model_dir(model_dir, device="cpu", **kwargs)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(workloads, "bench_engine", open_engine)
    monkeypatch.setattr(inputs, "bench_engine", open_engine)
    return open_engine


@pytest.mark.parametrize("workload", ["prefill", "logprobs", "grammar", "long", "spec"])
def test_prompts_fit_a_smaller_vocabulary(
    workload: str,
    small_vocab_dirs: dict[int, Path],
    cpu_engine: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--preset mistral-7b` (32,000 ids): these workloads drew ids up to 127,999 (or shifted
    them past the vocabulary), and the engine refused the first such prompt, ending the run."""
    # logprobs' throughput pairs draw their prompts as the throughput rows do (within the
    # vocabulary); on the CPU they take most of a minute, so only its decode-b1 pair runs.
    monkeypatch.setattr(logprobs, "bench_throughput", lambda *args, **kwargs: 1.0)
    small_vocab_dir = small_vocab_dirs[TOKENIZER_VOCAB if workload == "grammar" else SMALL_VOCAB]
    report = Report()
    runs: dict[str, Callable[[], object]] = {
        "prefill": lambda: workloads.bench_prefill(report, cpu_engine(small_vocab_dir), ROOF),
        "logprobs": lambda: logprobs.bench_logprobs(report, cpu_engine(small_vocab_dir), True),
        "grammar": lambda: grammar.bench_grammar(report, cpu_engine(small_vocab_dir), 4, 2),
        "long": lambda: workloads.bench_long_context(report, small_vocab_dir, ROOF, [48], 4, []),
        "spec": lambda: spec.bench_spec_decode_b1(report, small_vocab_dir, 4),
    }
    runs[workload]()
    assert report.rows


@pytest.mark.parametrize("workload", ["decode", "grammar"])
def test_every_timed_decode_b1_prompt_is_cold(
    workload: str, small_vocab_dirs: dict[int, Path], cpu_engine: Callable[..., Any]
) -> None:
    """Each decode-b1 row reports its TTFT; the rows after the first (sampled, plain step loop;
    the JSON-schema one) streamed the prompt the first had left in the prefix cache, so their
    TTFT was that of a cached prompt."""
    engine = cpu_engine(small_vocab_dirs[TOKENIZER_VOCAB])
    stream = engine.stream
    hits: list[int] = []

    def counted(prompts: Any, params: Any) -> Any:
        before = engine.stats.prefix_cache_hit_tokens
        yield from stream(prompts, params)
        hits.append(engine.stats.prefix_cache_hit_tokens - before)

    engine.stream = counted
    report = Report()
    if workload == "decode":
        workloads.bench_decode_b1(report, engine, ROOF, 4)
    else:
        grammar.bench_grammar(report, engine, 4, 2)
    assert len(hits) == (3 if workload == "decode" else 2)
    assert hits == [0] * len(hits)
