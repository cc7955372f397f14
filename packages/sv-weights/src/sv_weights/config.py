"""A model's `config.json`: parse it into a typed, validated `ModelConfig`, and write it back.

Which family it is (Llama, Mistral, Qwen2, Qwen3) comes from `model_type` through the registry
in `sv_weights.architectures`; what the families share is read here the same way for all.

Two spellings of the RoPE settings exist in the wild and both are read:
  - transformers 4.x (every checkpoint on the Hub, e.g. Llama 3.2): top-level `rope_theta`, and
    `rope_scaling` = null or {"rope_type" (or legacy "type"): "llama3", "factor", ...};
  - transformers 5.x `save_pretrained`: `rope_parameters` = {"rope_type", "rope_theta", ...}.
We write the 4.x spelling, which both versions of transformers read.

Only what the engine implements is accepted: a config that asks for something else (an
unknown family, biases its family does not have, another activation, another RoPE scaling,
RoPE on part of each head, a sliding window on only some layers) fails here, loudly, instead
of producing wrong text later.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sv_weights.architectures import ARCHITECTURES, Architecture, architecture_of
from sv_weights.errors import WeightsError
from sv_weights.json_files import read_json_file

CONFIG_FILE = "config.json"

# The dtype names a config may give in `torch_dtype` (or `dtype`, transformers 5).
TORCH_DTYPE_NAMES = frozenset({"float32", "float16", "bfloat16", "float64"})
# The longest context a config may declare: 2**24 positions, past every published Llama,
# Mistral and Qwen context (Llama 4 Scout's is 10M). The runner builds its RoPE tables for
# the whole context at load, so an absurd value would be an allocation failure deep inside.
MAX_POSITIONS = 1 << 24

# Defaults where a key is absent, as transformers' ModelConfig has them (so a config that
# transformers accepts means the same thing here). The architectural sizes have no default.
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_RMS_NORM_EPS = 1e-6  # (every family's here)
_DEFAULT_TORCH_DTYPE = "float32"


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE scaling (`rope_type: "llama3"`), the only kind supported."""

    rope_type: str
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        where = "rope_scaling"
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            object.__setattr__(self, name, _int_as_float(getattr(self, name)))
        if self.rope_type != "llama3":
            raise WeightsError(
                f"{where}.rope_type: {self.rope_type!r} is not supported (expected 'llama3')"
            )
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if not (isinstance(value, float) and math.isfinite(value) and value > 0):
                raise WeightsError(f"{where}.{name}: expected a positive number, got {value!r}")
        if self.high_freq_factor <= self.low_freq_factor:
            raise WeightsError(
                f"{where}: high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor "
                f"({self.low_freq_factor})"
            )
        if (
            not _is_int(self.original_max_position_embeddings)
            or self.original_max_position_embeddings <= 0
        ):
            raise WeightsError(
                f"{where}.original_max_position_embeddings: expected a positive integer"
            )


@dataclass(frozen=True)
class ModelConfig:
    """The hyper-parameters of a decoder of one of the supported families, as in HF
    `config.json`. `sliding_window` (Mistral's): keys within that many positions of the query,
    itself included, or None for full attention."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...] = field(default=())
    torch_dtype: str = _DEFAULT_TORCH_DTYPE
    model_type: str = "llama"
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        # Accept the obvious conveniences of direct construction (ints for floats, a list of
        # eos ids); everything else must already have the right type.
        for name in ("rms_norm_eps", "rope_theta"):
            object.__setattr__(self, name, _int_as_float(getattr(self, name)))
        if isinstance(self.eos_token_ids, list):
            object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise WeightsError(f"config {name}: expected a positive integer, got {value!r}")
        if not 2 <= self.max_position_embeddings <= MAX_POSITIONS:
            raise WeightsError(
                f"config max_position_embeddings: expected 2 (a prompt token and an output "
                f"token) to {MAX_POSITIONS:,} (the most positions sv makes RoPE tables for), "
                f"got {self.max_position_embeddings:,}"
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise WeightsError(
                f"config num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention"
            )
        if self.head_dim % 2 != 0:
            raise WeightsError(f"config head_dim: RoPE needs an even head_dim, got {self.head_dim}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not (isinstance(value, float) and math.isfinite(value) and value > 0):
                raise WeightsError(f"config {name}: expected a positive float, got {value!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise WeightsError("config tie_word_embeddings: expected true or false")
        token_ids = ([self.bos_token_id] if self.bos_token_id is not None else []) + list(
            self.eos_token_ids
        )
        for token_id in token_ids:
            if not _is_int(token_id) or not 0 <= token_id < self.vocab_size:
                raise WeightsError(
                    f"config bos/eos token id {token_id!r}: expected an integer in [0, {self.vocab_size})"
                )
        if self.torch_dtype not in TORCH_DTYPE_NAMES:
            raise WeightsError(
                f"config torch_dtype: {self.torch_dtype!r} is not one of {sorted(TORCH_DTYPE_NAMES)}"
            )
        architecture = architecture_of(self.model_type, None)
        if self.sliding_window is not None:
            if not architecture.sliding_window:
                raise WeightsError(
                    f"config sliding_window: the {self.model_type} family has none here"
                )
            if not _is_int(self.sliding_window) or self.sliding_window <= 0:
                raise WeightsError(
                    f"config sliding_window: expected a positive integer or null, "
                    f"got {self.sliding_window!r}"
                )

    @property
    def architecture(self) -> Architecture:
        """This config's family: how its forward differs from the shared one."""
        return ARCHITECTURES[self.model_type]

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> ModelConfig:
        """Read a `config.json`. A missing or ill-typed key raises `WeightsError` naming it."""
        path = Path(path)
        raw = read_json_file(path, "config")
        if not isinstance(raw, dict):
            raise WeightsError(f"{path}: expected a JSON object")
        try:
            return cls.from_dict(raw)
        except WeightsError as exc:
            raise WeightsError(f"{path}: {exc}") from None

    @classmethod
    def from_model_dir(cls, model_dir: str | os.PathLike[str]) -> ModelConfig:
        """Read `<model_dir>/config.json`."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise WeightsError(
                f"{model_dir}: not a folder (expected a model folder with {CONFIG_FILE})"
            )
        return cls.from_json(model_dir / CONFIG_FILE)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed `config.json` object (see module doc for the accepted spellings)."""
        architecture = _check_supported_architecture(raw)
        hidden_size = _get(raw, "hidden_size", int)
        num_attention_heads = _get(raw, "num_attention_heads", int)
        if "head_dim" in raw and raw["head_dim"] is not None:
            head_dim = _get(raw, "head_dim", int)
        elif "head_dim" not in raw and architecture.default_head_dim is not None:
            head_dim = architecture.default_head_dim
        else:
            if not _is_int(num_attention_heads) or num_attention_heads <= 0:
                raise WeightsError(
                    f"config num_attention_heads: expected a positive integer, got {num_attention_heads!r}"
                )
            if hidden_size % num_attention_heads != 0:
                raise WeightsError(
                    f"config head_dim: absent, and hidden_size ({hidden_size}) is not a multiple of "
                    f"num_attention_heads ({num_attention_heads})"
                )
            head_dim = hidden_size // num_attention_heads
        rope_theta, rope_scaling = _parse_rope(raw)
        # Absent: the family's default (Mistral's 8, Qwen's 32: a checkpoint transformers made
        # from such a config has that many). Null: as many as the query heads (no GQA), as
        # transformers reads it for every family.
        kv_heads = num_attention_heads
        if "num_key_value_heads" not in raw and architecture.default_num_key_value_heads:
            kv_heads = architecture.default_num_key_value_heads
        return cls(
            hidden_size=hidden_size,
            num_hidden_layers=_get(raw, "num_hidden_layers", int),
            num_attention_heads=num_attention_heads,
            num_key_value_heads=_get(
                raw, "num_key_value_heads", int, default=kv_heads, null_is_default=True
            ),
            head_dim=head_dim,
            intermediate_size=_get(raw, "intermediate_size", int),
            vocab_size=_get(raw, "vocab_size", int),
            rms_norm_eps=_get(raw, "rms_norm_eps", float, default=_DEFAULT_RMS_NORM_EPS),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_get(raw, "max_position_embeddings", int),
            tie_word_embeddings=_get(raw, "tie_word_embeddings", bool, default=False),
            bos_token_id=_get_optional_int(raw, "bos_token_id"),
            eos_token_ids=_get_eos(raw),
            torch_dtype=_get_torch_dtype(raw),
            model_type=architecture.model_type,
            sliding_window=(
                _get_optional_int(raw, "sliding_window", architecture.default_sliding_window)
                if architecture.sliding_window
                else None
            ),
        )

    def to_json_dict(self) -> dict[str, Any]:
        """The `config.json` object, in the layout of the HF files of its family (transformers
        4.x spelling)."""
        eos: int | list[int] | None
        if not self.eos_token_ids:
            eos = None
        elif len(self.eos_token_ids) == 1:
            eos = self.eos_token_ids[0]
        else:
            eos = list(self.eos_token_ids)
        architecture = self.architecture
        written: dict[str, Any] = {
            "architectures": [architecture.class_name],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "model_type": architecture.model_type,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "pretraining_tp": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": asdict(self.rope_scaling) if self.rope_scaling else None,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype,
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }
        if architecture.sliding_window:
            written["sliding_window"] = self.sliding_window
        if architecture.model_type in ("qwen2", "qwen3"):
            written["use_sliding_window"] = False
        return written

    def write_json(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_json_dict(), indent=2) + "\n", encoding="utf-8")

    def summary(self) -> str:
        """One line for humans, e.g. in `sv weights inspect`."""
        rope = f"rope theta {self.rope_theta:g}"
        if self.rope_scaling:
            rope += f" ({self.rope_scaling.rope_type} x{self.rope_scaling.factor:g})"
        return (
            f"{self.model_type}: hidden {self.hidden_size}, layers {self.num_hidden_layers}, heads "
            f"{self.num_attention_heads} ({self.num_key_value_heads} kv), head_dim {self.head_dim}, "
            f"ffn {self.intermediate_size}, vocab {self.vocab_size}, "
            f"{'tied' if self.tie_word_embeddings else 'untied'} embeddings, {rope}, "
            f"context {self.max_position_embeddings}, {self.torch_dtype}"
            + (f", sliding window {self.sliding_window}" if self.sliding_window else "")
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_as_float(value: Any) -> Any:
    """An int as a float (JSON writes 500000.0 as 500000 sometimes); one past a float's range
    becomes inf, which the finite checks then refuse by name. Anything else as it is."""
    if not _is_int(value):
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf


_MISSING = object()
# What a null in place of a value of each type of `_get` is told it should have been.
_KINDS = {int: "an integer", float: "a number", bool: "true or false"}


def _get(
    raw: dict[str, Any],
    key: str,
    kind: type,
    default: Any = _MISSING,
    where: str = "config",
    *,
    null_is_default: bool = False,
) -> Any:
    """`raw[key]`, of type `kind`; `default` where the key is absent. An explicit null is an
    error unless `null_is_default` (only where transformers itself reads null as its default,
    so that a config it would fail on, e.g. `"rope_theta": null`, is not run on a guess)."""
    value = raw.get(key, _MISSING)
    if value is None and not null_is_default:
        absent = "" if default is _MISSING else " (leave the key out for its default)"
        raise WeightsError(f"{where} key {key!r}: expected {_KINDS[kind]}, got null{absent}")
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise WeightsError(f"{where} key {key!r} is missing")
        return default
    if kind is float:
        value = _int_as_float(value)
    ok = (
        isinstance(value, bool)
        if kind is bool
        else (isinstance(value, kind) and not isinstance(value, bool))
    )
    if not ok:
        raise WeightsError(f"{where} key {key!r}: expected {kind.__name__}, got {value!r}")
    return value


def _get_optional_int(raw: dict[str, Any], key: str, absent: int | None = None) -> int | None:
    """raw[key], an integer or null; `absent` where the key is left out."""
    if key not in raw:
        return absent
    value = raw[key]
    if value is None:
        return None
    if not _is_int(value):
        raise WeightsError(f"config key {key!r}: expected an integer or null, got {value!r}")
    return int(value)


def _get_eos(raw: dict[str, Any]) -> tuple[int, ...]:
    value = raw.get("eos_token_id")
    if value is None:
        return ()
    if _is_int(value):
        return (value,)
    if isinstance(value, list) and all(_is_int(v) for v in value):  # [] as null: no eos id
        return tuple(value)
    raise WeightsError(
        f"config key 'eos_token_id': expected an integer or a list of integers, got {value!r}"
    )


def _get_torch_dtype(raw: dict[str, Any]) -> str:
    value = raw.get("torch_dtype", raw.get("dtype"))
    if value is None:
        return _DEFAULT_TORCH_DTYPE
    if not isinstance(value, str) or value not in TORCH_DTYPE_NAMES:
        raise WeightsError(
            f"config key 'torch_dtype': expected one of {sorted(TORCH_DTYPE_NAMES)}, got {value!r}"
        )
    return value


def _check_supported_architecture(raw: dict[str, Any]) -> Architecture:
    architecture = architecture_of(raw.get("model_type"), raw.get("architectures"))
    # (Qwen2's q/k/v always carry biases: transformers reads no attention_bias for it.)
    for key in ("mlp_bias",) if architecture.qkv_bias else ("attention_bias", "mlp_bias"):
        if raw.get(key, False) is not False:
            raise WeightsError(
                f"config key {key!r}: biases are not supported by this engine (expected false)"
            )
    if _some_layers_slide(raw) and not architecture.sliding_window:
        listed = isinstance(raw.get("layer_types"), list) and raw["layer_types"]
        key, expected = (
            ("layer_types", "only 'full_attention'") if listed else ("use_sliding_window", "false")
        )
        raise WeightsError(
            f"config key '{key}': a sliding window on some layers of a "
            f"{architecture.model_type} model is not supported (expected {expected})"
        )
    if architecture.sliding_window and _some_layers_see_everything(raw, architecture):
        raise WeightsError(
            f"config key 'layer_types': full attention on some layers of a "
            f"{architecture.model_type} model with a sliding window is not supported (sv gives "
            "every layer the window; expected only 'sliding_attention', or no key)"
        )
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise WeightsError(f"config key 'hidden_act': {act!r} is not supported (expected 'silu')")
    _check_full_rotary(raw)
    return architecture


def _check_full_rotary(raw: dict[str, Any]) -> None:
    """Refuse a `partial_rotary_factor` other than 1 (top level, or in either RoPE spelling):
    sv rotates every dimension of each head. The config asks for RoPE on a fraction of them:
    vLLM's Llama rotates that fraction, transformers' RoPE functions make tables for it (and
    its Llama then fails on them, or ignores the key under plain RoPE). Run whole, the
    model's text would be wrong with no other sign."""
    for where in ("", "rope_parameters.", "rope_scaling."):
        holder = raw if not where else raw.get(where[:-1])
        if not isinstance(holder, dict):
            continue
        factor = holder.get("partial_rotary_factor")
        if factor is not None and (isinstance(factor, bool) or factor != 1):
            raise WeightsError(
                f"config key '{where}partial_rotary_factor': {factor!r} is not supported "
                "(sv applies RoPE to every dimension of each head; expected 1 or no key)"
            )


def _some_layers_slide(raw: dict[str, Any]) -> bool:
    """Whether a Qwen config gives some layers a sliding window, as transformers reads it: its
    `layer_types` where it lists them, else every layer from `max_window_layers` (28 when
    absent) on, when `use_sliding_window` is true and `sliding_window` (4096 when absent) is
    not null."""
    layer_types = raw.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return any(t != "full_attention" for t in layer_types)
    if raw.get("use_sliding_window", False) is False:
        return False
    if "sliding_window" in raw and raw["sliding_window"] is None:
        return False
    layers, first = raw.get("num_hidden_layers"), raw.get("max_window_layers", 28)
    return not (_is_int(layers) and _is_int(first) and first >= layers)


def _some_layers_see_everything(raw: dict[str, Any], architecture: Architecture) -> bool:
    """Whether a config of a family whose window is every layer's (Mistral) lists, in
    `layer_types`, layers without it while it has a window. transformers' Mistral class
    ignores the list (and warns, pointing to its Ministral class, which honours it); vLLM's
    gives those layers full attention: the checkpoint was made for alternating layers."""
    layer_types = raw.get("layer_types")
    window = raw.get("sliding_window", architecture.default_sliding_window)
    if window is None or not isinstance(layer_types, list):
        return False
    return any(t != "sliding_attention" for t in layer_types)


def _parse_rope(raw: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) from either spelling (module doc).

    A config with both spellings (a transformers 5 file to which `rope_scaling` was added by
    hand, as model cards tell users to do for longer contexts) is read the way transformers
    reads it, `rope_scaling` first, and must mean the same under `rope_parameters`: otherwise
    it is refused rather than run with the RoPE of the spelling transformers ignores."""
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    if params is None:
        return _parse_legacy_rope(raw, scaling)
    if not isinstance(params, dict):
        raise WeightsError(f"config key 'rope_parameters': expected an object, got {params!r}")
    theta = _get(params, "rope_theta", float, default=None, where="config rope_parameters")
    if theta is None:
        theta = _get(raw, "rope_theta", float, default=_DEFAULT_ROPE_THETA)
    parsed = (theta, _parse_rope_scaling(params, "rope_parameters"))
    if scaling:  # transformers 4 reads only `rope_scaling`; 5 puts it in place of `rope_parameters`
        legacy = _parse_legacy_rope(raw, scaling)
        if legacy != parsed:
            raise WeightsError(
                f"config keys 'rope_scaling' and 'rope_parameters' disagree (rope_theta "
                f"{legacy[0]:g} and {parsed[0]:g}, scaling {legacy[1]} and {parsed[1]}): "
                "transformers reads 'rope_scaling'; keep one of the two"
            )
    return parsed


def _parse_legacy_rope(raw: dict[str, Any], scaling: Any) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) from the transformers 4.x spelling: a top-level `rope_theta`
    (or one inside `rope_scaling`, where transformers 5 looks first) and `rope_scaling`."""
    if scaling is not None and not isinstance(scaling, dict):
        raise WeightsError(
            f"config key 'rope_scaling': expected an object or null, got {scaling!r}"
        )
    theta = _get(raw, "rope_theta", float, default=_DEFAULT_ROPE_THETA)
    if scaling is None:
        return theta, None
    inner = _get(scaling, "rope_theta", float, default=None, where="config rope_scaling")
    return (theta if inner is None else inner), _parse_rope_scaling(scaling, "rope_scaling")


def _parse_rope_scaling(scaling: dict[str, Any], key: str) -> RopeScaling | None:
    where = f"config {key}"
    rope_type = scaling.get("rope_type", scaling.get("type"))  # "type" is the pre-4.45 spelling
    if rope_type is None or rope_type == "default":
        return None
    if rope_type != "llama3":
        raise WeightsError(
            f"{where}: rope_type {rope_type!r} is not supported (expected 'llama3' or none)"
        )
    return RopeScaling(
        rope_type="llama3",
        factor=_get(scaling, "factor", float, where=where),
        low_freq_factor=_get(scaling, "low_freq_factor", float, where=where),
        high_freq_factor=_get(scaling, "high_freq_factor", float, where=where),
        original_max_position_embeddings=_get(
            scaling, "original_max_position_embeddings", int, where=where
        ),
    )
