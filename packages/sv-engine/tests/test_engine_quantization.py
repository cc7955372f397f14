"""`Engine.from_model_dir(quantization=...)`: what the Python API accepts and how it refuses."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from sv_engine import Engine, EngineError, SamplingParams
from sv_kernels.quantized import QuantizedWeight
from sv_weights.synthetic import fp8_quantization_config


@pytest.mark.parametrize("value", ["none", "auto", "FP8"])
def test_a_quantization_outside_the_api_is_refused_naming_none(
    tiny_llama_dir: Path, value: str
) -> None:
    """The CLI's spellings "none" and "auto" are not the API's: the error says None is how the
    API asks for unquantized weights, beside the kinds it takes."""
    message = f"quantization must be None (unquantized) or one of fp8, int8, got {value!r}"
    with pytest.raises(EngineError, match=re.escape(message)):
        Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=1, quantization=value)  # type: ignore[arg-type]


def _fp8_checkpoint(source: Path, folder: Path) -> dict[str, torch.Tensor]:
    """`source`'s model as a compressed-tensors FP8 checkpoint (per-channel scales, the LM
    head left as it is, as published FP8 Llamas do), written by the `safetensors` package;
    returns the plain matrices the FP8 ones stand for (values times scales, by hand)."""
    state, plain = {}, {}
    for name, w in safetensors.torch.load_file(str(source / "model.safetensors")).items():
        if name.endswith("_proj.weight"):
            scale = w.float().abs().amax(dim=1, keepdim=True) / 448.0
            state[name] = (w.float() / scale).to(torch.float8_e4m3fn)
            state[name + "_scale"] = scale
            plain[name] = state[name].float() * scale
        else:
            state[name] = plain[name] = w
    folder.mkdir()
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))
    raw = json.loads((source / "config.json").read_text())
    raw["quantization_config"] = fp8_quantization_config()
    (folder / "config.json").write_text(json.dumps(raw))
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    return plain


def test_an_fp8_checkpoint_on_the_cpu(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The CPU has no FP8 kernel. Unquantized (None), an FP8 checkpoint's matrices are
    dequantized once at load: the greedy tokens of the same values written as a plain FP32
    checkpoint (the oracle, through the plain loader). int8, asked for, makes every matrix
    int8, the FP8 ones from their values."""
    plain = _fp8_checkpoint(tiny_llama_dir, tmp_path / "fp8")
    (tmp_path / "plain").mkdir()
    safetensors.torch.save_file(plain, str(tmp_path / "plain" / "model.safetensors"))
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(tiny_llama_dir / name, tmp_path / "plain" / name)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = ["Name a colour.", "Count to five."]
    fp8 = Engine.from_model_dir(tmp_path / "fp8", device="cpu", kv_cache_mib=4)
    qkv = fp8.runner.model.weights.layers[0].qkv
    assert isinstance(qkv, torch.Tensor) and qkv.dtype == torch.float32
    oracle = Engine.from_model_dir(tmp_path / "plain", device="cpu", kv_cache_mib=4)
    got = [c.output_ids for c in fp8.generate(prompts, params)]
    assert got == [c.output_ids for c in oracle.generate(prompts, params)]
    int8 = Engine.from_model_dir(
        tmp_path / "fp8", device="cpu", kv_cache_mib=4, quantization="int8"
    )
    weights = int8.runner.model.weights
    matrices = [weights.lm_head] + [m for layer in weights.layers for m in vars(layer).values()]
    quantized = [m for m in matrices if isinstance(m, QuantizedWeight)]
    assert len(quantized) == 1 + 4 * len(weights.layers)
    assert all(m.kind == "int8" for m in quantized)


def test_fp8_asked_for_on_the_cpu_is_dequantized_at_load(tiny_llama_dir: Path) -> None:
    """The CPU has no FP8 kernel: `quantization="fp8"` there rounds the matrices to FP8 and
    keeps them as FP32 once, instead of dequantizing each at every call (~100x slower on the
    default model). The greedy tokens are those of the FP8 weights kept quantized (the
    reference path, each matrix dequantized per call), and every matrix is a plain tensor."""
    from sv_model import quantize_weights

    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = ["Name a colour.", "Count to five."]
    fp8 = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=4, quantization="fp8")
    weights = fp8.runner.model.weights
    matrices = [weights.lm_head] + [m for layer in weights.layers for m in vars(layer).values()]
    assert not any(isinstance(m, QuantizedWeight) for m in matrices)
    assert weights.layers[0].qkv.dtype == torch.float32
    kept = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=4)
    kept.runner.model.weights = quantize_weights(kept.runner.model.weights, "fp8")
    assert isinstance(kept.runner.model.weights.layers[0].qkv, QuantizedWeight)
    got = [c.output_ids for c in fp8.generate(prompts, params)]
    assert got == [c.output_ids for c in kept.generate(prompts, params)]


def test_auto_for_kv_cache_only_and_empty_compressed_tensors_configs(tmp_path: Path) -> None:
    """`--quantization auto` on a checkpoint whose quantization_config calibrates only the KV
    cache (no config group), and on one whose config quantizes nothing (no group, no
    kv_cache_scheme): int8 on the CPU, as for a plain checkpoint, since no weight comes
    quantized; on one with FP8 weights: none. fp8 and int8 asked for quantize any."""
    from sv_engine.options import resolve_quantization
    from sv_weights import tiny_llama_config

    kv_cache_scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    empty = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {}}
    for quantization_config, auto in (
        (empty | {"kv_cache_scheme": kv_cache_scheme}, "int8"),
        (empty, "int8"),
        (
            empty
            | {
                "format": "float-quantized",
                "config_groups": {
                    "group_0": {
                        "targets": ["Linear"],
                        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    }
                },
                "kv_cache_scheme": kv_cache_scheme,
            },
            None,
        ),
    ):
        raw = tiny_llama_config().to_json_dict() | {"quantization_config": quantization_config}
        (tmp_path / "config.json").write_text(json.dumps(raw))
        assert resolve_quantization("auto", "cpu", tmp_path) == auto, quantization_config
        assert resolve_quantization("int8", "cpu", tmp_path) == "int8"
        assert resolve_quantization("fp8", "cpu", tmp_path) == "fp8"
