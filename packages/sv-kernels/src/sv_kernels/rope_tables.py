"""RoPE angle tables, including Llama 3's frequency scaling (rope_type "llama3").

The tables are computed once per model on the host side of the step loop; the kernels only
look up rows by position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1+ long-context scaling: low frequencies are slowed by `factor`, high ones kept,
    and the band between them interpolated smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def rope_inv_freq(head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None) -> Tensor:
    """Inverse frequencies [D/2] in FP32, computed the way Hugging Face Llama does."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are divided by the factor; short ones are untouched.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(
    head_dim: int,
    max_positions: int,
    theta: float,
    scaling: Llama3RopeScaling | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """cos and sin tables [max_positions, D/2] in FP32 for positions 0..max_positions-1."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    positions = torch.arange(max_positions, dtype=torch.int64).float()
    angles = positions[:, None] * inv_freq[None, :]
    return angles.cos().to(device), angles.sin().to(device)
