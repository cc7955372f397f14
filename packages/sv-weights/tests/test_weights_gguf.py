"""GGUF -> HF conversion on tiny GGUF files written here with the `gguf` package.

A tiny random HF checkpoint is turned into a GGUF the way llama.cpp's converter does it (Q/K
rows permuted, names mapped, optionally quantized), then converted back by us. Oracles: the
original tensors (exact round trip for float32), and transformers' own GGUF loader (weights,
logits, tokenizer) on the same file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import regex
import tokenizers
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from sv_weights import (
    ModelConfig,
    WeightsError,
    convert_gguf_to_hf,
    load_checkpoint,
    read_header,
    tiny_llama_config,
)
from sv_weights.gguf_import import unpermute_rope_rows
from sv_weights.synthetic import random_weights


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's `DecoderModel.permute` (the forward direction)."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def test_unpermute_by_hand() -> None:
    # One head of head_dim 6: llama.cpp stores HF rows in the order 0, 3, 1, 4, 2, 5.
    stored = torch.tensor([[0.0], [3.0], [1.0], [4.0], [2.0], [5.0]])
    assert unpermute_rope_rows(stored, num_heads=1).flatten().tolist() == [0, 1, 2, 3, 4, 5]
    # Two heads of head_dim 4: each head on its own, HF rows 0, 2, 1, 3 (+4).
    stored = torch.tensor([0.0, 2, 1, 3, 4, 6, 5, 7]).reshape(8, 1)
    assert unpermute_rope_rows(stored, num_heads=2).flatten().tolist() == list(range(8))
    with pytest.raises(WeightsError, match="cannot unpermute 6 rows into 2 heads"):
        unpermute_rope_rows(torch.zeros(6, 1), num_heads=2)


@settings(max_examples=50, deadline=None)
@given(heads=st.integers(1, 6), half=st.integers(1, 8), cols=st.integers(1, 5))
def test_unpermute_inverts_llama_cpp_permute(heads: int, half: int, cols: int) -> None:
    hf = np.arange(heads * half * 2 * cols, dtype=np.float32).reshape(heads * half * 2, cols)
    restored = unpermute_rope_rows(torch.from_numpy(llama_cpp_permute(hf, heads).copy()), heads)
    assert np.array_equal(restored.numpy(), hf)


# ------------------------------------------------------------------------------------------
# A tiny GGUF
# ------------------------------------------------------------------------------------------


def gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "1 2", "12 3", "Ġ 1", "o n", "Ġ s"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def tiny_vocab() -> list[str]:
    tokens = SPECIALS + gpt2_byte_chars()
    tokens += ["".join(merge.split(" ")) for merge in MERGES]
    return tokens


def tiny_gguf_config(**overrides: Any) -> ModelConfig:
    fields: dict[str, Any] = {
        "vocab_size": len(tiny_vocab()),
        "bos_token_id": 1,
        "eos_token_ids": (2,),
        "rope_scaling": None,
        "max_position_embeddings": 512,
        "torch_dtype": "float32",
    }
    fields.update(overrides)
    return tiny_llama_config(**fields)


def write_tiny_gguf(
    path: Path,
    config: ModelConfig,
    *,
    quant: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    pre: str = "smollm",
    arch: str = "llama",
    seed: int = 0,
    kv: dict[str, tuple[Any, gguf.GGUFValueType]] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    rows_cut: dict[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """Write a GGUF of random weights; return the HF float32 weights it encodes (pre-quantization).
    `kv` replaces metadata values (key -> value and GGUF type); `extra_tensors` are written
    after the model's; `rows_cut` (GGUF name -> n) writes those tensors without their last n
    rows."""
    hf = random_weights(config, seed=seed, dtype=torch.float32)
    writer = gguf.GGUFWriter(str(path), arch)
    tokens = tiny_vocab()
    u32, f32, string, array = (
        gguf.GGUFValueType.UINT32,
        gguf.GGUFValueType.FLOAT32,
        gguf.GGUFValueType.STRING,
        gguf.GGUFValueType.ARRAY,
    )
    metadata: dict[str, tuple[Any, gguf.GGUFValueType]] = {
        f"{arch}.block_count": (config.num_hidden_layers, u32),
        f"{arch}.context_length": (config.max_position_embeddings, u32),
        f"{arch}.embedding_length": (config.hidden_size, u32),
        f"{arch}.feed_forward_length": (config.intermediate_size, u32),
        f"{arch}.attention.head_count": (config.num_attention_heads, u32),
        f"{arch}.attention.head_count_kv": (config.num_key_value_heads, u32),
        f"{arch}.rope.freq_base": (config.rope_theta, f32),
        f"{arch}.attention.layer_norm_rms_epsilon": (config.rms_norm_eps, f32),
        f"{arch}.rope.dimension_count": (config.head_dim, u32),
        f"{arch}.vocab_size": (config.vocab_size, u32),
        "tokenizer.ggml.model": ("gpt2", string),
        "tokenizer.ggml.pre": (pre, string),
        "tokenizer.ggml.tokens": (tokens, array),
        "tokenizer.ggml.token_type": (
            [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)),
            array,
        ),
        "tokenizer.ggml.merges": (MERGES, array),
        "tokenizer.ggml.bos_token_id": (1, u32),
        "tokenizer.ggml.eos_token_id": (2, u32),
        "tokenizer.ggml.unknown_token_id": (0, u32),
        "tokenizer.ggml.padding_token_id": (2, u32),
        "tokenizer.ggml.add_bos_token": (False, gguf.GGUFValueType.BOOL),
        "tokenizer.chat_template": (TEMPLATE, string),
    }
    metadata.update(kv or {})
    for key, (value, vtype) in metadata.items():
        writer.add_key_value(key, value, vtype)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer_parts = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, tensor in hf.items():
        array = tensor.numpy()
        if name.startswith("model.layers."):
            _, _, layer, *rest = name.split(".")
            part = ".".join(rest[:-1])
            gguf_name = f"blk.{layer}.{layer_parts[part]}.weight"
        else:
            gguf_name = names[name]
        if name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, config.num_key_value_heads)
        cut = (rows_cut or {}).get(gguf_name, 0)
        array = array[: len(array) - cut]
        if array.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
    for gguf_name, extra in (extra_tensors or {}).items():
        writer.add_tensor(gguf_name, extra)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


@pytest.mark.parametrize("tie", [True, False])
def test_float32_gguf_round_trips_exactly(tmp_path: Path, tie: bool) -> None:
    config = tiny_gguf_config(tie_word_embeddings=tie)
    original = write_tiny_gguf(tmp_path / "tiny.gguf", config)
    messages: list[str] = []
    out = convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "hf", progress=messages.append)
    assert out == tmp_path / "hf" and messages
    assert ModelConfig.from_model_dir(out) == config
    converted = load_checkpoint(out)
    assert sorted(converted) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "tiny.gguf"]  # no staging left


def test_a_gguf_file_name_that_is_not_utf_8_converts(tmp_path: Path) -> None:
    """A GGUF named in Latin-1 (byte 0xE9): its name, recorded in the safetensors metadata,
    was a str with a lone surrogate, and the conversion failed after dequantizing every
    tensor, with a UnicodeEncodeError (a WeightsError since the writer checks names)."""
    gguf_path = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.gguf"))
    write_tiny_gguf(gguf_path, tiny_gguf_config())
    out = convert_gguf_to_hf(gguf_path, tmp_path / "hf", progress=lambda _: None)
    assert read_header(out / "model.safetensors").metadata["source"] == "caf\\xe9.gguf"
    assert sorted(load_checkpoint(out)) == sorted(load_checkpoint(out, copy=True))


@pytest.mark.parametrize("quant", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1])
def test_quantized_gguf_matches_transformers_gguf_loader(
    tmp_path: Path, quant: gguf.GGMLQuantizationType
) -> None:
    config = tiny_gguf_config()
    original = write_tiny_gguf(tmp_path / "tiny.gguf", config, quant=quant)
    out = convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "hf", progress=lambda _: None)
    ours = load_checkpoint(out)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="tiny.gguf", dtype=torch.float32
    )
    theirs = reference.state_dict()
    theirs.pop("lm_head.weight")  # tied
    assert sorted(ours) == sorted(theirs)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)
    # Quantization changed the values (so this is not a float32 test in disguise) but not much.
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(ours[q], original[q])
    torch.testing.assert_close(ours[q], original[q], rtol=0, atol=0.01)

    converted_model = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokens = torch.tensor([[1, 40, 200, 7, 100], [5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(
            converted_model(tokens).logits, reference(tokens).logits, rtol=0, atol=1e-5
        )


CORPUS = [
    "the theater is on the other side",
    "  two leading spaces, and\ttabs\n\nnew lines   ",
    "numbers 123 and 12 and 1 2 3, 4567",
    "naïve café, Ελληνικά, 日本語, emoji 🤖",
    "<|im_start|>user\nin the<|im_end|>",
    "",
]


@pytest.mark.parametrize("pre", ["gpt-2", "smollm"])
def test_tokenizer_matches_transformers_gguf_tokenizer(tmp_path: Path, pre: str) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", tiny_gguf_config(), pre=pre)
    out = convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "hf", progress=lambda _: None)
    ours = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    via_transformers = transformers.AutoTokenizer.from_pretrained(out)
    for text in CORPUS:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert via_transformers.encode(text, add_special_tokens=False) == ids
        assert ours.decode(ids, skip_special_tokens=False) == text
        if pre == "gpt-2":
            assert ids == reference.encode(text, add_special_tokens=False), text
        else:
            # transformers' GGUF loader ignores tokenizer.ggml.pre; llama.cpp's "smollm" first
            # isolates every digit. Oracle: transformers' BPE applied to each digit-split piece.
            assert ids == digit_split_reference(reference, text), text
    digits = ours.encode("x 123", add_special_tokens=False).tokens
    assert digits == (["x", "Ġ", "1", "2", "3"] if pre == "smollm" else ["x", "Ġ", "123"])
    config = json.loads((out / "tokenizer_config.json").read_text())
    named = (config["bos_token"], config["eos_token"], config["unk_token"], config["pad_token"])
    assert named == ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_end|>")
    assert config["chat_template"] == TEMPLATE
    special = [
        t for t in json.loads((out / "tokenizer.json").read_text())["added_tokens"] if t["special"]
    ]
    assert [t["content"] for t in special] == SPECIALS


def digit_split_reference(reference: Any, text: str) -> list[int]:
    """Encode `text` split before and after every digit (\\p{N}), special tokens kept whole."""

    ids: list[int] = []
    for piece in regex.split(r"(<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|\p{N})", text):
        if piece:
            ids += reference.encode(piece, add_special_tokens=False)
    return ids


# ------------------------------------------------------------------------------------------
# Refusals and atomicity
# ------------------------------------------------------------------------------------------


def test_bad_gguf_inputs(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="GGUF file not found"):
        convert_gguf_to_hf(tmp_path / "absent.gguf", tmp_path / "out")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(WeightsError, match=r"junk\.gguf: not a readable GGUF file"):
        convert_gguf_to_hf(tmp_path / "junk.gguf", tmp_path / "out")
    write_tiny_gguf(tmp_path / "mamba.gguf", tiny_gguf_config(), arch="mamba")
    with pytest.raises(WeightsError, match="architecture 'mamba' is not supported"):
        convert_gguf_to_hf(tmp_path / "mamba.gguf", tmp_path / "out")
    write_tiny_gguf(tmp_path / "pre.gguf", tiny_gguf_config(), pre="qwen2")
    with pytest.raises(WeightsError, match=r"tokenizer\.ggml\.pre 'qwen2' is not supported"):
        convert_gguf_to_hf(tmp_path / "pre.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    write_tiny_gguf(tmp_path / "ok.gguf", tiny_gguf_config())
    with pytest.raises(WeightsError, match="already exists and is not an empty folder"):
        convert_gguf_to_hf(tmp_path / "ok.gguf", tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep me"


U32, STRING, ARRAY = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        # Tensors that do not fit the metadata: each used to convert, dropping or overwriting
        # a layer without a word.
        ({"kv": {"llama.block_count": (1, U32)}}, "tensor 'blk.1.attn_norm.weight' is not in the 1 layers"),
        ({"kv": {"llama.block_count": (10**6, U32)}}, "llama.block_count is 1,000,000, more than the"),
        ({"extra_tensors": {"blk.7.attn_norm.weight": np.ones(64, np.float32)}}, "'blk.7.attn_norm.weight' is not in the 2 layers"),
        (
            {"extra_tensors": {"blk.01.attn_norm.weight": np.ones(64, np.float32)}},
            "tensors 'blk.1.attn_norm.weight' and 'blk.01.attn_norm.weight' are both 'model.layers.1.input_layernorm.weight'",
        ),
        ({"kv": {"llama.attention.head_count": (0, U32)}}, "llama.attention.head_count is 0, expected at least 1"),
        ({"kv": {"llama.attention.head_count_kv": (0, U32)}}, "num_key_value_heads: expected a positive integer, got 0"),
        # Metadata of the wrong type: a raw TypeError, or a folder that then failed to load
        ({"kv": {"tokenizer.ggml.pre": (["smollm"], ARRAY)}}, "tokenizer.ggml.pre ['smollm'] is not supported"),
        ({"kv": {"tokenizer.chat_template": (5, U32)}}, "'tokenizer.chat_template' should be str, got 5"),
        ({"kv": {"tokenizer.ggml.add_bos_token": ("yes", STRING)}}, "'tokenizer.ggml.add_bos_token' should be bool"),
        ({"kv": {"tokenizer.ggml.merges": (["zz qq"], ARRAY)}}, "merge 'zz qq' names 'zz', which is not a token"),
    ],
)  # fmt: skip
def test_gguf_that_does_not_fit_its_metadata_is_refused(
    tmp_path: Path, edits: dict[str, Any], message: str
) -> None:
    write_tiny_gguf(tmp_path / "bad.gguf", tiny_gguf_config(), **edits)
    with pytest.raises(WeightsError) as caught:
        convert_gguf_to_hf(tmp_path / "bad.gguf", tmp_path / "out", progress=lambda _: None)
    assert message in str(caught.value)
    assert str(caught.value).count(str(tmp_path / "bad.gguf")) == 1  # named once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_a_q_proj_that_does_not_split_into_heads_is_named(tmp_path: Path) -> None:
    q = "blk.1.attn_q.weight"
    write_tiny_gguf(tmp_path / "bad.gguf", tiny_gguf_config(), rows_cut={q: 2})
    with pytest.raises(
        WeightsError, match=re.escape(f"tensor {q!r}: cannot unpermute 62 rows into 4 heads")
    ):
        convert_gguf_to_hf(tmp_path / "bad.gguf", tmp_path / "out", progress=lambda _: None)


def test_interrupted_conversion_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_gguf(tmp_path / "ok.gguf", tiny_gguf_config())

    def fail(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("sv_weights.gguf_import.save_file", fail)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf_to_hf(tmp_path / "ok.gguf", tmp_path / "out", progress=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.gguf"]
