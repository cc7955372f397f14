"""n choices per prompt: independent draws from the single-request distribution, sharing the
prompt's full pages, every page back at the end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from sv_engine import Engine, EngineError, SamplingParams

VOCAB = 16
PROMPT = [i * 7 % 14 + 1 for i in range(20)]  # ids 1..14; one full page, and a partial one


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test, with the chi-square survival function as the regularized gamma."""
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))


def binomial_z(successes: int, trials: int, p: float) -> float:
    return (successes - trials * p) / (trials * p * (1 - p)) ** 0.5


def all_pages_back(engine: Engine) -> bool:
    stats = engine.stats
    return stats.free_pages == stats.pool_pages


# Sharpens the small random model's near-uniform distribution, so that a wrong sampler shows.
TEMPERATURE = 0.2


def next_token_probs(model_dir: Path) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, -1]
    return torch.softmax(logits.double() / TEMPERATURE, dim=-1)


def test_choices_are_independent_draws_of_the_single_request_distribution(
    tiny_vocab_dir: Path,
) -> None:
    engine = Engine.from_model_dir(tiny_vocab_dir, device="cpu", kv_cache_mib=8)
    probs = next_token_probs(tiny_vocab_dir)
    n, seeds = 32, range(30)
    draws = []
    for seed in seeds:
        params = SamplingParams(max_new_tokens=1, temperature=TEMPERATURE, seed=seed, n=n)
        done = engine.generate([PROMPT], params)
        assert len(done) == n
        draws.append([c.output_ids[0] for c in done])
        if seed < 5:  # choice 0 is the draw of the same request with n = 1
            single = SamplingParams(max_new_tokens=1, temperature=TEMPERATURE, seed=seed)
            assert engine.generate([PROMPT], single)[0].output_ids[0] == draws[-1][0]
    assert all_pages_back(engine)
    tokens = torch.tensor(draws)  # [seed, choice]
    counts = torch.bincount(tokens.flatten(), minlength=VOCAB).double()
    expected = probs * counts.sum()
    keep = expected >= 5  # chi-square wants >= 5 per bin: pool the rare tokens into one
    observed, wanted = counts[keep], expected[keep]
    if not keep.all():
        observed = torch.cat([observed, counts[~keep].sum().unsqueeze(0)])
        wanted = torch.cat([wanted, expected[~keep].sum().unsqueeze(0)])
    assert chi_square_p_value(observed, wanted) > 1e-3
    # Independent: two choices of one request agree as often as two independent draws.
    pairs = tokens[:, :-1].numel()
    agree = int((tokens[:, :-1] == tokens[:, 1:]).sum())
    assert abs(binomial_z(agree, pairs, float((probs**2).sum()))) < 3.5


def test_choices_share_the_prompts_full_pages(tiny_llama_dir: Path) -> None:
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    prompt = list(range(1000, 1040))  # 40 tokens: two full pages and a partial one
    greedy = SamplingParams(max_new_tokens=6, n=4)
    done = engine.generate([prompt], greedy)
    alone = engine.generate([list(range(2000, 2040))], SamplingParams(max_new_tokens=6))[0]
    # Greedy choices are the same answer; all but the first found both full pages computed.
    assert len({tuple(c.output_ids) for c in done}) == 1
    assert [c.num_cached_tokens for c in done] == [0, 32, 32, 32]
    assert alone.num_cached_tokens == 0
    assert all_pages_back(engine)


def test_seeded_choices_are_reproducible_and_differ(tiny_llama_dir: Path) -> None:
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11, n=3, ignore_eos=True)
    first = [c.output_ids for c in engine.generate(["Tell me a story."], params)]
    assert [c.output_ids for c in engine.generate(["Tell me a story."], params)] == first
    assert len({tuple(ids) for ids in first}) == 3


def test_n_is_checked_and_add_request_takes_one_choice(tiny_llama_dir: Path) -> None:
    for bad in (0, 129, True, 2.0):
        with pytest.raises(EngineError, match="n must be an integer from 1 to 128"):
            SamplingParams(n=bad)  # type: ignore[arg-type]
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    with pytest.raises(EngineError, match="use add_choices"):
        engine.add_request("Hi", SamplingParams(n=2))
    assert not engine.has_unfinished()
