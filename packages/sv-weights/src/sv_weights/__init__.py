"""sv-weights: safetensors parsing and validation, zero-copy loading, model configs, checkpoints.

The safetensors format is parsed here (not through the `safetensors` package): see
`sv_weights.safetensors`. Checkpoint folders are HF layout: see `sv_weights.checkpoint`.
"""

from typing import Any

from sv_weights.architectures import ARCHITECTURES, Architecture
from sv_weights.checkpoint import expected_tensors, load_checkpoint, validate_checkpoint
from sv_weights.config import ModelConfig, RopeScaling
from sv_weights.errors import WeightsError
from sv_weights.presets import PRESETS, llama_3_2_1b_config, preset_config, tiny_llama_config
from sv_weights.safetensors import SafetensorsHeader, TensorInfo, load_file, read_header, save_file
from sv_weights.synthetic import write_random_checkpoint

__all__ = [
    "ARCHITECTURES",
    "PRESETS",
    "Architecture",
    "ModelConfig",
    "RopeScaling",
    "SafetensorsHeader",
    "TensorInfo",
    "WeightsError",
    "convert_gguf_to_hf",
    "expected_tensors",
    "llama_3_2_1b_config",
    "load_checkpoint",
    "load_file",
    "preset_config",
    "read_header",
    "save_file",
    "tiny_llama_config",
    "validate_checkpoint",
    "write_random_checkpoint",
]


def __getattr__(name: str) -> Any:
    # The GGUF importer needs the `gguf` package, which only converting a GGUF file requires
    # (the GPU machine, for one, does not have it): import it on first use.
    if name == "convert_gguf_to_hf":
        from sv_weights.gguf_import import convert_gguf_to_hf

        return convert_gguf_to_hf
    raise AttributeError(f"module 'sv_weights' has no attribute {name!r}")
