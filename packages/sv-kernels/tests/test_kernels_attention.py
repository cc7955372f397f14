"""Triton paged decode attention and varlen prefill attention against their references.

K/V come from `PagedKV`: shuffled pages, and NaN in every slot no sequence owns, so reading past
a sequence (the tail of its last page, unused block-table entries) turns the output into NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernels_testing import DEVICE, PagedKV, assert_close, gpu_test, randint, randn
from sv_kernels import reference, triton_ops

DTYPES = [torch.float32, torch.bfloat16]


def _random_lengths(gen: torch.Generator, batch: int, low: int, high: int) -> list[int]:
    return [int(n) for n in randint(gen, low, high + 1, batch).tolist()]


# --- decode -------------------------------------------------------------------------------


def _decode_case(
    gen: torch.Generator,
    lens: list[int],
    hq: int,
    hkv: int,
    head_dim: int,
    dtype: torch.dtype,
    splits: list[int | None],
) -> None:
    kv = PagedKV.build(gen, lens, hkv, head_dim, dtype)
    q = randn(gen, len(lens), hq, head_dim, dtype=dtype)
    scale = 1 / math.sqrt(head_dim)
    ref = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale
    )
    for num_splits in splits:
        out = triton_ops.paged_decode_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale, num_splits=num_splits
        )
        assert_close(out, ref, f"decode, lens={lens}, num_splits={num_splits}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("hq", "hkv", "head_dim"),
    [(4, 4, 32), (6, 2, 64), (8, 2, 128), (3, 1, 32)],  # GQA groups 1, 3, 4, 3
)
def test_decode_attention(
    gen: torch.Generator, dtype: torch.dtype, hq: int, hkv: int, head_dim: int
) -> None:
    # One token, a page-size multiple, and random lengths not multiples of 16 or of the key tile.
    lens = [1, 32, *_random_lengths(gen, 2, 2, 100)]
    _decode_case(gen, lens, hq, hkv, head_dim, dtype, splits=[1, 3])


def test_decode_attention_batch_one_many_pages(gen: torch.Generator) -> None:
    # None: whatever `choose_num_splits` picks for this table.
    _decode_case(gen, [int(randint(gen, 300, 400, 1))], 4, 2, 32, torch.float32, [1, 7, None])


def test_decode_attention_more_splits_than_tiles(gen: torch.Generator) -> None:
    """Splits past the end of a short sequence are empty; the merge must ignore them."""
    _decode_case(gen, [5, 70], 4, 2, 32, torch.bfloat16, splits=[8])


def test_decode_attention_never_reads_the_scratch_of_empty_splits(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty splits write no partials and the merge reads only the splits that hold tokens:
    with every new buffer full of NaN, a read of an unwritten partial would show in the output."""

    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poisoned(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.dtype in DTYPES else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poisoned(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poisoned(real_empty_like(*a, **k)))
    _decode_case(gen, [5, 70, 0], 4, 2, 32, torch.float32, splits=[8, 64])


def test_decode_attention_empty_sequence_gives_zeros(gen: torch.Generator) -> None:
    """A padding row (seq_len 0, e.g. in a CUDA-graph batch) gives zeros, like the reference."""
    kv = PagedKV.build(gen, [0, 20], 2, 32, torch.float32)
    q = randn(gen, 2, 4, 32, dtype=torch.float32)
    for num_splits in (1, 2):
        out = triton_ops.paged_decode_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.2, num_splits=num_splits
        )
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        ref = reference.paged_decode_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.2
        )
        assert_close(out, ref, "decode with an empty row")


@gpu_test
@pytest.mark.parametrize(("batch", "context"), [(256, 1024), (1, 8192), (1, 32768), (8, 4096)])
def test_decode_attention_serving_shapes(gen: torch.Generator, batch: int, context: int) -> None:
    lens = [context, *_random_lengths(gen, batch - 1, context // 2, context)]
    _decode_case(gen, lens, 32, 8, 64, torch.bfloat16, splits=[None, 1])


# --- prefill ------------------------------------------------------------------------------


def _prefill_case(
    gen: torch.Generator,
    q_lens: list[int],
    prefix_lens: list[int],
    hq: int,
    hkv: int,
    head_dim: int,
    dtype: torch.dtype,
    tiles: list[tuple[int | None, int | None]],
) -> None:
    seq_lens = [q + p for q, p in zip(q_lens, prefix_lens, strict=True)]
    kv = PagedKV.build(gen, seq_lens, hkv, head_dim, dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu = cu.to(DEVICE)
    q = randn(gen, sum(q_lens), hq, head_dim, dtype=dtype)
    scale = 1 / math.sqrt(head_dim)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.seq_lens, kv.block_tables, scale, max(q_lens))
    ref = reference.prefill_attention(*args)
    for tile_m, tile_n in tiles:
        out = triton_ops.prefill_attention(*args, tile_m=tile_m, tile_n=tile_n)
        assert_close(
            out, ref, f"prefill q_lens={q_lens} prefixes={prefix_lens} tiles={tile_m}x{tile_n}"
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("hq", "hkv", "head_dim", "tiles"),
    [(4, 4, 32, (16, 16)), (6, 2, 64, (None, None)), (8, 2, 128, (32, 16))],
)
def test_prefill_attention(
    gen: torch.Generator,
    dtype: torch.dtype,
    hq: int,
    hkv: int,
    head_dim: int,
    tiles: tuple[int | None, int | None],
) -> None:
    # A fresh prompt, a one-token prompt, and two with a cached prefix (lengths not multiples
    # of the page size or of the tiles).
    q_lens = [*_random_lengths(gen, 1, 20, 50), 1, *_random_lengths(gen, 2, 2, 35)]
    prefix_lens = [0, int(randint(gen, 0, 40, 1)), *_random_lengths(gen, 2, 1, 40)]
    _prefill_case(gen, q_lens, prefix_lens, hq, hkv, head_dim, dtype, tiles=[tiles])


def test_prefill_attention_single_prompt_many_tiles(gen: torch.Generator) -> None:
    n = int(randint(gen, 90, 130, 1))
    _prefill_case(gen, [n], [0], 3, 1, 32, torch.float32, tiles=[(16, 32), (None, None)])


@gpu_test
@pytest.mark.parametrize(
    ("q_lens", "prefix_lens"),
    [([2048], [0]), ([700, 1, 1500, 333], [0, 900, 64, 2000]), ([128] * 16, [0] * 16)],
)
def test_prefill_attention_serving_shapes(
    gen: torch.Generator, q_lens: list[int], prefix_lens: list[int]
) -> None:
    _prefill_case(
        gen, q_lens, prefix_lens, 32, 8, 64, torch.bfloat16, tiles=[(None, None), (64, 32)]
    )


# --- a mixed step: prompt chunks, then decodes -------------------------------------------


def _mixed_case(
    gen: torch.Generator,
    prompts: list[tuple[int, int]],
    decode_lens: list[int],
    hq: int,
    hkv: int,
    head_dim: int,
    dtype: torch.dtype,
    fp8: bool = False,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefill_attention with the decodes given as its tail, the reference without) for
    `prompts` (q_len, cached prefix) followed by one-token sequences of `decode_lens`."""
    q_lens = [q for q, _ in prompts] + [1] * len(decode_lens)
    seq_lens = [q + p for q, p in prompts] + decode_lens
    kv = PagedKV.build(gen, seq_lens, hkv, head_dim, dtype)
    scales = None
    if fp8:
        scales = (torch.rand(2, hkv, generator=gen, device=gen.device) + 0.5) / 64
        kv = kv.quantized(scales)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(gen, sum(q_lens), hq, head_dim, dtype=dtype)
    args = (q, kv.k_cache, kv.v_cache, cu.to(DEVICE), kv.seq_lens, kv.block_tables, 0.125)
    n = len(decode_lens)
    # The tail as a step gives it: tensors of their own.
    tail = (kv.seq_lens[-n:].clone(), kv.block_tables[-n:].clone())
    out = triton_ops.prefill_attention(*args, max(q_lens), scales, window, decode_tail=tail)
    return out, reference.prefill_attention(*args, max(q_lens), scales, window)


@pytest.mark.parametrize("sms", [1, 10_000])  # the decodes run apart / stay in the prompt kernel
@pytest.mark.parametrize("window", [None, 20])
def test_prefill_attention_with_a_decode_tail(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch, sms: int, window: int | None
) -> None:
    """A mixed step's decodes give the reference's rows whether they run through the decode
    kernel (few SMs: the unsplit shape) or with the prompts, under a sliding window too; the
    prompts' rows are untouched."""
    import importlib

    module = importlib.import_module("sv_kernels.triton_ops.decode_attention")
    monkeypatch.setattr(module, "num_sms", lambda device: sms)
    decode_lens = _random_lengths(gen, 3, 1, 70)
    out, ref = _mixed_case(
        gen, [(23, 0), (9, 30)], decode_lens, 6, 2, 32, torch.float32, window=window
    )
    assert_close(out, ref, f"mixed step, decodes {decode_lens}, sms={sms}, window {window}")


def test_prefill_attention_whose_sequences_all_decode(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    module = importlib.import_module("sv_kernels.triton_ops.decode_attention")
    monkeypatch.setattr(module, "num_sms", lambda device: 1)
    out, ref = _mixed_case(gen, [], _random_lengths(gen, 3, 1, 40), 4, 2, 32, torch.float32)
    assert_close(out, ref, "a packed step of decodes only")


@gpu_test
@pytest.mark.parametrize("fp8", [False, True])
def test_prefill_attention_with_a_decode_tail_serving_shapes(
    gen: torch.Generator, fp8: bool
) -> None:
    """Llama 3.2 1B's heads, two prompt chunks and 40 decodes of up to 1.5k tokens: on 132
    SMs the decodes run through the unsplit decode kernel."""
    decode_lens = _random_lengths(gen, 40, 100, 1500)
    out, ref = _mixed_case(
        gen, [(700, 0), (333, 2000)], decode_lens, 32, 8, 64, torch.bfloat16, fp8=fp8
    )
    assert_close(out, ref, f"mixed step at 1B shapes, fp8 pages {fp8}")
