"""How many KV-cache pages fit in a memory budget.

One page id covers the same `page_size` token slots in *every* layer, for both K and V, so a page's
size is the whole model's KV for `page_size` tokens. The engine measures memory (it owns torch); these
helpers only do the arithmetic, so they stay stdlib-only and testable by hand.
"""

from __future__ import annotations

import math

from .errors import KVCacheError

DEFAULT_PAGE_SIZE = 16
MIB = 1 << 20


def _require_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KVCacheError(f"{name} must be a positive integer, got {value!r}")


def bytes_per_page(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> int:
    """Bytes one page takes: K and V, every layer, `page_size` tokens.

    Llama 3.2 1B in bf16: 2 * 16 layers * 8 heads * 64 dims * 2 bytes * 16 tokens = 512 KiB.
    """
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
        ("page_size", page_size),
    ):
        _require_positive_int(name, value)
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes * page_size


def _pages_in(budget_bytes: int, per_page: int, what: str, page_size: int) -> int:
    pages = budget_bytes // per_page
    if pages == 0:
        raise KVCacheError(
            f"{what} holds 0 KV-cache pages: one page ({page_size} tokens of K and V in every "
            f"layer) takes {per_page} bytes ({per_page / MIB:.3f} MiB); give the cache more memory"
        )
    return pages


def pages_for_mib(
    mib: float,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> int:
    """Whole pages that fit in `mib` MiB (e.g. the CLI's --kv-cache-mib); raises when that is 0."""
    if isinstance(mib, bool) or not isinstance(mib, int | float) or not 0 < mib < math.inf:
        raise KVCacheError(f"the KV-cache size must be a positive number of MiB, got {mib!r}")
    per_page = bytes_per_page(num_layers, num_kv_heads, head_dim, dtype_bytes, page_size)
    return _pages_in(int(mib * MIB), per_page, f"a KV cache of {mib} MiB", page_size)


def pages_for_free_memory(
    free_bytes: int,
    fraction: float,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> int:
    """Whole pages that fit in `fraction` of `free_bytes` (device memory left after the weights)."""
    if isinstance(free_bytes, bool) or not isinstance(free_bytes, int) or free_bytes < 0:
        raise KVCacheError(f"free_bytes must be a non-negative integer, got {free_bytes!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise KVCacheError(f"fraction must be in (0, 1], got {fraction!r}")
    per_page = bytes_per_page(num_layers, num_kv_heads, head_dim, dtype_bytes, page_size)
    budget = int(free_bytes * fraction)
    return _pages_in(
        budget, per_page, f"{fraction:g} of {free_bytes} free bytes ({budget} bytes)", page_size
    )
