"""--trace on CUDA: device timings from CUDA events, and top-5 logprobs read from the logits of
graph-replayed decode steps (a buffer the next replay overwrites).

Run on the device machine by scripts/gpu-check.sh (`pytest -m gpu`); skipped without CUDA."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_a_cuda_trace(tmp_path: Path) -> None:
    from sv_engine import Engine, SamplingParams
    from sv_engine.tracing import start_trace, stop_trace
    from sv_trace import read_trace
    from sv_weights import tiny_llama_config, write_random_checkpoint

    tok_dir = Path(os.environ.get("SV_TOKENIZER_DIR", ".assets/llama-3.2-tokenizer"))
    if not (tok_dir / "tokenizer.json").exists():
        pytest.skip(f"no Llama tokenizer in {tok_dir}")
    model = tmp_path / "tiny"
    config = tiny_llama_config(
        vocab_size=128256, bos_token_id=128000, eos_token_ids=(128001, 128009),
        tie_word_embeddings=False,
    )  # fmt: skip
    write_random_checkpoint(model, config, seed=0, dtype=torch.bfloat16)
    shutil.copy(tok_dir / "tokenizer.json", model / "tokenizer.json")
    engine = Engine.from_model_dir(model, device="cuda", kv_cache_mib=64, max_num_seqs=16)
    prompts = ["Write a haiku about the sea.", "What is 2 + 2?", "Name three colours."]
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    plain = engine.generate(prompts, params)
    start_trace(engine, tmp_path / "t.jsonl", model="tiny")
    traced = engine.generate(prompts, params)
    stop_trace(engine)
    # tracing changes nothing the engine computes
    assert [c.output_ids for c in traced] == [c.output_ids for c in plain]
    records = read_trace(tmp_path / "t.jsonl")
    assert records[0]["clock"] == "cuda"
    steps = [r for r in records if r["type"] == "step"]
    assert all(s["timing"]["device_ms"] is not None and s["timing"]["device_ms"] > 0 for s in steps)
    decodes = [s for s in steps if not s["prefills"]]
    assert decodes, "the run must have graph-replayed decode steps"
    for s in steps:
        for x in s["sampled"]:
            tops = [t["logprob"] for t in x["top"]]
            assert tops == sorted(tops, reverse=True) and all(math.isfinite(t) for t in tops)
            assert x["top"][0]["token"] == x["token"]  # greedy: the most likely
            assert x["logprob"] == pytest.approx(tops[0], abs=1e-5)
            assert sum(math.exp(t) for t in tops) <= 1 + 1e-4
    for c in traced:
        tokens = [x["token"] for s in steps for x in s["sampled"]
                  if x["request"] == c.request_id and not x["dropped"]]  # fmt: skip
        assert tokens == c.output_ids
