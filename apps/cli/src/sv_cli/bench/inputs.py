"""What the benchmarks run on and feed: the random-weight checkpoint of a preset, the engine
over it, random prompts, and the decode step of the scratch block-table row that the step
timings and the critical-path profile replay."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

DEFAULT_PRESET = "llama-3.2-1b"
# Prompt token ids are drawn below this (Llama 3's vocabulary); a smaller vocabulary (Mistral's
# 32,000) takes them modulo its size, so the 1B workloads stay the ones of BENCHMARKS.md.
PROMPT_ID_BOUND = 128000
# The tokenizer files `prepare_checkpoint` copies into the checkpoint: the engine loads one of
# them (tokenizer.json first); tokenizer_config.json comes along when there.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


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
        for name in (*TOKENIZER_FILES, "tokenizer_config.json"):
            if (tokenizer_dir / name).exists() and not (model_dir / name).exists():
                shutil.copy(tokenizer_dir / name, model_dir / name)
    return model_dir


def bench_engine(model_dir: Path, **kwargs: Any) -> Any:
    """An engine over `model_dir` on CUDA (`Engine.from_model_dir`'s keywords), its GEMV
    tuning kept on disk so that the next engine of the run, or of the next run, skips it."""
    from sv_engine import Engine
    from sv_engine.options import default_tuning_cache

    kwargs.setdefault("tuning_cache", default_tuning_cache())
    return Engine.from_model_dir(model_dir, device="cuda", **kwargs)


def random_prompts(
    rng: random.Random, count: int, lo: int, hi: int, vocab: int = PROMPT_ID_BOUND
) -> list[list[int]]:
    """`count` prompts of `lo`..`hi` token ids drawn from `rng` (lengths and ids from the one
    stream, as the throughput workload of BENCHMARKS.md draws them), each id modulo `vocab`."""
    return [
        [rng.randint(0, PROMPT_ID_BOUND - 1) % vocab for _ in range(rng.randint(lo, hi))]
        for _ in range(count)
    ]


def vocab_size(engine: Any) -> int:
    """The engine's model's vocabulary size, the bound of the prompts drawn for it."""
    return int(engine.runner.config.vocab_size)


def scratch_decode_step(runner: Any, batch: int) -> Any:
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
