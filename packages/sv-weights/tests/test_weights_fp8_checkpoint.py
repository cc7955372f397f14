"""Pre-quantized FP8 checkpoints in the compressed-tensors layout of published FP8 Llama 3.x.

Oracle: the checkpoint is written by the `safetensors` package from weights quantized here by
hand (per output channel: scale = absmax / 448, e4m3 values), with the quantization_config
those checkpoints carry; loading must give back exactly those values and scales, so the
dequantized weights are the file's.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_values
from sv_weights import (
    ModelConfig,
    WeightsError,
    expected_tensors,
    load_checkpoint,
    tiny_llama_config,
)
from sv_weights.quantization import parse_quantization_config, read_quantization
from sv_weights.synthetic import random_weights

FP8 = torch.float8_e4m3fn


def compressed_tensors_config(strategy: str = "channel") -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": strategy,
                    "symmetric": True,
                    "dynamic": False,
                    "group_size": None,
                },
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "token",
                    "dynamic": True,
                    "symmetric": True,
                },
            }
        },
        "ignore": ["lm_head"],
    }


def write_fp8_checkpoint(
    folder: Path, config: ModelConfig, strategy: str = "channel", **edits: Any
) -> dict[str, torch.Tensor]:
    """Write an FP8 checkpoint of random weights; return what the file holds."""
    state: dict[str, torch.Tensor] = {}
    for name, w in random_weights(config, seed=3).items():
        if not name.endswith("_proj.weight"):
            state[name] = w
            continue
        w32 = w.float()
        if strategy == "channel":
            scale = w32.abs().amax(dim=1, keepdim=True) / 448.0
        else:
            scale = (w32.abs().amax() / 448.0).reshape(1)
        state[name] = (w32 / scale).to(FP8)
        state[name + "_scale"] = scale.to(torch.bfloat16)
        state[name.removesuffix("weight") + "input_scale"] = torch.ones(1)
    state.update(edits.pop("tensors", {}))
    for name in edits.pop("drop", ()):
        del state[name]
    folder.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))
    raw = config.to_json_dict()
    raw["quantization_config"] = edits.pop(
        "quantization_config", compressed_tensors_config(strategy)
    )
    (folder / "config.json").write_text(json.dumps(raw))
    return state


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
@pytest.mark.parametrize("copy", [False, True])
def test_fp8_checkpoint_loads_its_values_and_scales(
    tmp_path: Path, strategy: str, copy: bool
) -> None:
    config = tiny_llama_config()
    written = write_fp8_checkpoint(tmp_path, config, strategy)
    loaded = load_checkpoint(tmp_path, copy=copy)
    assert set(loaded) == set(expected_tensors(config)) | {
        n for n in written if n.endswith("weight_scale")
    }  # input_scale: checked, not loaded
    name = "model.layers.1.mlp.down_proj.weight"
    assert loaded[name].dtype == FP8
    assert torch.equal(loaded[name].view(torch.uint8), written[name].view(torch.uint8))
    dequantized = loaded[name].float() * loaded[name + "_scale"].float()
    assert torch.equal(dequantized, written[name].float() * written[name + "_scale"].float())
    assert torch.equal(loaded["model.norm.weight"], written["model.norm.weight"])


def test_fp8_checkpoint_errors_name_the_tensor(tmp_path: Path) -> None:
    config = tiny_llama_config()
    q = "model.layers.0.self_attn.q_proj.weight"
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"drop": [q + "_scale"]},
            "its scales 'model.layers.0.self_attn.q_proj.weight_scale' are missing",
        ),
        ({"tensors": {q + "_scale": torch.ones(3, 1)}}, "expected [64, 1] (channel scales)"),
        ({"tensors": {q: torch.zeros(64, 64, dtype=torch.bfloat16)}}, "expected F8_E4M3"),
        ({"tensors": {q + "_scale": torch.ones(64, 1, dtype=torch.int32)}}, "has dtype I32"),
        ({"quantization_config": None}, "has no quantization_config"),
        (  # a weight of the wrong shape with scales that match it: the weight is named
            {
                "tensors": {
                    q: torch.ones(32, 64).to(FP8),
                    q + "_scale": torch.ones(32, 1, dtype=torch.bfloat16),
                }
            },
            f"tensor {q!r} has shape [32, 64], expected [64, 64] from config.json",
        ),
    ]
    for i, (edits, message) in enumerate(cases):
        folder = tmp_path / str(i)
        write_fp8_checkpoint(folder, config, **edits)
        with pytest.raises(WeightsError, match=re.escape(message)):
            load_checkpoint(folder)


def test_a_missing_fp8_weight_is_named_missing(tmp_path: Path) -> None:
    """A quantized layer whose weight and scales are both absent (a truncated export): the
    error says the weight is missing, as for a plain checkpoint. It used to say the weight
    "is FP8 but its scales are missing", of a weight the file does not hold."""
    config = tiny_llama_config()
    q = "model.layers.0.self_attn.q_proj"
    write_fp8_checkpoint(
        tmp_path, config, drop=[f"{q}.weight", f"{q}.weight_scale", f"{q}.input_scale"]
    )
    assert f"{q}.weight" not in safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    message = f"1 tensor(s) the config needs are missing, e.g. '{q}.weight'"
    with pytest.raises(WeightsError, match=re.escape(message)):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("lm_head.weight", FP8),  # quantization_config ignores lm_head: no scale for it
        ("model.embed_tokens.weight", FP8),
        ("model.norm.weight", torch.float8_e5m2),
        ("model.layers.0.mlp.down_proj.weight", torch.float8_e5m2),
    ],
)
def test_fp8_outside_the_quantized_linears_is_refused(
    tmp_path: Path, name: str, dtype: torch.dtype
) -> None:
    # An FP8 value stands for value * scale: a tensor without scales in FP8 would load as
    # if its scale were 1. Only the linear weights quantization_config quantizes may be FP8,
    # and only as e4m3.
    config = tiny_llama_config(tie_word_embeddings=False)
    weight = random_weights(config, seed=3)[name].float().to(dtype)
    write_fp8_checkpoint(tmp_path, config, tensors={name: weight})
    with pytest.raises(WeightsError, match=re.escape(f"tensor {name!r}")):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("dtype", [FP8, torch.float8_e5m2])
def test_fp8_in_a_plain_checkpoint_is_refused(tmp_path: Path, dtype: torch.dtype) -> None:
    config = tiny_llama_config()
    state = random_weights(config, seed=3)
    name = "model.layers.0.mlp.down_proj.weight"
    state[name] = state[name].float().to(dtype)
    safetensors.torch.save_file(state, str(tmp_path / "model.safetensors"))
    config.write_json(tmp_path / "config.json")
    with pytest.raises(WeightsError, match="has no quantization_config saying how to scale it"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("bad", [0.0, -0.01])
def test_fp8_scales_must_be_positive(tmp_path: Path, copy: bool, bad: float) -> None:
    """One scale of zero (a silenced output channel) or below (a flipped one) in a layer's
    down projection: refused, naming the tensor and the value."""
    config = tiny_llama_config()
    name = "model.layers.1.mlp.down_proj.weight_scale"
    scale = write_fp8_checkpoint(tmp_path / "good", config)[name].clone()
    scale[5, 0] = bad
    write_fp8_checkpoint(tmp_path / "bad", config, tensors={name: scale})
    with pytest.raises(WeightsError, match=re.escape(f"tensor {name} holds a scale of {bad:g}")):
        load_checkpoint(tmp_path / "bad", copy=copy)
    assert load_checkpoint(tmp_path / "good", copy=copy)[name].shape == scale.shape


@pytest.mark.parametrize("copy", [False, True])
def test_fp8_scales_whose_values_overflow_are_refused(tmp_path: Path, copy: bool) -> None:
    """A finite, positive scale so large that e4m3's largest value (448) times it is no
    finite BF16 or FP32 number: the matrix it scales would hold infinities, and the model
    answered NaN logits (token 0, at once) with no other sign. Refused, naming the tensor
    and the value; the largest scale an exporter makes, absmax / 448 of a BF16 matrix whose
    absmax is BF16's largest value, loads."""
    config = tiny_llama_config()
    name = "model.layers.1.mlp.down_proj.weight_scale"
    scale = write_fp8_checkpoint(tmp_path / "good", config)[name].float()
    bf16_max = torch.finfo(torch.bfloat16).max
    largest = scale.clone()
    largest[3, 0] = bf16_max / 448.0
    write_fp8_checkpoint(tmp_path / "largest", config, tensors={name: largest})
    assert load_checkpoint(tmp_path / "largest", copy=copy)[name][3, 0] == largest[3, 0]
    huge = scale.clone()
    huge[3, 0] = 1e38
    assert torch.isinf((torch.tensor(448.0) * huge[3, 0]).to(torch.bfloat16))  # the oracle
    assert torch.isinf(torch.tensor(448.0) * huge[3, 0])
    write_fp8_checkpoint(tmp_path / "huge", config, tensors={name: huge})
    with pytest.raises(WeightsError, match=re.escape(f"tensor {name} holds a scale of 1e+38")):
        load_checkpoint(tmp_path / "huge", copy=copy)


def test_fp8_checkpoint_of_an_older_exporter_loads(tmp_path: Path) -> None:
    """neuralmagic's published FP8 Llama 3.1 checkpoints name their format "naive-quantized"
    (per-tensor scales, static input scales): for FP8 weights, the same tensors."""
    config = tiny_llama_config()
    layout = compressed_tensors_config("tensor") | {"format": "naive-quantized"}
    written = write_fp8_checkpoint(tmp_path, config, "tensor", quantization_config=layout)
    loaded = load_checkpoint(tmp_path)
    name = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(loaded[name].view(torch.uint8), written[name].view(torch.uint8))
    assert torch.equal(loaded[name + "_scale"], written[name + "_scale"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quant_method": "gptq"}, "quant_method is 'gptq'"),
        ({"format": "pack-quantized"}, "format is 'pack-quantized'"),
        ({"ignore": ["re:.*lm_head"]}, "holds patterns"),
    ],
)
def test_unsupported_quantization_configs_are_refused(change: dict[str, Any], message: str) -> None:
    raw = compressed_tensors_config() | change
    with pytest.raises(WeightsError, match=message):
        parse_quantization_config(raw, "config.json")


def test_group_scales_are_refused() -> None:
    raw = compressed_tensors_config()
    raw["config_groups"]["group_0"]["weights"]["strategy"] = "group"
    raw["config_groups"]["group_0"]["weights"]["group_size"] = 128
    with pytest.raises(WeightsError, match="group_size is 128"):
        parse_quantization_config(raw, "config.json")


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a JSON object, inner objects' keys included."""
    if not isinstance(node, dict):
        return []
    out = []
    for key, value in node.items():
        out.append((*prefix, key))
        out.extend(_paths(value, (*prefix, key)))
    return out


CONFIG_PATHS = _paths(compressed_tensors_config())


def _mutated(config: dict[str, Any], path: tuple[str, ...], value: Any, drop: bool) -> Any:
    """A copy of `config` with the field at `path` replaced by `value`, or removed."""
    raw = copy.deepcopy(config)
    parent = raw
    for key in path[:-1]:
        parent = parent[key]
    if drop:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return raw


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(CONFIG_PATHS), value=json_values, drop=st.booleans())
def test_fuzz_quantization_config_weights_error_or_a_scheme(
    path: tuple[str, ...], value: Any, drop: bool
) -> None:
    """Any one field of a published config replaced by any JSON value, or removed: the parser
    returns a scheme sv reads or raises WeightsError naming the config, never anything else."""
    raw = _mutated(compressed_tensors_config(), path, value, drop)
    try:
        scheme = parse_quantization_config(raw, "config.json")
    except WeightsError as error:
        assert str(error).startswith("config.json: quantization_config")
        return
    # No group left (config_groups removed, null or empty): a scheme of plain weights.
    assert scheme.strategy in ("channel", "tensor") or not raw.get("config_groups")
    assert scheme.quantizes_weights == bool(raw.get("config_groups"))
    assert all(isinstance(module, str) for module in scheme.ignore)


@pytest.mark.parametrize(
    ("plain", "quantized"),
    [
        ("model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.q_proj"),
        ("model.layers.0.mlp.up_proj", "model.layers.0.mlp.gate_proj"),
    ],
)
def test_an_ignore_list_that_splits_a_packed_group_is_refused(
    tmp_path: Path, plain: str, quantized: str
) -> None:
    """sv runs a layer's q/k/v (and gate/up) as one matrix, quantized or not as a whole: an
    ignore list that leaves one of them BF16 while its siblings are FP8 is refused at the
    check, naming both modules (it used to pass and crash the model's packing)."""
    config = tiny_llama_config()
    good = write_fp8_checkpoint(tmp_path / "good", config)
    name = plain + ".weight"
    dequantized = (good[name].float() * good[name + "_scale"].float()).to(torch.bfloat16)
    raw = compressed_tensors_config()
    raw["ignore"] = ["lm_head", plain]
    write_fp8_checkpoint(
        tmp_path / "split",
        config,
        tensors={name: dequantized},
        drop=[name + "_scale", plain + ".input_scale"],
        quantization_config=raw,
    )
    message = f"leaves {plain!r} unquantized but quantizes {quantized!r}"
    with pytest.raises(WeightsError, match=re.escape(message)):
        load_checkpoint(tmp_path / "split")


KV_SCHEME = {
    "num_bits": 8,
    "type": "float",
    "strategy": "tensor",
    "dynamic": False,
    "symmetric": True,
}


def kv_cache_config() -> dict[str, Any]:
    """The quantization_config of an llm-compressor FP8 checkpoint with a calibrated KV cache."""
    return compressed_tensors_config() | {"kv_cache_scheme": dict(KV_SCHEME)}


# How exporters name layer N's K and V cache scales under "model.layers.N.self_attn." (the K
# name, the V name, and the dtype and shape each writes): llm-compressor's, older
# compressed-tensors', ModelOpt's, and older AutoFP8's one scale for both.
KV_SPELLINGS: dict[str, tuple[str, str, torch.dtype, tuple[int, ...]]] = {
    "llm-compressor": ("k_scale", "v_scale", torch.float32, (1,)),
    "output_scale": ("k_proj.output_scale", "v_proj.output_scale", torch.bfloat16, ()),
    "modelopt": ("k_proj.k_scale", "v_proj.v_scale", torch.float32, ()),
    "kv_scale": ("kv_scale", "kv_scale", torch.float32, ()),
}


def kv_scales(config: ModelConfig, spelling: str = "llm-compressor") -> dict[str, torch.Tensor]:
    """A K and a V scale per layer, each a different value (one per layer for kv_scale),
    under `spelling`'s names."""
    k_name, v_name, dtype, shape = KV_SPELLINGS[spelling]
    out = {}
    for layer in range(config.num_hidden_layers):
        for i, name in enumerate((k_name, v_name)):
            value = 0.01 * (1 + 2 * layer + i)
            out.setdefault(
                f"model.layers.{layer}.self_attn.{name}",
                torch.full(shape, value, dtype=dtype),
            )
    return out


@pytest.mark.parametrize("spelling", sorted(KV_SPELLINGS))
@pytest.mark.parametrize("copy", [False, True])
def test_kv_cache_scales_load_under_one_name(tmp_path: Path, spelling: str, copy: bool) -> None:
    """Each layer's K and V cache scale is loaded with the weights, its value the one the
    file holds under that spelling (read back with safetensors), under `self_attn.k_scale` /
    `v_scale`; a `kv_scale` is both."""
    config = tiny_llama_config()
    write_fp8_checkpoint(
        tmp_path, config, tensors=kv_scales(config, spelling), quantization_config=kv_cache_config()
    )
    written = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint(tmp_path, copy=copy, dtype=torch.float32 if copy else None)
    k_name, v_name, dtype, _ = KV_SPELLINGS[spelling]
    for layer in range(config.num_hidden_layers):
        for which, name in (("k", k_name), ("v", v_name)):
            expected = written[f"model.layers.{layer}.self_attn.{name}"]
            got = loaded[f"model.layers.{layer}.self_attn.{which}_scale"]
            assert got.dtype == dtype  # as written
            assert float(got.float()) == float(expected.float())
    layers = range(config.num_hidden_layers)
    ours = {f"model.layers.{layer}.self_attn.{w}_scale" for layer in layers for w in "kv"}
    assert {n for n in loaded if "scale" in n and "weight" not in n} == ours  # the file's go


def test_kv_cache_scale_errors_name_the_tensor(tmp_path: Path) -> None:
    config = tiny_llama_config()
    good = kv_scales(config)
    k0 = "model.layers.0.self_attn.k_scale"
    v1 = "model.layers.1.self_attn.v_scale"
    by_kv, modelopt = kv_scales(config, "kv_scale"), kv_scales(config, "modelopt")
    kv0, kv1 = "model.layers.0.self_attn.kv_scale", "model.layers.1.self_attn.kv_scale"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tensors": {n: t for n, t in good.items() if n != v1}}, f"tensor {v1!r} is missing"),
        ({"tensors": good | {k0: torch.ones(2)}}, f"{k0!r} has shape [2], expected [1] or []"),
        ({"tensors": good | {k0: torch.ones(1, dtype=torch.int32)}}, f"{k0!r} has dtype I32"),
        ({"tensors": good | {k0: torch.tensor([float("nan")])}}, f"tensor {k0} holds NaN"),
        ({"tensors": good | {k0: torch.tensor([float("inf")])}}, f"tensor {k0} holds NaN"),
        ({"tensors": good | {k0: torch.zeros(1)}}, f"tensor {k0} holds a scale of 0"),
        ({"tensors": good | {v1: torch.tensor([-0.5])}}, f"tensor {v1} holds a scale of -0.5"),
        (
            {"tensors": good | {"model.layers.0.self_attn.k_proj.output_scale": torch.ones(1)}},
            f"tensors {k0!r} and 'model.layers.0.self_attn.k_proj.output_scale' are the same",
        ),
        (  # AutoFP8's one scale for both, beside llm-compressor's K scale
            {"tensors": good | {kv0: torch.ones(())}},
            f"tensors {k0!r} and {kv0!r} are the same KV-cache scale under two names",
        ),
        (  # ModelOpt's V scale beside AutoFP8's
            {"tensors": by_kv | {"model.layers.1.self_attn.v_proj.v_scale": torch.ones(())}},
            "tensors 'model.layers.1.self_attn.v_proj.v_scale' and "
            "'model.layers.1.self_attn.kv_scale' are the same",
        ),
        (  # a layer without its kv_scale
            {"tensors": {n: t for n, t in by_kv.items() if n != kv1}},
            "tensor 'model.layers.1.self_attn.k_scale' is missing",
        ),
        ({"tensors": by_kv | {kv1: torch.zeros(())}}, f"tensor {kv1} holds a scale of 0"),
        ({"tensors": by_kv | {kv1: torch.ones(2)}}, f"{kv1!r} has shape [2], expected [1] or []"),
        (
            {"tensors": modelopt | {"model.layers.0.self_attn.v_proj.v_scale": torch.ones(3)}},
            "'model.layers.0.self_attn.v_proj.v_scale' has shape [3]",
        ),
        (  # scales with no kv_cache_scheme saying what they are
            {"tensors": good, "quantization_config": compressed_tensors_config()},
            f"tensor {k0!r} is a KV-cache scale, but quantization_config has no kv_cache_scheme",
        ),
    ]
    for i, (edits, message) in enumerate(cases):
        edits.setdefault("quantization_config", kv_cache_config())
        folder = tmp_path / str(i)
        write_fp8_checkpoint(folder, config, **copy_edits(edits))
        for copied in (False, True):
            with pytest.raises(WeightsError, match=re.escape(message)) as caught:
                load_checkpoint(folder, copy=copied)
            assert "\n" not in str(caught.value)


def copy_edits(edits: dict[str, Any]) -> dict[str, Any]:
    return {k: copy.deepcopy(v) if k == "quantization_config" else v for k, v in edits.items()}


def test_kv_cache_scales_in_a_plain_checkpoint_are_refused(tmp_path: Path) -> None:
    from sv_weights import write_random_checkpoint

    config = tiny_llama_config()
    write_random_checkpoint(tmp_path, config, seed=0, dtype=torch.float32)
    state = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.0.self_attn.k_proj.output_scale"] = torch.ones(1)
    safetensors.torch.save_file(state, str(tmp_path / "model.safetensors"))
    message = (
        "tensor 'model.layers.0.self_attn.k_proj.output_scale' is a KV-cache scale, but "
        "config.json has no quantization_config with a kv_cache_scheme"
    )
    with pytest.raises(WeightsError, match=re.escape(message)):
        load_checkpoint(tmp_path)


def test_a_kv_cache_without_its_scales_loads(tmp_path: Path) -> None:
    """A kv_cache_scheme and no scale tensors: loads (the FP8 pool's scales are then 1)."""
    config = tiny_llama_config()
    write_fp8_checkpoint(tmp_path, config, quantization_config=kv_cache_config())
    scheme = read_quantization(tmp_path)
    assert scheme is not None and scheme.kv_cache
    assert not any(name.endswith("k_scale") for name in load_checkpoint(tmp_path))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"strategy": "attn_head"}, "kv_cache_scheme.strategy is 'attn_head'"),
        ({"strategy": "channel"}, "kv_cache_scheme.strategy is 'channel'"),
        ({"type": "int"}, "kv_cache_scheme.type is 'int'"),
        ({"num_bits": 4}, "kv_cache_scheme.num_bits is 4"),
        ({"dynamic": True}, "kv_cache_scheme.dynamic is True"),
        ({"symmetric": False}, "kv_cache_scheme.symmetric is False"),
    ],
)
def test_kv_cache_schemes_sv_cannot_honour_are_refused(
    change: dict[str, Any], message: str
) -> None:
    raw = kv_cache_config()
    raw["kv_cache_scheme"] |= change
    with pytest.raises(
        WeightsError, match=re.escape(f"config.json: quantization_config.{message}")
    ):
        parse_quantization_config(raw, "config.json")
    assert parse_quantization_config(kv_cache_config(), "config.json").kv_cache


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(_paths(kv_cache_config())), value=json_values, drop=st.booleans())
def test_fuzz_kv_cache_scheme_weights_error_or_a_scheme(
    path: tuple[str, ...], value: Any, drop: bool
) -> None:
    """As the fuzz above, with a kv_cache_scheme: a scheme or a WeightsError naming the config."""
    raw = _mutated(kv_cache_config(), path, value, drop)
    try:
        scheme = parse_quantization_config(raw, "config.json")
    except WeightsError as error:
        assert str(error).startswith("config.json: quantization_config")
        return
    assert scheme.kv_cache == (raw.get("kv_cache_scheme") is not None)


# --- a KV-cache-only calibration: plain weights, a kv_cache_scheme and the K/V scales ---------


def kv_only_config(fmt: str = "dense", groups: str = "empty") -> dict[str, Any]:
    """The quantization_config llm-compressor writes when it calibrates only the KV cache:
    no config group quantizes a weight (`groups`: "empty" {}, "null" or "absent")."""
    raw: dict[str, Any] = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {},
        "ignore": [],
        "kv_cache_scheme": dict(KV_SCHEME),
        "quantization_status": "compressed",
    }
    if groups == "null":
        raw["config_groups"] = None
    elif groups == "absent":
        del raw["config_groups"]
    return raw


def write_kv_only_checkpoint(
    folder: Path,
    config: ModelConfig,
    dtype: torch.dtype = torch.bfloat16,
    quantization_config: Any = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Plain random weights in `dtype`, each layer's K and V scale (`kv_scales`, or `tensors`
    instead) and a KV-cache-only quantization_config (`kv_only_config()` unless given),
    written by the `safetensors` package; returns what the file holds."""
    state = random_weights(config, seed=3, dtype=dtype) | (
        kv_scales(config) if tensors is None else tensors
    )
    folder.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))
    raw = config.to_json_dict()
    raw["quantization_config"] = (
        kv_only_config() if quantization_config is None else quantization_config
    )
    (folder / "config.json").write_text(json.dumps(raw))
    return state


@pytest.mark.parametrize("fmt", ["dense", "float-quantized", "naive-quantized"])
@pytest.mark.parametrize("groups", ["empty", "null", "absent"])
@pytest.mark.parametrize("copy", [False, True])
def test_a_kv_cache_only_checkpoint_loads_plain_weights_and_its_scales(
    tmp_path: Path, fmt: str, groups: str, copy: bool
) -> None:
    """No config group, a kv_cache_scheme: every weight loads as the file's plain BF16 values
    (none FP8, no weight_scale expected) and each layer's K and V scale as the file's (read
    back with safetensors). It was refused: "config_groups must hold exactly one group"."""
    config = tiny_llama_config()
    write_kv_only_checkpoint(tmp_path, config, quantization_config=kv_only_config(fmt, groups))
    written = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    scheme = read_quantization(tmp_path)
    assert scheme is not None and scheme.kv_cache and not scheme.quantizes_weights
    assert not any(scheme.quantizes(n.removesuffix(".weight")) for n in expected_tensors(config))
    loaded = load_checkpoint(tmp_path, copy=copy)
    assert set(loaded) == set(written)
    for name, tensor in written.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(loaded[name], tensor), name
    assert loaded["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("spelling", sorted(KV_SPELLINGS))
def test_kv_cache_only_checkpoints_of_other_dtypes_and_spellings_load(
    tmp_path: Path, dtype: torch.dtype, spelling: str
) -> None:
    """F32 or F16 weights, and the K/V scales under any spelling sv reads: the file's values,
    the scales under sv's names."""
    config = tiny_llama_config()
    written = write_kv_only_checkpoint(tmp_path, config, dtype, tensors=kv_scales(config, spelling))
    loaded = load_checkpoint(tmp_path, copy=True)
    for name in expected_tensors(config):
        assert loaded[name].dtype == dtype and torch.equal(loaded[name], written[name]), name
    k_name, v_name, _, _ = KV_SPELLINGS[spelling]
    for layer in range(config.num_hidden_layers):
        for which, name in (("k", k_name), ("v", v_name)):
            want = written[f"model.layers.{layer}.self_attn.{name}"]
            got = loaded[f"model.layers.{layer}.self_attn.{which}_scale"]
            assert float(got.float()) == float(want.float())


def test_kv_cache_only_errors_name_the_tensor_or_field(tmp_path: Path) -> None:
    """What a KV-cache-only checkpoint must still be: its KV scheme one sv honours, its scales
    in every layer and described by a kv_cache_scheme, and no FP8 weight or weight scale (no
    config group says how to read them)."""
    config = tiny_llama_config()
    good = kv_scales(config)
    v1 = "model.layers.1.self_attn.v_scale"
    q = "model.layers.0.self_attn.q_proj.weight"
    fp8_q = random_weights(config, seed=3)[q].float().to(FP8)
    no_scheme = kv_only_config()
    del no_scheme["kv_cache_scheme"]
    dynamic, channel = kv_only_config(), kv_only_config()
    dynamic["kv_cache_scheme"]["dynamic"] = True
    channel["kv_cache_scheme"]["strategy"] = "channel"
    where = "quantization_config"
    cases: list[tuple[dict[str, Any], Any, str]] = [
        (good, dynamic, f"{where}.kv_cache_scheme.dynamic is True; sv reads only false"),
        (good, channel, f"{where}.kv_cache_scheme.strategy is 'channel'; sv reads tensor"),
        (
            {n: t for n, t in good.items() if n != v1},
            kv_only_config(),
            f"tensor {v1!r} is missing: a calibrated KV cache has k_scale and v_scale in every "
            "layer or in none",
        ),
        (
            good,
            no_scheme,
            "tensor 'model.layers.0.self_attn.k_scale' is a KV-cache scale, but "
            "quantization_config has no kv_cache_scheme",
        ),
        (
            good | {q: fp8_q},
            kv_only_config(),
            f"tensor {q!r} is F8_E4M3, but quantization_config does not quantize it",
        ),
        (
            good | {q + "_scale": torch.ones(64, 1)},
            kv_only_config(),
            f"{q + '_scale'!r} belongs to 'model.layers.0.self_attn.q_proj', which "
            "quantization_config leaves unquantized (it has no config_groups)",
        ),
        (good, kv_only_config("pack-quantized"), f"{where}.format is 'pack-quantized'"),
        (good, kv_only_config(None), f"{where}.format is None"),  # type: ignore[arg-type]
    ]
    for i, (tensors, quantization_config, message) in enumerate(cases):
        folder = tmp_path / str(i)
        write_kv_only_checkpoint(
            folder, config, quantization_config=quantization_config, tensors=tensors
        )
        for copied in (False, True):
            with pytest.raises(WeightsError, match=re.escape(message)) as caught:
                load_checkpoint(folder, copy=copied)
            assert "\n" not in str(caught.value)
            assert str(caught.value).startswith(str(folder))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (  # "dense" weights are plain: a group quantizing them would describe no FP8 tensor
            {"format": "dense"},
            "quantization_config.format is 'dense'; with config_groups sv reads only "
            "'float-quantized' or 'naive-quantized' (FP8 weights)",
        ),
        (
            {"config_groups": {"group_0": {}, "group_1": {}}},
            "quantization_config.config_groups must hold one group (FP8 weights) or none",
        ),
        (
            {"config_groups": ["group_0"]},
            "quantization_config.config_groups must hold one group (FP8 weights) or none",
        ),
    ],
)
def test_configs_with_weights_keep_their_refusals(change: dict[str, Any], message: str) -> None:
    raw = kv_cache_config() | change
    with pytest.raises(WeightsError, match=re.escape(f"config.json: {message}")):
        parse_quantization_config(raw, "config.json")


def test_an_empty_compressed_tensors_config_quantizes_nothing(tmp_path: Path) -> None:
    """No config group and no kv_cache_scheme: a config that quantizes nothing (vLLM runs it
    unquantized). Plain weights load as the file's values; an FP8 weight or a KV-cache scale
    is refused, as nothing in the config says how to read it."""
    config = tiny_llama_config()
    empty = kv_only_config()
    del empty["kv_cache_scheme"]
    written = write_kv_only_checkpoint(
        tmp_path / "plain", config, quantization_config=empty, tensors={}
    )
    scheme = read_quantization(tmp_path / "plain")
    assert scheme is not None and not scheme.kv_cache and not scheme.quantizes_weights
    loaded = load_checkpoint(tmp_path / "plain")
    assert all(torch.equal(loaded[n], t) for n, t in written.items()) and set(loaded) == set(
        written
    )


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(_paths(kv_only_config())), value=json_values, drop=st.booleans())
def test_fuzz_kv_cache_only_config_weights_error_or_a_scheme(
    path: tuple[str, ...], value: Any, drop: bool
) -> None:
    """Any one field of a KV-cache-only config replaced by any JSON value, or removed: a
    scheme (quantizing weights only with a group sv reads) or a WeightsError naming the config.
    A field sv does not read (quantization_status), and config_groups removed, null or empty,
    leave a scheme of plain weights."""
    raw = _mutated(kv_only_config(), path, value, drop)
    unread = path == ("quantization_status",)
    no_groups = path == ("config_groups",) and (drop or value is None or value == {})
    if unread or no_groups:
        assert not parse_quantization_config(raw, "config.json").quantizes_weights
        return
    try:
        scheme = parse_quantization_config(raw, "config.json")
    except WeightsError as error:
        assert str(error).startswith("config.json: quantization_config")
        return
    assert not scheme.quantizes_weights  # no group sv reads can come from one field
    assert scheme.kv_cache == (raw.get("kv_cache_scheme") is not None)
