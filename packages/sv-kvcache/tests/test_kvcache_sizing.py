"""Sizing arithmetic against hand-computed figures."""

from __future__ import annotations

import pytest
from sv_kvcache import KVCacheError, bytes_per_page, pages_for_free_memory, pages_for_mib

# Llama 3.2 1B: 16 layers, 8 KV heads of 64 dims, bf16.
LLAMA_1B = {"num_layers": 16, "num_kv_heads": 8, "head_dim": 64, "dtype_bytes": 2}
# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims.
SMOLLM2 = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "dtype_bytes": 2}


def test_bytes_per_page_by_hand() -> None:
    # K and V (2) * 16 layers * 8 heads * 64 dims * 2 bytes * 16 tokens = 524,288 bytes = 0.5 MiB.
    assert bytes_per_page(**LLAMA_1B) == 524_288
    # 2 * 30 * 3 * 64 * 2 * 16 = 368,640.
    assert bytes_per_page(**SMOLLM2) == 368_640
    assert bytes_per_page(**LLAMA_1B, page_size=32) == 2 * 524_288
    assert bytes_per_page(1, 1, 1, 4, page_size=1) == 8


def test_pages_for_mib_rounds_down() -> None:
    assert pages_for_mib(1, **LLAMA_1B) == 2
    assert pages_for_mib(1.49, **LLAMA_1B) == 2  # 2.98 pages
    assert pages_for_mib(1024, **LLAMA_1B) == 2048
    # 100 MiB / 368,640 bytes = 284.4 pages
    assert pages_for_mib(100, **SMOLLM2) == 284


def test_pages_for_free_memory() -> None:
    ten_gib = 10 * (1 << 30)
    # 0.9 * 10 GiB / 0.5 MiB = 18,432 pages exactly.
    assert pages_for_free_memory(ten_gib, 0.9, **LLAMA_1B) == 18_432
    assert pages_for_free_memory(ten_gib, 1, **LLAMA_1B) == 20_480


def test_zero_pages_is_a_clear_error() -> None:
    with pytest.raises(KVCacheError, match=r"0 KV-cache pages.*524288 bytes"):
        pages_for_mib(0.4, **LLAMA_1B)
    with pytest.raises(KVCacheError, match="0 KV-cache pages"):
        pages_for_free_memory(100_000, 0.5, **LLAMA_1B)


@pytest.mark.parametrize("mib", [0, -1, float("nan"), float("inf"), True, "8"])
def test_bad_mib(mib: object) -> None:
    with pytest.raises(KVCacheError, match="MiB"):
        pages_for_mib(mib, **LLAMA_1B)  # type: ignore[arg-type]


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, float("nan")])
def test_bad_fraction(fraction: float) -> None:
    with pytest.raises(KVCacheError, match="fraction"):
        pages_for_free_memory(1 << 30, fraction, **LLAMA_1B)


def test_bad_shapes() -> None:
    with pytest.raises(KVCacheError, match="num_layers"):
        bytes_per_page(0, 8, 64, 2)
    with pytest.raises(KVCacheError, match="head_dim"):
        bytes_per_page(16, 8, 64.0, 2)  # type: ignore[arg-type]
    with pytest.raises(KVCacheError, match="page_size"):
        bytes_per_page(16, 8, 64, 2, page_size=0)
    with pytest.raises(KVCacheError, match="free_bytes"):
        pages_for_free_memory(-1, 0.5, **LLAMA_1B)
