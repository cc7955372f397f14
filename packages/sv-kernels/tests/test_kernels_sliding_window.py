"""Sliding-window attention (Mistral): both Triton kernels against their references, and the
references against full attention over the window alone (an independent formula).

The block-table entries of pages wholly before the window are pointed at a NaN page: the pages
a sequence has given back may hold anyone's data, so neither kernel may read them.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernels_testing import DEVICE, PagedKV, assert_close, gpu_test, randint, randn
from sv_kernels import KernelError, ops, reference, triton_ops

PAGE = 16


def _poison_before_window(kv: PagedKV, first_query: list[int], window: int) -> None:
    """Point each row's entries before its first visible page at the all-NaN page."""
    poison = int(kv.block_tables[0, -1])  # the spare entries point at it (see PagedKV)
    for b, q in enumerate(first_query):
        first_page = max(0, q - window + 1) // PAGE
        kv.block_tables[b, :first_page] = poison


def _decode_case(
    gen: torch.Generator,
    lens: list[int],
    window: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
) -> None:
    kv = PagedKV.build(gen, lens, hkv, d, dtype)
    _poison_before_window(kv, [n - 1 for n in lens], window)
    q = randn(gen, len(lens), hq, d, dtype=dtype)
    scale = 1 / math.sqrt(d)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale)
    ref = reference.paged_decode_attention(*args, sliding_window=window)
    assert not torch.isnan(ref).any()
    for num_splits in (1, 3, None):
        out = triton_ops.paged_decode_attention(*args, sliding_window=window, num_splits=num_splits)
        assert_close(out, ref, f"decode lens={lens} window={window} splits={num_splits}")


@pytest.mark.parametrize("window", [1, 5, 16, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_sliding_window(
    gen: torch.Generator, window: int, dtype: torch.dtype
) -> None:
    lens = [1, window, window + 1, *[int(n) for n in randint(gen, 40, 120, 2).tolist()]]
    _decode_case(gen, lens, window, 6, 2, 32, dtype)


def _prefill_case(
    gen: torch.Generator,
    q_lens: list[int],
    prefix_lens: list[int],
    window: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    tiles: list[tuple[int | None, int | None]],
) -> None:
    seq_lens = [q + p for q, p in zip(q_lens, prefix_lens, strict=True)]
    kv = PagedKV.build(gen, seq_lens, hkv, d, dtype)
    _poison_before_window(kv, prefix_lens, window)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(gen, sum(q_lens), hq, d, dtype=dtype)
    scale = 1 / math.sqrt(d)
    args = (q, kv.k_cache, kv.v_cache, cu.to(DEVICE), kv.seq_lens, kv.block_tables, scale)
    ref = reference.prefill_attention(*args, max(q_lens), sliding_window=window)
    assert not torch.isnan(ref).any()
    for tile_m, tile_n in tiles:
        out = triton_ops.prefill_attention(
            *args, max(q_lens), sliding_window=window, tile_m=tile_m, tile_n=tile_n
        )
        assert_close(out, ref, f"prefill q={q_lens} prefix={prefix_lens} W={window} {tile_m}")


@pytest.mark.parametrize("window", [1, 7, 16, 50])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_sliding_window(
    gen: torch.Generator, window: int, dtype: torch.dtype
) -> None:
    # A fresh prompt longer than several windows, a one-token step deep in a sequence, and
    # chunks that continue a cached prefix longer than the window.
    q_lens = [int(randint(gen, 60, 100, 1)), 1, 33, 17]
    prefix_lens = [0, int(randint(gen, 60, 90, 1)), 70, 5]
    _prefill_case(
        gen, q_lens, prefix_lens, window, 4, 2, 32, dtype, tiles=[(16, 16), (32, 16), (None, None)]
    )


def test_window_equals_full_attention_over_the_window_alone(gen: torch.Generator) -> None:
    """The windowed reference at position p is plain causal attention whose keys are the last
    W positions (computed here with torch's own scaled_dot_product_attention)."""
    n, window, hq, hkv, d = 75, 20, 4, 2, 16
    kv = PagedKV.build(gen, [n], hkv, d, torch.float32)
    q = randn(gen, n, hq, d, dtype=torch.float32)
    cu = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
    out = reference.prefill_attention(
        q, kv.k_cache, kv.v_cache, cu, kv.seq_lens, kv.block_tables, 0.25, n, sliding_window=window
    )
    k = reference.gather_kv(kv.k_cache, kv.block_tables[0], n).repeat_interleave(2, dim=1)
    v = reference.gather_kv(kv.v_cache, kv.block_tables[0], n).repeat_interleave(2, dim=1)
    for p in (0, 5, 19, 20, 21, 74):
        lo = max(0, p - window + 1)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[p].unsqueeze(1),  # [Hq, 1, D]
            k[lo : p + 1].transpose(0, 1),  # [Hq, keys, D]
            v[lo : p + 1].transpose(0, 1),
            scale=0.25,
        ).squeeze(1)
        assert_close(out[p], expected, f"position {p}", tol=1e-5)


def test_ops_reject_a_bad_window(gen: torch.Generator) -> None:
    kv = PagedKV.build(gen, [10], 1, 16, torch.float32)
    q = randn(gen, 1, 2, 16, dtype=torch.float32)
    with pytest.raises(KernelError, match="sliding_window must be a host int >= 1"):
        ops.paged_decode_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 1, sliding_window=0
        )


@gpu_test
@pytest.mark.parametrize(("batch", "context"), [(1, 8192), (64, 5000), (256, 1024)])
def test_decode_attention_sliding_window_mistral_shapes(
    gen: torch.Generator, batch: int, context: int
) -> None:
    lens = [context, *[int(n) for n in randint(gen, context // 2, context, batch - 1).tolist()]]
    _decode_case(gen, lens, 4096, 32, 8, 128, torch.bfloat16)


@gpu_test
def test_prefill_attention_sliding_window_mistral_shapes(gen: torch.Generator) -> None:
    _prefill_case(
        gen, [6000, 1, 700], [0, 7000, 4500], 4096, 32, 8, 128, torch.bfloat16, [(None, None)]
    )
