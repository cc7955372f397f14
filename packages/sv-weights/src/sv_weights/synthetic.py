"""Random checkpoints with the real tensor names, shapes and config.json of their family.

They stand in for real weights where only the shapes matter (speed at Llama 3.2 1B size, GPU
kernels against their references) and make fast end-to-end tests possible. The initialisation
follows the usual recipe (transformers' `initializer_range` = 0.02 for every matrix) with
RMSNorm gains near 1, so activations keep unit scale through the layers and the logits are
finite with a spread of about 0.02 * sqrt(hidden_size): not all equal, not overflowing.
Biases (Qwen2's q/k/v) are drawn wider than the matrices' entries so that a forward which
dropped them would be visibly wrong.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from sv_weights.checkpoint import SINGLE_FILE, expected_tensors
from sv_weights.config import CONFIG_FILE, ModelConfig
from sv_weights.errors import WeightsError
from sv_weights.safetensors import save_file

MATRIX_STD = 0.02
NORM_GAIN_STD = 0.02  # gains are 1 + this noise, so a test can tell the norms apart
BIAS_STD = 0.1

_TORCH_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def random_weights(
    config: ModelConfig,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Seeded random tensors for every name of `expected_tensors(config)`, on the CPU.

    The same (config, seed, device) gives the same values on every machine of that kind: they
    are drawn in float32 from one generator on `device`, in the fixed order of
    `expected_tensors`, then cast to `dtype`. A CUDA device draws an 8B checkpoint in seconds
    where the CPU takes minutes (its values differ from the CPU's).
    """
    if dtype not in _TORCH_DTYPE_NAMES:
        raise WeightsError(
            f"random checkpoint dtype {dtype} not supported (use {list(_TORCH_DTYPE_NAMES)})"
        )
    generator = torch.Generator(device).manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in expected_tensors(config).items():
        values = torch.randn(shape, generator=generator, dtype=torch.float32, device=device)
        if name.endswith(".bias"):
            values = values.mul_(BIAS_STD)
        elif len(shape) == 1:  # RMSNorm gain
            values = values.mul_(NORM_GAIN_STD).add_(1.0)
        else:
            values = values.mul_(MATRIX_STD)
        weights[name] = values.to(dtype).cpu()
    return weights


def write_random_checkpoint(
    out_dir: str | os.PathLike[str],
    config: ModelConfig,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> Path:
    """Write `config.json` and `model.safetensors` of a random checkpoint into `out_dir`,
    drawing the values on `device` (see `random_weights`).

    The config's `torch_dtype` is set to `dtype`. Returns `out_dir` (created if needed).
    """
    weights = random_weights(config, seed, dtype, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(config, torch_dtype=_TORCH_DTYPE_NAMES[dtype])
    save_file(weights, out_dir / SINGLE_FILE, metadata={"format": "pt"})
    config.write_json(out_dir / CONFIG_FILE)
    return out_dir


def fp8_quantization_config() -> dict[str, Any]:
    """The config.json `quantization_config` of a compressed-tensors checkpoint whose linear
    weights are FP8 (e4m3) with one scale per output channel (`weight_scale` [N, 1]) and whose
    LM head is left unquantized, as published FP8 Llama 3.x checkpoints are."""
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            }
        },
        "ignore": ["lm_head"],
    }


def kv_cache_only_quantization_config() -> dict[str, Any]:
    """The config.json `quantization_config` of a checkpoint llm-compressor calibrated only
    for an FP8 KV cache: no config group (the weights stay plain) and a kv_cache_scheme of one
    static scale per layer for K and one for V (`self_attn.k_scale`, `v_scale`)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "config_groups": {},
        "ignore": [],
        "kv_cache_scheme": {
            "num_bits": 8,
            "type": "float",
            "strategy": "tensor",
            "dynamic": False,
            "symmetric": True,
        },
        "quantization_status": "compressed",
    }
