"""config.json parsing, against hand-copied real files and transformers.LlamaConfig (oracle)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_values
from sv_weights import (
    ModelConfig,
    RopeScaling,
    WeightsError,
    llama_3_2_1b_config,
    tiny_llama_config,
)
from sv_weights.quantization import read_quantization

# meta-llama/Llama-3.2-1B-Instruct/config.json, as published.
LLAMA_3_2_1B_INSTRUCT_JSON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

# HuggingFaceTB/SmolLM2-135M(-Instruct)/config.json: no head_dim key, eos as an int.
SMOLLM2_135M_JSON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 49152,
}


def write_json(tmp_path: Path, value: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(value))
    return path


def test_llama_3_2_1b_instruct_file(tmp_path: Path) -> None:
    config = ModelConfig.from_json(write_json(tmp_path, LLAMA_3_2_1B_INSTRUCT_JSON))
    assert config == llama_3_2_1b_config()
    assert config.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert config.eos_token_ids == (128001, 128008, 128009)


def test_llama_3_2_1b_config_writes_the_published_file() -> None:
    written = llama_3_2_1b_config().to_json_dict()
    published = {k: v for k, v in LLAMA_3_2_1B_INSTRUCT_JSON.items() if k != "transformers_version"}
    assert written == published


def test_smollm2_135m_file(tmp_path: Path) -> None:
    config = ModelConfig.from_model_dir(write_json(tmp_path, SMOLLM2_135M_JSON).parent)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (
        576,
        30,
        9,
    )
    assert (config.num_key_value_heads, config.head_dim, config.intermediate_size) == (3, 64, 1536)
    assert (config.vocab_size, config.max_position_embeddings) == (49152, 8192)
    assert config.rope_theta == 100000.0 and isinstance(config.rope_theta, float)
    assert config.rope_scaling is None and config.tie_word_embeddings
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1


def test_legacy_rope_scaling_type_key(tmp_path: Path) -> None:
    raw = json.loads(json.dumps(LLAMA_3_2_1B_INSTRUCT_JSON))
    raw["rope_scaling"]["type"] = raw["rope_scaling"].pop("rope_type")
    assert ModelConfig.from_json(write_json(tmp_path, raw)) == llama_3_2_1b_config()


@pytest.mark.parametrize(
    "config", [llama_3_2_1b_config(), tiny_llama_config(), tiny_llama_config(rope_scaling=None)]
)
def test_round_trip_through_transformers(tmp_path: Path, config: ModelConfig) -> None:
    """Our config.json read by transformers, saved by transformers 5 (rope_parameters), read back."""
    config.write_json(tmp_path / "config.json")
    theirs = transformers.LlamaConfig.from_pretrained(tmp_path)
    assert theirs.hidden_size == config.hidden_size
    assert theirs.num_hidden_layers == config.num_hidden_layers
    assert theirs.num_attention_heads == config.num_attention_heads
    assert theirs.num_key_value_heads == config.num_key_value_heads
    assert theirs.head_dim == config.head_dim
    assert theirs.intermediate_size == config.intermediate_size
    assert theirs.vocab_size == config.vocab_size
    assert theirs.rms_norm_eps == config.rms_norm_eps
    assert theirs.max_position_embeddings == config.max_position_embeddings
    assert theirs.tie_word_embeddings == config.tie_word_embeddings
    assert theirs.bos_token_id == config.bos_token_id
    eos = theirs.eos_token_id
    assert tuple(eos if isinstance(eos, list) else [eos]) == config.eos_token_ids
    rope = theirs.rope_parameters
    assert rope["rope_theta"] == config.rope_theta
    if config.rope_scaling is None:
        assert rope["rope_type"] == "default"
    else:
        assert {k: rope[k] for k in dataclasses.asdict(config.rope_scaling)} == dataclasses.asdict(
            config.rope_scaling
        )
    resaved = tmp_path / "resaved"
    theirs.save_pretrained(resaved)
    assert "rope_parameters" in json.loads((resaved / "config.json").read_text())
    back = ModelConfig.from_model_dir(resaved)
    # transformers 5 writes `dtype` only when one was set; everything else must survive.
    assert dataclasses.replace(back, torch_dtype=config.torch_dtype) == config


def _saved_by_transformers_5(tmp_path: Path, config: ModelConfig) -> dict[str, Any]:
    """`config` as transformers 5 writes it: RoPE in `rope_parameters`, no `rope_scaling`."""
    config.write_json(tmp_path / "config.json")
    transformers.LlamaConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "saved")
    raw: dict[str, Any] = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert "rope_parameters" in raw and raw.get("rope_scaling") is None
    return raw


def test_rope_scaling_added_to_a_transformers_5_config_is_not_ignored(tmp_path: Path) -> None:
    """A user adds `rope_scaling` to a config saved with `rope_parameters`: transformers then
    runs that scaling, so reading `rope_parameters` alone would run another RoPE, silently."""
    raw = _saved_by_transformers_5(tmp_path, tiny_llama_config(rope_scaling=None))
    raw["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    path = write_json(tmp_path, raw)
    assert transformers.LlamaConfig.from_pretrained(tmp_path).rope_parameters["rope_type"] == (
        "linear"
    )
    with pytest.raises(WeightsError, match="rope_scaling: rope_type 'linear' is not supported"):
        ModelConfig.from_json(path)

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}
    raw["rope_scaling"] = {
        **llama3,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    with pytest.raises(WeightsError, match="'rope_scaling' and 'rope_parameters' disagree"):
        ModelConfig.from_json(write_json(tmp_path, raw))


def test_both_rope_spellings_agreeing_are_read(tmp_path: Path) -> None:
    config = llama_3_2_1b_config()
    raw = _saved_by_transformers_5(tmp_path, config)
    raw["rope_scaling"] = dataclasses.asdict(config.rope_scaling)
    raw["rope_theta"] = config.rope_theta
    assert (
        dataclasses.replace(
            ModelConfig.from_json(write_json(tmp_path, raw)), torch_dtype=config.torch_dtype
        )
        == config
    )


def test_defaults_match_transformers(tmp_path: Path) -> None:
    minimal = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256,
    }
    ours = ModelConfig.from_json(write_json(tmp_path, minimal))
    theirs = transformers.LlamaConfig(**minimal)
    assert ours.num_key_value_heads == theirs.num_key_value_heads == 4
    assert ours.head_dim == theirs.head_dim == 16
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 10000.0
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings is False
    assert ours.rope_scaling is None and ours.eos_token_ids == () and ours.bos_token_id is None


def test_null_where_transformers_reads_it_as_its_default(tmp_path: Path) -> None:
    """num_key_value_heads and head_dim null: derived, as transformers derives them; a missing
    rope_theta is the default. (An explicit null rope_theta is an error: BAD_CONFIGS.)"""
    raw = _with(SMOLLM2_135M_JSON, num_key_value_heads=None, head_dim=None, rope_theta=_DROP)
    ours = ModelConfig.from_json(write_json(tmp_path, raw))
    theirs = transformers.LlamaConfig(**raw)
    assert ours.num_key_value_heads == theirs.num_key_value_heads == 9
    assert ours.head_dim == theirs.head_dim == 64
    assert ours.rope_theta == 10000.0


def test_empty_eos_list_means_no_eos_as_in_transformers(tmp_path: Path) -> None:
    path = write_json(tmp_path, _with(SMOLLM2_135M_JSON, eos_token_id=[]))
    assert transformers.LlamaConfig.from_pretrained(tmp_path).eos_token_id == []
    assert ModelConfig.from_json(path).eos_token_ids == ()


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    raw = dict(base)
    for key, value in changes.items():
        if value is _DROP:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


_DROP = object()

BAD_CONFIGS = [
    # An integer past a float's range (JSON has no limit) is refused by name, not OverflowError.
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_theta=10**400),
        "rope_theta: expected a positive float",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, rms_norm_eps=10**400), "rms_norm_eps: expected a positive"),
    (
        _with(
            LLAMA_3_2_1B_INSTRUCT_JSON,
            rope_scaling={**LLAMA_3_2_1B_INSTRUCT_JSON["rope_scaling"], "factor": 10**400},
        ),
        "rope_scaling.factor: expected a positive number",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, hidden_size=_DROP), "key 'hidden_size' is missing"),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, vocab_size=_DROP), "key 'vocab_size' is missing"),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, hidden_size="2048"),
        "key 'hidden_size': expected int, got '2048'",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, num_hidden_layers=16.0),
        "key 'num_hidden_layers': expected int",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, num_hidden_layers=True),
        "key 'num_hidden_layers': expected int",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, rms_norm_eps="1e-5"), "key 'rms_norm_eps': expected float"),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, tie_word_embeddings=1),
        "key 'tie_word_embeddings': expected bool",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, num_key_value_heads=5),
        "multiple of num_key_value_heads (5)",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, hidden_size=0),
        "hidden_size: expected a positive integer, got 0",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, head_dim=_DROP, hidden_size=2050),
        "hidden_size (2050) is not a multiple",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, head_dim=63), "even head_dim"),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, eos_token_id="x"),
        "'eos_token_id': expected an integer or a list",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, eos_token_id=[1, 200000]), "token id 200000"),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, bos_token_id=1.5),
        "'bos_token_id': expected an integer or null",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, torch_dtype="int8"), "'torch_dtype': expected one of"),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, model_type="gemma2"),
        "model_type 'gemma2' is not supported (supported: llama, mistral, qwen2, qwen3)",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, attention_bias=True),
        "'attention_bias': biases are not supported",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, hidden_act="gelu"), "'hidden_act': 'gelu' is not supported"),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
        "rope_type 'yarn' is not supported",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_scaling={"rope_type": "llama3", "factor": 32.0}),
        "rope_scaling key 'low_freq_factor' is missing",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_scaling=[1]),
        "'rope_scaling': expected an object or null",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_theta=-1.0), "rope_theta: expected a positive float"),
    # an explicit null is not the default (it was: theta 10000 for a config transformers fails on)
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_theta=None),
        "config key 'rope_theta': expected a number, got null (leave the key out for its default)",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_theta=True), "key 'rope_theta': expected float"),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_theta="5e5"), "key 'rope_theta': expected float"),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, rope_theta=0), "rope_theta: expected a positive float"),
    (
        _with(
            LLAMA_3_2_1B_INSTRUCT_JSON,
            rope_scaling={**LLAMA_3_2_1B_INSTRUCT_JSON["rope_scaling"], "rope_theta": None},
        ),
        "config rope_scaling key 'rope_theta': expected a number, got null",
    ),
    (
        _with(
            LLAMA_3_2_1B_INSTRUCT_JSON,
            rope_scaling=None,
            rope_parameters={"rope_type": "default", "rope_theta": None},
        ),
        "config rope_parameters key 'rope_theta': expected a number, got null",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, tie_word_embeddings=None),
        "key 'tie_word_embeddings': expected true or false, got null",
    ),
    (_with(LLAMA_3_2_1B_INSTRUCT_JSON, rms_norm_eps=None), "key 'rms_norm_eps': expected a number"),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, max_position_embeddings=1),
        "max_position_embeddings: expected 2 (a prompt token and an output token) to 16,777,216",
    ),
    (
        _with(LLAMA_3_2_1B_INSTRUCT_JSON, max_position_embeddings=10**12),
        "to 16,777,216 (the most positions sv makes RoPE tables for), got 1,000,000,000,000",
    ),
    (
        _with(
            LLAMA_3_2_1B_INSTRUCT_JSON,
            rope_scaling={**LLAMA_3_2_1B_INSTRUCT_JSON["rope_scaling"], "high_freq_factor": 0.5},
        ),
        "high_freq_factor (0.5) must exceed low_freq_factor",
    ),
]


@pytest.mark.parametrize(("raw", "fragment"), BAD_CONFIGS)
def test_bad_config_names_the_key(tmp_path: Path, raw: dict[str, Any], fragment: str) -> None:
    path = write_json(tmp_path, raw)
    with pytest.raises(WeightsError) as caught:
        ModelConfig.from_json(path)
    assert str(path) in str(caught.value)
    assert fragment in str(caught.value)


def test_unreadable_config_files(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="cannot read the config"):
        ModelConfig.from_json(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(WeightsError, match="not valid JSON"):
        ModelConfig.from_json(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(WeightsError, match="expected a JSON object"):
        ModelConfig.from_json(tmp_path / "list.json")
    deep = tmp_path / "deep"  # past the JSON parser's recursion limit
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    for read in (ModelConfig.from_model_dir, read_quantization):
        with pytest.raises(
            WeightsError, match=r"config.json: not valid JSON \(nested too deeply\)"
        ):
            read(deep)
    with pytest.raises(WeightsError, match="not a folder"):
        ModelConfig.from_model_dir(tmp_path / "nowhere")


def test_tiny_config_is_structurally_faithful() -> None:
    tiny, real = tiny_llama_config(), llama_3_2_1b_config()
    assert tiny.num_attention_heads > tiny.num_key_value_heads > 1  # GQA
    assert tiny.rope_scaling == real.rope_scaling
    assert (
        tiny.tie_word_embeddings and len(tiny.eos_token_ids) > 1 and tiny.torch_dtype == "bfloat16"
    )
    assert tiny.hidden_size == tiny.num_attention_heads * tiny.head_dim
    assert tiny_llama_config(num_hidden_layers=3).num_hidden_layers == 3
    with pytest.raises(WeightsError, match="not ModelConfig fields"):
        tiny_llama_config(layers=3)
    with pytest.raises(WeightsError, match="num_key_value_heads"):
        tiny_llama_config(num_key_value_heads=3)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(sorted(LLAMA_3_2_1B_INSTRUCT_JSON)), value=json_values)
def test_fuzz_one_key_weights_error_or_valid(key: str, value: Any) -> None:
    raw = dict(LLAMA_3_2_1B_INSTRUCT_JSON, **{key: value})
    try:
        config = ModelConfig.from_dict(raw)
    except WeightsError:
        return
    assert config.hidden_size > 0 and config.num_attention_heads % config.num_key_value_heads == 0


# Qwen/Qwen2.5-0.5B-Instruct/config.json, as published: no head_dim, a sliding_window that
# use_sliding_window switches off.
QWEN2_5_0_5B_INSTRUCT_JSON: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_published_qwen2_5_config_is_the_preset() -> None:
    from sv_weights.presets import qwen2_5_0_5b_config

    config = ModelConfig.from_dict(QWEN2_5_0_5B_INSTRUCT_JSON)
    assert config == qwen2_5_0_5b_config()
    assert config.architecture.qkv_bias and config.sliding_window is None


@pytest.mark.parametrize(
    "name", ["llama-3.1-8b", "llama-3.2-3b", "qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b"]
)
def test_presets_round_trip_and_transformers_reads_them(tmp_path: Path, name: str) -> None:
    """Our config.json of each preset reads back the same, and transformers' own config class
    for the family (AutoConfig by model_type) reads the same sizes and window from it."""
    from sv_weights import preset_config

    config = preset_config(name)
    assert ModelConfig.from_dict(config.to_json_dict()) == config
    config.write_json(tmp_path / "config.json")
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert theirs.model_type == config.model_type
    assert type(theirs).__name__.removesuffix("Config") + "ForCausalLM" == (
        config.architecture.class_name
    )
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim"):
        assert getattr(theirs, key) == getattr(config, key), key
    assert getattr(theirs, "sliding_window", None) == config.sliding_window


def test_qwen_sliding_window_on_some_layers_is_refused() -> None:
    raw = {**QWEN2_5_0_5B_INSTRUCT_JSON, "use_sliding_window": True}
    with pytest.raises(WeightsError, match="sliding window on some layers of a qwen2 model"):
        ModelConfig.from_dict(raw)


def test_sliding_window_only_where_the_family_has_one() -> None:
    with pytest.raises(WeightsError, match="the llama family has none"):
        tiny_llama_config(sliding_window=64)


_CONFIG_CLASSES = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
}


@pytest.mark.parametrize("model_type", sorted(_CONFIG_CLASSES))
def test_each_familys_defaults_are_its_transformers_class(model_type: str) -> None:
    """Keys a config leaves out mean what that family's transformers class says: Qwen3's
    head_dim is 128 whatever the hidden size, Mistral's sliding window 4096, rms_norm_eps
    1e-6 (sv read no window for Mistral, so answers past 4096 tokens differed, and refused
    the other two)."""
    minimal = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 8192,
    }
    ours = ModelConfig.from_dict(minimal)
    theirs = getattr(transformers, _CONFIG_CLASSES[model_type])(**minimal)
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or 64 // 4)
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    # Mistral's window is every layer's; Qwen's only the layers layer_types says slide.
    layer_types = getattr(theirs, "layer_types", None)
    slides = layer_types is None or "sliding_attention" in layer_types
    assert ours.sliding_window == (getattr(theirs, "sliding_window", None) if slides else None)


@pytest.mark.parametrize("model_type", sorted(_CONFIG_CLASSES))
def test_absent_num_key_value_heads_is_the_familys_default(model_type: str) -> None:
    """A config without num_key_value_heads has as many as its transformers class says:
    Mistral's 8 and Qwen's 32 KV heads, Llama's one per query head (sv read one per query
    head for every family, and refused the checkpoints transformers loads from such a
    config, naming the k_proj shape); null is one per query head, as transformers 4 reads it."""
    minimal = {
        "model_type": model_type,
        "hidden_size": 4096,
        "num_hidden_layers": 2,
        "num_attention_heads": 64,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 8192,
    }
    theirs = getattr(transformers, _CONFIG_CLASSES[model_type])(**minimal)
    assert ModelConfig.from_dict(minimal).num_key_value_heads == theirs.num_key_value_heads
    assert ModelConfig.from_dict({**minimal, "num_key_value_heads": None}).num_key_value_heads == 64


@pytest.mark.parametrize(
    "changes",
    [
        {"use_sliding_window": True, "max_window_layers": 24},  # no layer from 24 on
        {"use_sliding_window": True, "sliding_window": None},
        {"attention_bias": True},  # Qwen2's q/k/v have biases whatever this says
    ],
)
def test_qwen2_configs_transformers_reads_as_sv_runs_them_load(changes: dict[str, Any]) -> None:
    raw = {**QWEN2_5_0_5B_INSTRUCT_JSON, **changes}
    theirs = transformers.Qwen2Config(**raw)
    assert set(theirs.layer_types) == {"full_attention"}
    assert ModelConfig.from_dict(raw).sliding_window is None


@pytest.mark.parametrize("model_type", sorted(_CONFIG_CLASSES))
def test_partial_rotary_factor_is_refused_naming_it(tmp_path: Path, model_type: str) -> None:
    """A config with `partial_rotary_factor` 0.5 asks for RoPE on half of each head's
    dimensions: transformers' RoPE functions make tables for that half only (its Llama then
    fails on them), vLLM's Llama rotates that half. sv rotates them all, so it ran such a
    checkpoint silently wrong; it refuses it, naming the key. A factor of 1 is every dimension."""

    def minimal() -> dict[str, Any]:  # fresh each time: transformers edits the dicts it gets
        return {
            "model_type": model_type,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "vocab_size": 100,
            "max_position_embeddings": 16384,
            "rope_scaling": dict(LLAMA_3_2_1B_INSTRUCT_JSON["rope_scaling"]),
        }

    cls = getattr(transformers, _CONFIG_CLASSES[model_type])
    theirs = cls(**minimal(), partial_rotary_factor=0.5)
    init = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"]
    inv_freq, _ = init(theirs, "cpu")
    assert inv_freq.shape == (4,)  # frequencies for 8 of the 16 dimensions: half rotate
    theirs.save_pretrained(tmp_path)  # transformers 5: the factor at the top and in rope_parameters
    with pytest.raises(
        WeightsError, match=re.escape("'partial_rotary_factor': 0.5 is not supported")
    ):
        ModelConfig.from_model_dir(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["partial_rotary_factor"]
    with pytest.raises(
        WeightsError, match=re.escape("'rope_parameters.partial_rotary_factor': 0.5")
    ):
        ModelConfig.from_dict(raw)
    legacy = minimal()
    legacy["rope_scaling"]["partial_rotary_factor"] = 0.25
    with pytest.raises(WeightsError, match=re.escape("'rope_scaling.partial_rotary_factor': 0.25")):
        ModelConfig.from_dict(legacy)
    assert ModelConfig.from_dict({**minimal(), "partial_rotary_factor": 1.0}).head_dim == 16


def test_mistral_layer_types_with_full_attention_layers_are_refused() -> None:
    """A Mistral config whose `layer_types` gives some layers full attention was made for
    alternating layers: transformers' Ministral class (and vLLM's Mistral) honour the list,
    its Mistral class ignores it with a warning. sv gave every layer the window, silently
    unlike the first (teacher-forced logits 49% apart at 2 layers, window 5); it refuses it."""
    raw = {
        "model_type": "mistral",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 8192,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    honoured = transformers.MinistralConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    assert honoured.layer_types == ["sliding_attention", "full_attention"]
    with pytest.raises(WeightsError, match="config key 'layer_types': full attention on some"):
        ModelConfig.from_dict(raw)
    # Every layer sliding is what sv runs; without a window the list changes nothing.
    sliding = ModelConfig.from_dict({**raw, "layer_types": ["sliding_attention"] * 2})
    assert sliding.sliding_window == 5
    assert ModelConfig.from_dict({**raw, "sliding_window": None}).sliding_window is None


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_sliding_layer_types_are_refused_naming_layer_types(model_type: str) -> None:
    """A config whose `layer_types` gives a layer a sliding window is refused naming that key
    (vLLM's Llama and Qwen give the layer the window; sv has none for these families). It
    named 'use_sliding_window', expecting false: a key a Llama config does not have, and one
    this Qwen config already sets false."""
    raw = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 8192,
        "sliding_window": 4,
        "use_sliding_window": False,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    with pytest.raises(WeightsError) as caught:
        ModelConfig.from_dict(raw)
    assert str(caught.value) == (
        f"config key 'layer_types': a sliding window on some layers of a {model_type} model is "
        "not supported (expected only 'full_attention')"
    )
    if model_type != "llama":  # without the list, Qwen's own keys say which layers slide
        del raw["layer_types"]
        raw.update(use_sliding_window=True, max_window_layers=1)
        with pytest.raises(WeightsError, match="config key 'use_sliding_window': a sliding"):
            ModelConfig.from_dict(raw)
