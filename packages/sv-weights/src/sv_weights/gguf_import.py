"""Convert a llama.cpp GGUF file of a Llama model into an HF-layout folder.

Output: config.json, model.safetensors (float32), tokenizer.json (HF `tokenizers` format),
tokenizer_config.json. What conversion has to undo:

- Quantisation: each tensor is dequantised with the `gguf` package (`gguf.quants.dequantize`).
- Axis order: GGUF lists dimensions fastest-first ([in, out]); the numpy array the reader gives
  is already row-major [out, in], the HF layout of a linear weight.
- The Q/K row permutation: HF Llama rotates the pair (i, i + head_dim/2) of each head; llama.cpp
  rotates adjacent pairs (2i, 2i+1). Its converter therefore reorders the rows of q_proj and
  k_proj within each head, from [first halves..., second halves...] to interleaved
  [x0, y0, x1, y1, ...]. `unpermute_rope_rows` puts them back.
- Names: `blk.N.attn_q.weight` -> `model.layers.N.self_attn.q_proj.weight`, and so on.

Weights are written as float32, not bf16: the dequantised values are float32 numbers (a float16
scale times a small integer plus a float16 offset), and bf16 would round them. In float32 the
converted model is exactly the GGUF model, so CPU tests can compare against transformers' own
GGUF loader with tight tolerances. (135M parameters: 540 MB on disk.)

Only what the embedded default model and its relatives need is supported: architecture
"llama", the "gpt2" (byte-level BPE) tokenizer with the GPT-2 or SmolLM/StarCoder
pre-tokenizer, no RoPE scaling. Anything else is refused with a `WeightsError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from sv_weights.checkpoint import SINGLE_FILE, check_layer_count, expected_tensors
from sv_weights.config import CONFIG_FILE, ModelConfig
from sv_weights.errors import WeightsError
from sv_weights.safetensors import save_file

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_tensor_name(gguf_name: str) -> str | None:
    """The HF name of a llama.cpp tensor name, or None when it has no HF counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{int(match.group(1))}.{_LAYER_NAMES[match.group(2)]}.weight"
    return None


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of q_proj/k_proj rows (module doc).

    Within each head of `head_dim` rows, llama.cpp stores HF row order
    [0, h, 1, h+1, ..., h-1, 2h-1] (h = head_dim/2): row pairs of the same rotation side by side.
    Viewing the rows as [heads, h, 2] and swapping the last two axes restores [heads, 2, h].
    `num_heads` is the number of query heads for q_proj, of key/value heads for k_proj.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads) != 0:
        raise WeightsError(f"cannot unpermute {rows} rows into {num_heads} heads of even size")
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
    )


def convert_gguf_to_hf(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    progress: Callable[[str], object] = print,
) -> Path:
    """Convert the GGUF file `gguf_path` into the new folder `out_dir` (see the module doc).

    The folder is built under a temporary name next to `out_dir` and renamed into place at the
    end, so an interrupted conversion never leaves a half-written folder. `out_dir` must not
    exist yet (an empty folder is fine). Returns `out_dir`.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise WeightsError(
            f"{out_dir}: already exists and is not an empty folder; not overwriting it"
        )
    reader = _open_gguf(gguf_path)
    source = GgufFields(reader, gguf_path)
    config = _config_from_gguf(source)
    progress(f"sv: dequantizing {len(reader.tensors)} tensors of {gguf_path.name}")
    weights = _hf_weights_from_gguf(reader, source, config)
    tokenizer, tokenizer_config = _tokenizer_files_from_gguf(source, config)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        config.write_json(staging / CONFIG_FILE)
        _write_json(staging / TOKENIZER_FILE, tokenizer, indent=None)
        _write_json(staging / TOKENIZER_CONFIG_FILE, tokenizer_config, indent=2)
        progress(f"sv: writing {out_dir / SINGLE_FILE}")
        # The file name as text UTF-8 can hold: bytes that are not UTF-8 (a name from a
        # Latin-1 system) as \xNN escapes, where its str holds lone surrogates.
        source_name = os.fsencode(gguf_path.name).decode("utf-8", "backslashreplace")
        save_file(weights, staging / SINGLE_FILE, metadata={"format": "pt", "source": source_name})
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it owner-only
        os.replace(staging, out_dir)  # atomic; replaces an empty out_dir
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_json(path: Path, value: Any, indent: int | None) -> None:
    path.write_text(json.dumps(value, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def _open_gguf(path: Path) -> gguf.GGUFReader:
    if not path.is_file():
        raise WeightsError(f"{path}: GGUF file not found")
    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # the gguf package raises assorted types for a bad file
        raise WeightsError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})"
        ) from exc


class GgufFields:
    """Typed access to a GGUF file's key-value metadata, with errors naming the file and key."""

    def __init__(self, reader: gguf.GGUFReader, path: Path) -> None:
        self.reader = reader
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.get_field(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            raise WeightsError(
                f"{self.path}: metadata key {key!r} cannot be decoded ({exc})"
            ) from exc

    def require(self, key: str, kind: type) -> Any:
        value = self.get(key)
        if value is None:
            raise WeightsError(f"{self.path}: metadata key {key!r} is missing")
        if kind is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
            raise WeightsError(
                f"{self.path}: metadata key {key!r} should be {kind.__name__}, got {value!r}"
            )
        return value

    def float32(self, key: str, default: float | None = None) -> float:
        """A float32 field as the shortest decimal that is that float32 (1e-05, not
        9.999999747e-06): GGUF stores float32, and the HF config it came from said 1e-05."""
        if self.get(key) is None and default is not None:
            return default
        return float(str(np.float32(self.require(key, float))))

    def optional_int(self, key: str) -> int | None:
        value = self.get(key)
        return None if value is None else self.require(key, int)

    def optional_bool(self, key: str) -> bool:
        """A boolean field, False where absent."""
        return self.get(key) is not None and self.require(key, bool)

    def int_list(self, key: str, default: list[int]) -> list[int]:
        """A list of integers, `default` where the key is absent."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise WeightsError(f"{self.path}: metadata key {key!r} should be a list of integers")
        return value

    def string_list(self, key: str) -> list[str]:
        value = self.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise WeightsError(f"{self.path}: metadata key {key!r} should be a list of strings")
        return value


def _or_default(value: int | None, default: int) -> int:
    """An optional metadata value, or `default` where the key is absent (a 0 stays 0, for the
    config's check to name)."""
    return default if value is None else value


def _config_from_gguf(source: GgufFields) -> ModelConfig:
    path = source.path
    arch = source.require("general.architecture", str)
    if arch != "llama":
        raise WeightsError(f"{path}: architecture {arch!r} is not supported (expected 'llama')")
    scaling = source.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise WeightsError(f"{path}: RoPE scaling {scaling!r} is not supported by this converter")
    names = {t.name for t in source.reader.tensors}
    if "rope_freqs.weight" in names:
        raise WeightsError(
            f"{path}: has rope_freqs.weight (llama3 RoPE scaling), which this converter does not support"
        )
    hidden = source.require("llama.embedding_length", int)
    heads = source.require("llama.attention.head_count", int)
    if heads < 1:
        raise WeightsError(f"{path}: llama.attention.head_count is {heads}, expected at least 1")
    kv_heads = _or_default(source.optional_int("llama.attention.head_count_kv"), heads)
    head_dim = _or_default(source.optional_int("llama.attention.key_length"), hidden // heads)
    rotary_dim = _or_default(source.optional_int("llama.rope.dimension_count"), head_dim)
    if rotary_dim != head_dim:
        raise WeightsError(
            f"{path}: partial RoPE ({rotary_dim} of {head_dim} dims) is not supported"
        )
    tokens = source.get("tokenizer.ggml.tokens")
    vocab_size = source.optional_int("llama.vocab_size") or (
        len(tokens) if isinstance(tokens, list) else 0
    )
    bos = source.optional_int("tokenizer.ggml.bos_token_id")
    eos = source.optional_int("tokenizer.ggml.eos_token_id")
    eot = source.optional_int("tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(i for i in (eos, eot) if i is not None))
    # (read before the try: their errors name the file already)
    layers = source.require("llama.block_count", int)
    intermediate = source.require("llama.feed_forward_length", int)
    eps = source.float32("llama.attention.layer_norm_rms_epsilon")
    theta = source.float32("llama.rope.freq_base", default=10000.0)
    context = source.require("llama.context_length", int)
    try:
        return ModelConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=vocab_size,
            rms_norm_eps=eps,
            rope_theta=theta,
            rope_scaling=None,
            max_position_embeddings=context,
            tie_word_embeddings="output.weight" not in names,
            bos_token_id=bos,
            eos_token_ids=eos_ids,
            torch_dtype="float32",
        )
    except WeightsError as exc:
        raise WeightsError(f"{path}: {exc}") from None


def _hf_weights_from_gguf(
    reader: gguf.GGUFReader, source: GgufFields, config: ModelConfig
) -> dict[str, torch.Tensor]:
    path = source.path
    check_layer_count(config, len(reader.tensors), str(path), "llama.block_count")
    expected = expected_tensors(config)
    weights: dict[str, torch.Tensor] = {}
    gguf_names: dict[str, str] = {}  # HF name -> the GGUF tensor that gave it
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        if name is None:
            raise WeightsError(
                f"{path}: tensor {tensor.name!r} has no counterpart in an HF Llama checkpoint"
            )
        if name not in expected:  # a layer past llama.block_count
            raise WeightsError(
                f"{path}: tensor {tensor.name!r} is not in the {config.num_hidden_layers} layers "
                "of llama.block_count"
            )
        if name in gguf_names:  # blk.1 and blk.01
            raise WeightsError(
                f"{path}: tensors {gguf_names[name]!r} and {tensor.name!r} are both {name!r}"
            )
        gguf_names[name] = tensor.name
        shape = tuple(
            int(d) for d in reversed(tensor.shape.tolist())
        )  # GGUF lists fastest dim first
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise WeightsError(
                f"{path}: tensor {tensor.name!r} is {tensor.tensor_type.name}, which gguf cannot dequantize"
            ) from exc
        array = np.array(values, dtype=np.float32, copy=True).reshape(shape)
        weight = torch.from_numpy(array)
        try:
            if name.endswith("q_proj.weight"):
                weight = unpermute_rope_rows(weight, config.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                weight = unpermute_rope_rows(weight, config.num_key_value_heads)
        except WeightsError as exc:
            raise WeightsError(f"{path}: tensor {tensor.name!r}: {exc}") from None
        weights[name] = weight.contiguous()
    for name, shape in expected.items():
        if name not in weights:
            raise WeightsError(f"{path}: no tensor for {name!r} (expected shape {list(shape)})")
        if tuple(weights[name].shape) != shape:
            raise WeightsError(
                f"{path}: tensor for {name!r} has shape {list(weights[name].shape)}, expected {list(shape)}"
            )
    return {name: weights[name] for name in expected}  # HF order


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

# `tokenizer.ggml.pre` names llama.cpp's pre-tokenizer. The SmolLM/StarCoder family first
# isolates every digit ("\p{N}"), then applies the GPT-2 split regex: that is exactly the
# HF pipeline Digits(individual_digits) -> ByteLevel(use_regex) of SmolLM2's own tokenizer.json.
_BYTE_LEVEL = {
    "type": "ByteLevel",
    "add_prefix_space": False,
    "trim_offsets": True,
    "use_regex": True,
}
_PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
    },
    "starcoder": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
    },
    "gpt-2": _BYTE_LEVEL,
    "default": _BYTE_LEVEL,
}

_CONTROL = int(gguf.TokenType.CONTROL)
_USER_DEFINED = int(gguf.TokenType.USER_DEFINED)


def _tokenizer_files_from_gguf(
    source: GgufFields, config: ModelConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer.json, tokenizer_config.json) contents for a byte-level BPE GGUF tokenizer."""
    path = source.path
    model = source.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise WeightsError(
            f"{path}: tokenizer.ggml.model {model!r} is not supported (expected 'gpt2', byte-level BPE)"
        )
    pre = source.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in _PRE_TOKENIZERS:
        raise WeightsError(
            f"{path}: tokenizer.ggml.pre {pre!r} is not supported (expected one of {sorted(_PRE_TOKENIZERS)})"
        )
    tokens = source.string_list("tokenizer.ggml.tokens")
    merges = source.string_list("tokenizer.ggml.merges")
    token_types = source.int_list("tokenizer.ggml.token_type", default=[1] * len(tokens))
    if len(tokens) != config.vocab_size or len(token_types) != len(tokens):
        raise WeightsError(
            f"{path}: {len(tokens)} tokens and {len(token_types)} token types for a vocabulary of "
            f"{config.vocab_size}"
        )
    for merge in merges:
        if merge.count(" ") != 1:
            raise WeightsError(f"{path}: merge {merge!r} is not two tokens separated by one space")
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        if token in vocab:
            raise WeightsError(
                f"{path}: token {token!r} appears twice (ids {vocab[token]} and {token_id})"
            )
        vocab[token] = token_id

    for merge in merges:  # (each side a token: a tokenizer.json that loads)
        for side in merge.split(" "):
            if side not in vocab:
                raise WeightsError(f"{path}: merge {merge!r} names {side!r}, which is not a token")

    def token_at(key: str) -> str | None:
        token_id = source.optional_int(key)
        if token_id is None:
            return None
        if not 0 <= token_id < len(tokens):
            raise WeightsError(f"{path}: {key} = {token_id} is outside the vocabulary")
        return tokens[token_id]

    added_tokens = [
        {
            "id": token_id,
            "content": tokens[token_id],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": token_type == _CONTROL,
        }
        for token_id, token_type in enumerate(token_types)
        if token_type in (_CONTROL, _USER_DEFINED)
    ]
    unk = token_at("tokenizer.ggml.unknown_token_id")
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": _PRE_TOKENIZERS[pre],
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": False,
            "use_regex": True,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,  # "left right" strings, as in the Llama 3 tokenizer.json
        },
    }
    tokenizer_config: dict[str, Any] = {
        "add_bos_token": source.optional_bool("tokenizer.ggml.add_bos_token"),
        "add_eos_token": source.optional_bool("tokenizer.ggml.add_eos_token"),
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(entry["id"]): {k: v for k, v in entry.items() if k != "id"}
            for entry in added_tokens
        },
        "bos_token": token_at("tokenizer.ggml.bos_token_id"),
        "eos_token": token_at("tokenizer.ggml.eos_token_id"),
        "pad_token": token_at("tokenizer.ggml.padding_token_id"),
        "unk_token": unk,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_position_embeddings,
        # Not GPT2Tokenizer: transformers 5 would replace our pre-tokenizer with its own.
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template = source.get("tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = source.require("tokenizer.chat_template", str)
    return tokenizer, tokenizer_config
