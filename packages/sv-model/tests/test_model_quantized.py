"""Quantized weights through the whole model: quantized at load, and a pre-quantized FP8 file.

Oracles: the same model with every quantized matrix replaced by its dequantized plain tensor
(the reference semantics of a quantized matrix), and for the FP8 checkpoint the values and
scales written by the `safetensors` package, dequantized by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_kernels.quantized import QuantizedWeight, QuantKind, dequantize
from sv_model import (
    LayerWeights,
    ModelRunner,
    ModelWeights,
    StepInputs,
    dequantize_weights,
    quantize_weights,
)
from sv_weights import ModelConfig, load_checkpoint, tiny_llama_config
from sv_weights.synthetic import (
    fp8_quantization_config,
    kv_cache_only_quantization_config,
    random_weights,
)


def plain(w: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    return dequantize(w) if isinstance(w, QuantizedWeight) else w


def dequantized(weights: ModelWeights) -> ModelWeights:
    layers = [
        LayerWeights(**{name: plain(t) for name, t in vars(layer).items()})
        for layer in weights.layers
    ]
    lm_head = plain(weights.lm_head)
    embed = lm_head if weights.embed is weights.lm_head else plain(weights.embed)
    return ModelWeights(embed, layers, weights.final_norm, lm_head)


def every_logit(config: ModelConfig, weights: ModelWeights, ids: list[int]) -> torch.Tensor:
    runner = ModelRunner(config, weights, num_pages=16)
    runner.set_block_tables([(0, list(range(-(-len(ids) // 16))))])
    n = len(ids)
    return runner.logits(StepInputs(ids, list(range(n)), [0], [n], [n], [0]), every_token=True)


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_quantized_model_matches_its_dequantized_weights(tiny_dir: Path, kind: QuantKind) -> None:
    config = ModelConfig.from_model_dir(tiny_dir)
    loaded = ModelWeights.from_state_dict(config, load_checkpoint(tiny_dir), "cpu", torch.float32)
    weights = quantize_weights(loaded, kind)
    assert isinstance(weights.layers[0].qkv, QuantizedWeight)
    assert weights.embed is weights.lm_head  # tied: the embedding gathers from the quantized head
    assert weights.weight_bytes() < 0.3 * loaded.weight_bytes()  # 1 byte per weight, not 4
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    ours = every_logit(config, weights, ids)
    oracle = every_logit(config, dequantized(weights), ids)
    err = float((ours - oracle).norm() / oracle.norm())
    # fp8 on the CPU is the reference itself; int8 runs torch's kernel on BF16 activations.
    assert err < (1e-5 if kind == "fp8" else 2e-2), err


def write_fp8_checkpoint(folder: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A tiny compressed-tensors FP8 checkpoint (per-channel scales, the LM head left BF16),
    written by the `safetensors` package; returns its config and tensors."""
    config = tiny_llama_config()
    state: dict[str, torch.Tensor] = {}
    for name, w in random_weights(config, seed=5).items():
        if name.endswith("_proj.weight"):
            scale = w.float().abs().amax(dim=1, keepdim=True) / 448.0
            state[name] = (w.float() / scale).to(torch.float8_e4m3fn)
            state[name + "_scale"] = scale
        else:
            state[name] = w
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))
    raw = config.to_json_dict()
    raw["quantization_config"] = fp8_quantization_config()
    (folder / "config.json").write_text(json.dumps(raw))
    return config, state


def by_hand_qkv(state: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
    """Layer `layer`'s packed q/k/v as the checkpoint's FP8 values times their scales."""
    p = f"model.layers.{layer}.self_attn."
    return torch.cat(
        [state[p + f"{n}_proj.weight"].float() * state[p + f"{n}_proj.weight_scale"] for n in "qkv"]
    )


def test_fp8_checkpoint_packs_values_and_scales(tmp_path: Path) -> None:
    config, state = write_fp8_checkpoint(tmp_path)
    weights = ModelWeights.from_state_dict(config, load_checkpoint(tmp_path), "cpu", torch.bfloat16)
    qkv = weights.layers[1].qkv
    assert isinstance(qkv, QuantizedWeight) and qkv.kind == "fp8" and qkv.dtype == torch.bfloat16
    assert torch.equal(dequantize(qkv, torch.float32), by_hand_qkv(state, 1))
    assert isinstance(weights.lm_head, torch.Tensor)  # the checkpoint leaves it BF16


def test_an_fp8_checkpoint_requantized_to_int8_keeps_its_values(tmp_path: Path) -> None:
    """`quantize_weights(int8)` on an FP8 checkpoint makes every matrix int8, from the values
    the FP8 ones stand for: each within half an int8 step of the checkpoint's by hand."""
    config, state = write_fp8_checkpoint(tmp_path)
    loaded = ModelWeights.from_state_dict(config, load_checkpoint(tmp_path), "cpu", torch.float32)
    weights = quantize_weights(loaded, "int8")
    matrices = [weights.lm_head] + [m for layer in weights.layers for m in (layer.qkv, layer.o)]
    assert all(isinstance(m, QuantizedWeight) and m.kind == "int8" for m in matrices)
    qkv = weights.layers[1].qkv
    assert isinstance(qkv, QuantizedWeight)
    expected = by_hand_qkv(state, 1)
    half_step = expected.abs().amax(dim=1, keepdim=True) / 127 / 2
    assert ((dequantize(qkv) - expected).abs() <= half_step * 1.0001).all()


def test_dequantized_fp8_checkpoint_is_its_values_by_hand(tmp_path: Path) -> None:
    """`dequantize_weights` (what the CPU runs an FP8 checkpoint with under --quantization
    none): plain FP32 matrices equal to the checkpoint's values times scales."""
    config, state = write_fp8_checkpoint(tmp_path)
    loaded = ModelWeights.from_state_dict(config, load_checkpoint(tmp_path), "cpu", torch.float32)
    weights = dequantize_weights(loaded)
    qkv = weights.layers[1].qkv
    assert isinstance(qkv, torch.Tensor) and qkv.dtype == torch.float32
    assert torch.equal(qkv, by_hand_qkv(state, 1))
    assert isinstance(weights.lm_head, torch.Tensor)


def test_kv_cache_only_checkpoint_packs_its_plain_values_and_kv_scales(tmp_path: Path) -> None:
    """A checkpoint that llm-compressor calibrated only for an FP8 KV cache (no config group,
    a kv_cache_scheme, BF16 weights, each layer's K and V scale), written by the `safetensors`
    package: every matrix packs as the file's BF16 values exactly, none quantized, and the
    KV scales are the file's, [layers, 2]."""
    config = tiny_llama_config(tie_word_embeddings=False)
    state = random_weights(config, seed=5)
    for layer in range(config.num_hidden_layers):
        for i, which in enumerate(("k_scale", "v_scale")):
            state[f"model.layers.{layer}.self_attn.{which}"] = torch.tensor(
                [0.01 * (1 + 2 * layer + i)]
            )
    safetensors.torch.save_file(state, str(tmp_path / "model.safetensors"))
    raw = config.to_json_dict()
    raw["quantization_config"] = kv_cache_only_quantization_config()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    weights = ModelWeights.from_state_dict(config, load_checkpoint(tmp_path), "cpu", torch.bfloat16)
    for i, layer in enumerate(weights.layers):
        p = f"model.layers.{i}."
        packed = {
            "qkv": torch.cat([state[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
            "o": state[p + "self_attn.o_proj.weight"],
            "gate_up": torch.cat([state[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")]),
            "down": state[p + "mlp.down_proj.weight"],
        }
        for name, want in packed.items():
            got = getattr(layer, name)
            assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16, name
            assert torch.equal(got, want), (i, name)
    assert isinstance(weights.lm_head, torch.Tensor)
    assert torch.equal(weights.lm_head, state["lm_head.weight"])
    by_hand = torch.tensor(
        [
            [float(state[f"model.layers.{i}.self_attn.{w}"]) for w in ("k_scale", "v_scale")]
            for i in range(config.num_hidden_layers)
        ]
    )
    assert weights.kv_scales is not None and torch.equal(weights.kv_scales, by_hand)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_quantizing_keeps_biases_and_head_norms(tmp_path: Path, model_type: str) -> None:
    """Qwen2's q/k/v biases and Qwen3's per-head q/k norms are not matrices: quantizing keeps
    them, and the quantized model stays near the unquantized one (dropping either would not)."""
    from sv_weights import write_random_checkpoint

    config = tiny_llama_config(model_type=model_type, rope_scaling=None)
    write_random_checkpoint(tmp_path, config, seed=3, dtype=torch.float32)
    config = ModelConfig.from_model_dir(tmp_path)
    loaded = ModelWeights.from_state_dict(config, load_checkpoint(tmp_path), "cpu", torch.float32)
    weights = quantize_weights(loaded, "int8")
    for ours, theirs in zip(weights.layers, loaded.layers, strict=True):
        for name in ("qkv_bias", "q_norm", "k_norm"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
    assert any(getattr(loaded.layers[0], n) is not None for n in ("qkv_bias", "q_norm"))
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    ours_logits = every_logit(config, weights, ids)
    plain_logits = every_logit(config, loaded, ids)
    assert float((ours_logits - plain_logits).norm() / plain_logits.norm()) < 5e-2


# safetensors dtype names of the tensors the fuzz below writes.
_HEADER_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float8_e4m3fn: "F8_E4M3",
}
_SHORT_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_fp8_layouts_are_refused_or_load_as_their_values(data: st.DataObject) -> None:
    """Any ignore list (full and short module names, absent modules, lm_head), tied or not,
    Llama, Qwen2 or Qwen3, channel or tensor scales in any scale dtype, and each linear weight
    written FP8 or not mostly as the scheme says and sometimes against it: the check raises
    a WeightsError naming the checkpoint, or every matrix it passes is FP8 exactly where the
    scheme quantizes it and the model packs the file's values times its scales (by hand)."""
    from sv_weights import WeightsError, expected_tensors, validate_checkpoint
    from sv_weights.quantization import parse_quantization_config
    from sv_weights.safetensors import TensorInfo

    tied = data.draw(st.booleans())
    model_type = data.draw(st.sampled_from(["llama", "qwen2", "qwen3"]))
    config = tiny_llama_config(tie_word_embeddings=tied, model_type=model_type)
    strategy = data.draw(st.sampled_from(["channel", "tensor"]))
    linear = [n for n in expected_tensors(config) if n.endswith("_proj.weight")]
    linear += [] if tied else ["lm_head.weight"]
    modules = ["lm_head", "model.layers.7.mlp.down_proj", *_SHORT_MODULES]
    modules += [n.removesuffix(".weight") for n in linear]
    raw = fp8_quantization_config()
    raw["config_groups"]["group_0"]["weights"]["strategy"] = strategy
    raw["ignore"] = data.draw(st.lists(st.sampled_from(modules), max_size=4))
    scheme = parse_quantization_config(raw, "config.json")
    state = dict(random_weights(config, seed=1))
    stands_for: dict[str, torch.Tensor] = {}
    for name in linear:
        w = state[name].float()
        fp8 = scheme.quantizes(name.removesuffix(".weight"))
        if data.draw(st.integers(0, 9)) == 0:
            fp8 = data.draw(st.booleans())
        if fp8:
            scale_shape = (w.shape[0], 1) if strategy == "channel" else (1,)
            absmax = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax()
            scale_dtype = data.draw(st.sampled_from(list(_HEADER_DTYPES)[:3]))
            scale = (absmax / 448.0).reshape(scale_shape).to(scale_dtype)
            state[name] = (w / scale.float()).to(torch.float8_e4m3fn)
            state[name + "_scale"] = scale
            w = state[name].float() * scale.float()
        stands_for[name] = w
    infos = {
        name: TensorInfo(name, _HEADER_DTYPES[t.dtype], tuple(t.shape), 0, t.nbytes)
        for name, t in state.items()
    }
    try:
        validate_checkpoint(config, infos, "ckpt", scheme)
    except WeightsError as error:
        assert str(error).startswith("ckpt: ")
        return
    for name in linear:
        assert (state[name].dtype == torch.float8_e4m3fn) == scheme.quantizes(
            name.removesuffix(".weight")
        ), name
    weights = ModelWeights.from_state_dict(config, state, "cpu", torch.float32)
    for i, layer in enumerate(weights.layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([stands_for[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        gate_up = torch.cat([stands_for[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")])
        assert torch.equal(plain(layer.qkv), qkv)
        assert torch.equal(plain(layer.gate_up), gate_up)
        assert torch.equal(plain(layer.o), stands_for[p + "self_attn.o_proj.weight"])
        assert torch.equal(plain(layer.down), stands_for[p + "mlp.down_proj.weight"])
    if not tied:
        assert torch.equal(plain(weights.lm_head), stands_for["lm_head.weight"])
