"""Helpers shared by the sv-kernels tests (imported by name: conftest puts this dir on sys.path)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import torch
from sv_kernels import reference

F = TypeVar("F", bound=Callable[..., Any])

HAS_CUDA = torch.cuda.is_available()
# Small shapes run everywhere (Triton interpreter on the CPU, compiled on a GPU); the serving
# shapes of Llama 3.2 1B only where there is a GPU.
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
GPU = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]


def gpu_test(test: F) -> F:
    """Mark a whole test `gpu` and skip it without a CUDA device."""
    for mark in reversed(GPU):
        test = mark(test)
    return test


# Bounds on ||out - ref|| / ||ref||.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.double() - ref.double()).norm()
    return float(diff / ref.double().norm().clamp_min(1e-30))


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str, tol: float | None = None) -> None:
    """Same shape and dtype, no NaN, relative error within the dtype's bound."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != {ref.dtype}"
    assert not torch.isnan(out).any(), f"{what}: output has NaN"
    bound = TOLERANCE[out.dtype] if tol is None else tol
    err = relative_error(out, ref)
    assert err <= bound, f"{what}: relative error {err:.3g} > {bound:.3g}"


def randn(
    gen: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0
) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen, device=gen.device, dtype=torch.float32) * scale
    return x.to(dtype)


def randint(gen: torch.Generator, low: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=gen, device=gen.device)


@dataclass
class PagedKV:
    """A paged K/V cache holding random sequences, as the model would build it.

    Pages are handed out in shuffled order (block tables are not contiguous). Every slot that
    belongs to no sequence -- unassigned pages, the tail of each last page, the pages that the
    unused block-table entries point at -- holds NaN, so a kernel reading past a sequence fails.
    """

    k_cache: torch.Tensor  # [P, S, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_pages] int32
    seq_lens: torch.Tensor  # [B] int32

    @staticmethod
    def build(
        gen: torch.Generator,
        seq_lens: list[int],
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        page_size: int = 16,
        spare_table_width: int = 2,
    ) -> PagedKV:
        device = gen.device
        pages_per_seq = [math.ceil(n / page_size) for n in seq_lens]
        used = sum(pages_per_seq)
        num_pages = used + 3  # a few pages nobody owns (one is the NaN target of unused entries)
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        # In a GPU pool's layout (stored by head within a page), filled with random values.
        k_cache = reference.kv_pages((), *shape, dtype, device, by_head=True).copy_(
            randn(gen, *shape, dtype=dtype)
        )
        v_cache = reference.kv_pages((), *shape, dtype, device, by_head=True).copy_(
            randn(gen, *shape, dtype=dtype)
        )
        order = torch.randperm(num_pages, generator=gen, device=device)
        width = max(pages_per_seq, default=0) + spare_table_width
        poison_page = int(order[-1])
        tables = torch.full((len(seq_lens), max(width, 1)), poison_page, dtype=torch.int32)
        owned = torch.zeros(num_pages * page_size, dtype=torch.bool, device=device)
        next_page = 0
        for b, (n, pages) in enumerate(zip(seq_lens, pages_per_seq, strict=True)):
            mine = order[next_page : next_page + pages]
            next_page += pages
            tables[b, :pages] = mine.cpu().to(torch.int32)
            positions = torch.arange(n, device=device)
            owned[mine[positions // page_size] * page_size + positions % page_size] = True
        unowned = ~owned.view(num_pages, page_size)
        k_cache[unowned] = float("nan")
        v_cache[unowned] = float("nan")
        return PagedKV(
            k_cache,
            v_cache,
            tables.to(device),
            torch.tensor(seq_lens, dtype=torch.int32, device=device),
        )

    def quantized(self, scales: torch.Tensor) -> PagedKV:
        """These pages stored as e4m3 (`reference.quantize_kv`) with per-head scales [2, Hkv],
        in the same layout; NaN stays NaN."""
        p, s, hkv, d = self.k_cache.shape
        caches = []
        for cache, scale in ((self.k_cache, scales[0]), (self.v_cache, scales[1])):
            fp8 = reference.quantize_kv(cache.reshape(-1, hkv, d), scale).view(p, s, hkv, d)
            caches.append(
                reference.kv_pages((), p, s, hkv, d, fp8.dtype, fp8.device, by_head=True).copy_(fp8)
            )
        return PagedKV(caches[0], caches[1], self.block_tables, self.seq_lens)

    def contiguous(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence b's K and V [len, Hkv, D], read with plain indexing (an oracle for the gather)."""
        n = int(self.seq_lens[b])
        page_size = self.k_cache.shape[1]
        positions = torch.arange(n, device=self.k_cache.device)
        pages = self.block_tables[b].long()[positions // page_size]
        return self.k_cache[pages, positions % page_size], self.v_cache[
            pages, positions % page_size
        ]
