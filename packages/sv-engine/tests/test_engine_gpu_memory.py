"""--gpu-memory-utilization's arithmetic, from a made-up device memory report (free, total, and
what the weights hold): the CUDA path itself needs a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from sv_engine import Engine, EngineError
from sv_engine.loading import GPU_KV_FRACTION, gpu_kv_budget

GIB = 1 << 30


def test_the_engine_keeps_within_its_share_of_the_whole_gpu() -> None:
    # An 80 GiB GPU, 2 GiB of weights loaded, 1 GiB held by the CUDA context and others.
    budget = gpu_kv_budget(0.5, free=77 * GIB, total=80 * GIB, weights=2 * GIB)
    assert budget == int((40 - 2) * GIB * 0.85)
    # weights + pool + the activations' share stay within half the GPU
    assert 2 * GIB + budget / GPU_KV_FRACTION <= 40 * GIB


def test_never_more_than_is_free() -> None:
    # Another process holds 60 GiB: 0.9 of the GPU would be more than is free.
    budget = gpu_kv_budget(0.9, free=18 * GIB, total=80 * GIB, weights=2 * GIB)
    assert budget == int(18 * GIB * GPU_KV_FRACTION)  # what the default takes
    # 1.0 is the default's pool whenever anything outside the weights holds memory
    assert gpu_kv_budget(1, free=77 * GIB, total=80 * GIB, weights=2 * GIB) == int(
        77 * GIB * GPU_KV_FRACTION
    )


def test_a_share_the_weights_fill_is_an_error() -> None:
    with pytest.raises(EngineError, match=r"0\.02 .* 1,638 MiB of the GPU's 81,920 MiB.*2,048"):
        gpu_kv_budget(0.02, free=77 * GIB, total=80 * GIB, weights=2 * GIB)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpu_memory_utilization": 0.0}, r"must be in \(0, 1\]"),
        ({"gpu_memory_utilization": 1.5}, r"must be in \(0, 1\]"),
        ({"gpu_memory_utilization": 0.5, "kv_cache_mib": 8}, "not both"),
        ({"gpu_memory_utilization": 0.5}, "on cpu the pool is kv_cache_mib"),
    ],
)
def test_the_engine_refuses_it_before_loading_weights(
    default_model: Path, options: dict[str, float], message: str
) -> None:
    with pytest.raises(EngineError, match=message):
        Engine.from_model_dir(default_model, device="cpu", **options)  # type: ignore[arg-type]
