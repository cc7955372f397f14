"""An FP8 (e4m3) KV pool: twice the pages of BF16 in the same memory (four times FP32's), and
on the real default model logits that stay close to transformers' FP32 ones, through prefill
and decode, with every page back at the end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from sv_engine import Engine, EngineError, SamplingParams
from sv_model import StepInputs
from sv_weights import ModelConfig

TEXT = (
    "The river runs past the old mill, where the wheel has not turned for forty years. "
    "Children still come on summer evenings to throw stones into the millpond and count "
    "the rings. def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n"
)


def test_an_fp8_pool_holds_four_times_the_fp32_pages(tiny_llama_dir: Path) -> None:
    config = ModelConfig.from_model_dir(tiny_llama_dir)
    fp8 = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8, kv_cache_dtype="fp8")
    fp32 = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    # K and V, every layer and KV head, 16 tokens, one byte each.
    page_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 16
    assert fp8.stats.pool_pages == 8 * 2**20 // page_bytes
    assert fp32.stats.pool_pages == 8 * 2**20 // (4 * page_bytes)
    assert fp8.runner.kv.k.dtype == torch.float8_e4m3fn
    with pytest.raises(EngineError, match="kv_cache_dtype must be one of auto, fp8"):
        Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_dtype="int4")  # type: ignore[arg-type]


def test_fp8_kv_logits_stay_close_to_transformers(default_model: Path) -> None:
    engine = Engine.from_model_dir(
        default_model, device="cpu", kv_cache_mib=16, kv_cache_dtype="fp8"
    )
    ids = engine.tokenizer.encode(TEXT)
    n = len(ids)
    runner = engine.runner
    runner.set_block_tables([(0, list(range(-(-n // 16))))])
    # Teacher-forced: the first half as one prefill chunk, then the rest one decode step each,
    # so that both attention paths read FP8 pages written by earlier steps.
    half = n // 2
    ours = [runner.logits(StepInputs(ids[:half], list(range(half)), [0], [half], [half], [0]))]
    for p in range(half, n):
        ours.append(runner.logits(StepInputs([ids[p]], [p], [0], [1], [p + 1], [0])))
    logits = torch.cat(ours)  # positions half-1 .. n-1
    model = transformers.LlamaForCausalLM.from_pretrained(default_model, dtype=torch.float32)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, half - 1 :]
    kl = torch.nn.functional.kl_div(
        logits.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="none"
    ).sum(-1)
    agree = (logits.argmax(-1) == want.argmax(-1)).float().mean()
    print(f"fp8 KV vs FP32 transformers: mean KL {kl.mean():.4f}, top-1 agreement {agree:.3f}")
    assert kl.mean() < 0.02
    assert agree >= 0.9


def test_fp8_greedy_generation_frees_every_page(default_model: Path) -> None:
    engine = Engine.from_model_dir(
        default_model, device="cpu", kv_cache_mib=16, kv_cache_dtype="fp8"
    )
    done = engine.generate(
        ["Name three rivers.", "Count to five."], SamplingParams(max_new_tokens=12)
    )
    assert all(c.output_ids for c in done)
    assert engine.stats.free_pages == engine.stats.pool_pages
