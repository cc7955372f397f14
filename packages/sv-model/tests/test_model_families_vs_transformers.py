"""Each supported family against transformers' own class for it, on the same random weights.

The configs are the published ones (sv_weights presets) scaled down for the CPU: the sizes
shrink, everything that tells the families apart stays (GQA ratio, head_dim apart from
hidden / heads, tied or untied embeddings, RoPE theta and scaling, q/k/v biases, q/k norms,
a sliding window). FP32: teacher-forced logits within 1e-4 (relative), greedy tokens equal.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from sv_model import ModelRunner, ModelWeights, StepInputs
from sv_weights import ModelConfig, load_checkpoint, preset_config, write_random_checkpoint

PAGE = 16
VOCAB = 512
MISTRAL_WINDOW = 24  # small, so that positions past it are cheap to reach

# Sizes per preset: the GQA ratio and whether head_dim is hidden / heads stay as published.
SCALED: dict[str, dict[str, object]] = {
    # 32 heads over 8 KV heads (4:1), head_dim 128 = hidden / heads, untied, llama3 x8
    "llama-3.1-8b": {"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2},
    # 24 over 8 (3:1), tied, llama3 x32
    "llama-3.2-3b": {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2},
    # 14 over 2 (7:1), head_dim 64 = hidden / heads, q/k/v biases, theta 1e6, tied
    "qwen2.5-0.5b": {"hidden_size": 112, "num_attention_heads": 7, "num_key_value_heads": 1},
    # 16 over 8 (2:1), head_dim 128 while hidden / heads is 64, q/k norms, tied
    "qwen3-0.6b": {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 4},
    # 32 over 8 (4:1), untied, a sliding window
    "mistral-7b": {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "sliding_window": MISTRAL_WINDOW,
    },
}
HF_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
}


def scaled_config(preset: str) -> ModelConfig:
    published = preset_config(preset)
    sizes = dict(SCALED[preset])
    heads = int(sizes["num_attention_heads"])  # type: ignore[call-overload]
    hidden = int(sizes["hidden_size"])  # type: ignore[call-overload]
    # Qwen3 keeps head_dim at twice hidden / heads, as published (128 against 1024 / 16).
    head_dim = 2 * hidden // heads if preset.startswith("qwen3") else hidden // heads
    return dataclasses.replace(
        published,
        num_hidden_layers=2,
        head_dim=head_dim,
        intermediate_size=3 * hidden,
        vocab_size=VOCAB,
        bos_token_id=1,
        eos_token_ids=(2,),
        **sizes,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module", params=list(SCALED))
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(d, scaled_config(request.param), seed=3, dtype=torch.float32)
    return d


def make_runner(model_dir: Path) -> ModelRunner:
    config = ModelConfig.from_model_dir(model_dir)
    weights = ModelWeights.from_state_dict(config, load_checkpoint(model_dir), "cpu", torch.float32)
    return ModelRunner(config, weights, num_pages=64)


def hf_model(model_dir: Path) -> transformers.PreTrainedModel:
    config = ModelConfig.from_model_dir(model_dir)
    cls = HF_CLASSES[config.model_type]
    model = cls.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    assert type(model) is cls
    if config.architecture.qkv_bias:  # the biases were loaded, not initialised to zero
        assert model.model.layers[0].self_attn.k_proj.bias.abs().sum() > 0
    return model.eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def shuffled_pages(count: int, seed: int) -> list[int]:
    return torch.randperm(64, generator=torch.Generator().manual_seed(seed))[:count].tolist()


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_teacher_forced_logits_in_two_chunks(family_dir: Path) -> None:
    """Every position of a 70-token sequence (past Mistral's window of 24 several times), fed
    as two prefill chunks: the second attends to the first from the cache."""
    runner = make_runner(family_dir)
    ids = random_ids(70, seed=4)
    runner.set_block_tables([(0, shuffled_pages(5, seed=5))])
    first = runner.logits(
        StepInputs(ids[:29], list(range(29)), [0], [29], [29], [0]), every_token=True
    )
    second = runner.logits(
        StepInputs(ids[29:], list(range(29, 70)), [0], [41], [70], [0]), every_token=True
    )
    with torch.no_grad():
        expected = hf_model(family_dir)(torch.tensor([ids])).logits[0]
    assert rel(torch.cat([first, second]), expected) < 1e-4


def test_greedy_tokens_equal_transformers_generate(family_dir: Path) -> None:
    """Prefill, then 40 decode steps (through positions past the window), one token each."""
    runner = make_runner(family_dir)
    prompt = random_ids(19, seed=6)
    runner.set_block_tables([(0, shuffled_pages(4, seed=7))])
    seq = list(prompt)
    seq.append(runner.execute(StepInputs(seq, list(range(19)), [0], [19], [19], [0]))[0])
    for _ in range(39):
        n = len(seq)
        seq.append(runner.execute(StepInputs([seq[-1]], [n - 1], [0], [1], [n], [0]))[0])
    expected = hf_model(family_dir).generate(
        torch.tensor([prompt]),
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0]
    assert seq == expected.tolist()


def test_unknown_model_type_is_one_line_naming_it(tmp_path: Path) -> None:
    import json

    from sv_weights import WeightsError

    config = scaled_config("llama-3.2-3b").to_json_dict()
    config["model_type"] = "gemma2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError) as caught:
        ModelConfig.from_model_dir(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert "'gemma2' is not supported (supported: llama, mistral, qwen2, qwen3)" in message
