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
from sv_weights.synthetic import fp8_quantization_config, random_weights


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
