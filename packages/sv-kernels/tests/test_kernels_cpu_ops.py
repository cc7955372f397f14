"""sv_kernels.cpu_ops, what `ops` runs for CPU tensors, against the references it stands in for.

The K/V come from `PagedKV`: shuffled pages, NaN in every slot no sequence owns, so reading
past a sequence (the tail of its last page, unused block-table entries) shows up as NaN. FP32
RMSNorm and SwiGLU must be the reference bit for bit; attention and RoPE within FP32 rounding.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernels_testing import PagedKV, assert_close, randint, randn
from sv_kernels import cpu_ops, ops, reference, rope_tables
from sv_kernels.rope_tables import Llama3RopeScaling

FP8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.bfloat16]
PAGE = 16


@pytest.fixture
def cpu_gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- rms_norm, swiglu -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 576), (7, 64), (3, 5, 32)])
def test_rms_norm_is_the_reference(
    cpu_gen: torch.Generator, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x = randn(cpu_gen, *shape, dtype=dtype, scale=3.0)
    residual = randn(cpu_gen, *shape, dtype=dtype)
    weight = randn(cpu_gen, shape[-1], dtype=dtype)
    for res in (None, residual):
        out, s = cpu_ops.rms_norm(x, weight, 1e-5, res)
        ref, ref_s = reference.rms_norm(x, weight, 1e-5, res)
        assert torch.equal(out, ref) and torch.equal(s, ref_s), (
            f"{dtype}, residual {res is not None}"
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_is_the_reference(cpu_gen: torch.Generator, dtype: torch.dtype) -> None:
    gate_up = randn(cpu_gen, 5, 2 * 96, dtype=dtype, scale=4.0)
    assert torch.equal(cpu_ops.swiglu(gate_up), reference.swiglu(gate_up))


# --- rope_cache_write -----------------------------------------------------------------------


def _rope_case(
    gen: torch.Generator,
    tokens: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    padding: bool,
    by_head: bool,
) -> None:
    num_pages = 2 * tokens // PAGE + 3
    cos, sin = rope_tables.rope_tables(d, 4096, 500000.0, Llama3RopeScaling(32.0, 1.0, 4.0, 8192))
    qkv = randn(gen, tokens, hq + 2 * hkv, d, dtype=dtype, scale=4.0)
    q, k, v = qkv.split([hq, hkv, hkv], dim=1)  # strided views, as the model passes them
    positions = randint(gen, 0, 4096, tokens).to(torch.int32)
    slots = torch.randperm(num_pages * PAGE, generator=gen)[:tokens].to(torch.int32)
    if padding:
        slots[1::3] = -1  # not written
    scales = 2.0 ** -randint(gen, 4, 7, 2, hkv).float() if cache_dtype == FP8 else None
    shape = (num_pages, PAGE, hkv, d)
    # The op writes a pool stored in either order (`kv_pages`: the CPU's plain one, or by head
    # as on a GPU); the reference a plain contiguous cache.
    ref_k = torch.full(shape, float("nan")).to(cache_dtype)
    ref_v = ref_k.clone()
    k_cache = reference.kv_pages((), *shape, cache_dtype, "cpu", by_head).copy_(ref_k)
    v_cache = reference.kv_pages((), *shape, cache_dtype, "cpu", by_head).copy_(ref_v)
    args = (q, k, v, positions, cos, sin)
    out = cpu_ops.rope_cache_write(*args, k_cache, v_cache, slots, scales)
    ref = reference.rope_cache_write(*args, ref_k, ref_v, slots, scales)
    assert out.is_contiguous()
    # The same FP32 products and sums as the reference's, in another order: the same values.
    assert torch.equal(out, ref), "rotated q"
    written = torch.zeros(num_pages * PAGE, dtype=torch.bool)
    written[slots[slots >= 0].long()] = True
    for name, cache, want in (("k", k_cache, ref_k), ("v", v_cache, ref_v)):
        flat, ref_flat = cache.reshape(-1, hkv, d).float(), want.view(-1, hkv, d).float()
        assert flat[~written].isnan().all(), f"{name}: a slot outside slot_mapping changed"
        assert not flat[written].isnan().any(), f"{name}: a slot was not written"
        # K is rotated by the same FP32 products in both, so the same value lands in the
        # cache (for FP8, the reference's own quantize_kv of it).
        assert torch.equal(flat[written], ref_flat[written]), f"{name}: values differ"


@pytest.mark.parametrize("by_head", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "hq", "hkv", "d"), [(1, 9, 3, 64), (13, 4, 4, 32), (40, 6, 2, 16)]
)
def test_rope_cache_write_matches_the_reference(
    cpu_gen: torch.Generator,
    dtype: torch.dtype,
    tokens: int,
    hq: int,
    hkv: int,
    d: int,
    by_head: bool,
) -> None:
    _rope_case(cpu_gen, tokens, hq, hkv, d, dtype, dtype, padding=False, by_head=by_head)


@pytest.mark.parametrize("by_head", [False, True])
@pytest.mark.parametrize("cache_dtype", [torch.float32, FP8])
def test_rope_cache_write_skips_padding_and_writes_fp8(
    cpu_gen: torch.Generator, cache_dtype: torch.dtype, by_head: bool
) -> None:
    _rope_case(cpu_gen, 11, 6, 2, 32, torch.float32, cache_dtype, padding=True, by_head=by_head)


def test_rope_rows_follow_the_positions_and_tables(cpu_gen: torch.Generator) -> None:
    """The cos/sin rows kept from one call are reused only for the same tables and positions:
    new positions in the same buffer, or other tables at the same positions, rotate anew."""
    tables = rope_tables.rope_tables(32, 64, 10000.0), rope_tables.rope_tables(32, 64, 500.0)
    positions = torch.tensor([5, 9])
    k_cache = torch.zeros(2, PAGE, 2, 32)
    for (cos, sin), new_positions in (
        (tables[0], [5, 9]),
        (tables[0], [6, 40]),
        (tables[1], [6, 40]),
    ):
        positions.copy_(torch.tensor(new_positions))  # the same tensor, refilled
        q = randn(cpu_gen, 2, 4, 32, dtype=torch.float32)
        k = randn(cpu_gen, 2, 2, 32, dtype=torch.float32)
        args = (q, k, k, positions, cos, sin)
        slots = torch.tensor([0, 1])
        out = cpu_ops.rope_cache_write(*args, k_cache, k_cache.clone(), slots)
        ref = reference.rope_cache_write(*args, k_cache.clone(), k_cache.clone(), slots)
        assert torch.equal(out, ref), f"positions {new_positions}"


# --- paged_decode_attention -----------------------------------------------------------------


def _pages(
    gen: torch.Generator, lens: list[int], hkv: int, d: int, dtype: torch.dtype, fp8: bool
) -> tuple[PagedKV, torch.Tensor | None]:
    """The sequences' K/V pages, in `dtype` or (fp8) as FP8 with per-head scales [2, Hkv]."""
    kv = PagedKV.build(gen, lens, hkv, d, torch.float32 if fp8 else dtype)
    if not fp8:
        return kv, None
    scales = (2.0 ** -randint(gen, 4, 7, 2, hkv).float()).contiguous()
    return kv.quantized(scales), scales


def _poison(kv: PagedKV, unseen_pages: list[int]) -> None:
    """Point each sequence's first `unseen_pages[b]` table entries at a NaN page."""
    poison = int(kv.block_tables[0, -1])
    for b, pages in enumerate(unseen_pages):
        kv.block_tables[b, :pages] = poison


def _decode_case(
    gen: torch.Generator,
    lens: list[int],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    window: int | None = None,
    fp8: bool = False,
) -> None:
    kv, scales = _pages(gen, lens, hkv, d, dtype, fp8)
    if window is not None:  # pages wholly before the window may hold anything: NaN here
        _poison(kv, [max(0, n - window) // PAGE for n in lens])
    q = randn(gen, len(lens), hq, d, dtype=dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 1 / math.sqrt(d), scales)
    out = cpu_ops.paged_decode_attention(*args, sliding_window=window)
    ref = reference.paged_decode_attention(*args, sliding_window=window)
    assert_close(out, ref, f"decode lens={lens} window={window} fp8={fp8}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 4, 32), (9, 3, 64), (8, 2, 128), (3, 1, 32)])
def test_decode_attention_matches_the_reference(
    cpu_gen: torch.Generator, dtype: torch.dtype, hq: int, hkv: int, d: int
) -> None:
    lens = [1, 32, *[int(n) for n in randint(cpu_gen, 2, 200, 3).tolist()]]
    _decode_case(cpu_gen, lens, hq, hkv, d, dtype)


@pytest.mark.parametrize("window", [1, 16, 37])
def test_decode_attention_sliding_window(cpu_gen: torch.Generator, window: int) -> None:
    lens = [1, window, window + 1, *[int(n) for n in randint(cpu_gen, 40, 120, 2).tolist()]]
    _decode_case(cpu_gen, lens, 6, 2, 32, torch.float32, window=window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_fp8_cache(cpu_gen: torch.Generator, dtype: torch.dtype) -> None:
    _decode_case(cpu_gen, [1, 32, 77], 6, 2, 64, dtype, fp8=True)


def test_decode_attention_padding_row_gives_zeros(cpu_gen: torch.Generator) -> None:
    kv = PagedKV.build(cpu_gen, [0, 20], 2, 32, torch.float32)
    q = randn(cpu_gen, 2, 4, 32, dtype=torch.float32)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.2)
    out = cpu_ops.paged_decode_attention(*args)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close(out, reference.paged_decode_attention(*args), "padding row and a sequence")


# --- prefill_attention ----------------------------------------------------------------------


def _prefill_case(
    gen: torch.Generator,
    lens: list[int],
    q_lens: list[int],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    window: int | None = None,
    fp8: bool = False,
) -> None:
    """Sequence b's last q_lens[b] positions of lens[b] as queries (a prefix before them)."""
    kv, scales = _pages(gen, lens, hkv, d, dtype, fp8)
    if window is not None:  # pages no query can see may hold anything: NaN here
        _poison(kv, [max(0, n - q - window + 1) // PAGE for n, q in zip(lens, q_lens, strict=True)])
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(gen, sum(q_lens), hq, d, dtype=dtype)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.seq_lens, kv.block_tables, 1 / math.sqrt(d))
    out = cpu_ops.prefill_attention(*args, max(q_lens), scales, sliding_window=window)
    ref = reference.prefill_attention(*args, max(q_lens), scales, sliding_window=window)
    assert_close(out, ref, f"prefill lens={lens} q_lens={q_lens} window={window} fp8={fp8}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 4, 32), (9, 3, 64), (8, 2, 128), (3, 1, 32)])
def test_prefill_attention_matches_the_reference(
    cpu_gen: torch.Generator, dtype: torch.dtype, hq: int, hkv: int, d: int
) -> None:
    # Whole prompts, prompt tails after a cached prefix, one-token and 5-token (verify) runs.
    lens, q_lens = [1, 17, 40, 100, 33, 64], [1, 17, 5, 37, 1, 16]
    _prefill_case(cpu_gen, lens, q_lens, hq, hkv, d, dtype)


@pytest.mark.parametrize("window", [1, 16, 37])
def test_prefill_attention_sliding_window(cpu_gen: torch.Generator, window: int) -> None:
    lens, q_lens = [window, window + 3, 90, 120, 64], [window, 3, 50, 5, 64]
    _prefill_case(cpu_gen, lens, q_lens, 6, 2, 32, torch.float32, window=window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_fp8_cache(cpu_gen: torch.Generator, dtype: torch.dtype) -> None:
    _prefill_case(cpu_gen, [20, 77], [20, 9], 6, 2, 64, dtype, fp8=True)


def test_prefill_attention_skips_an_empty_chunk(cpu_gen: torch.Generator) -> None:
    _prefill_case(cpu_gen, [30, 12, 45], [4, 0, 45], 4, 2, 32, torch.float32)


def test_decode_attention_gives_back_the_thread_count() -> None:
    """Decode attention runs on one thread and restores torch's thread count after a call and
    after one that fails (a page id past the pool)."""
    cache = torch.zeros(2, PAGE, 2, 32)
    q, seq_lens = torch.randn(1, 4, 32), torch.tensor([4])
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        table = torch.zeros(1, 1, dtype=torch.int32)
        out = cpu_ops.paged_decode_attention(q, cache, cache, table, seq_lens, 0.2)
        assert out.shape == q.shape and torch.get_num_threads() == 2
        with pytest.raises(IndexError):
            bad_table = torch.tensor([[7]])
            cpu_ops.paged_decode_attention(q, cache, cache, bad_table, seq_lens, 0.2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


# --- dispatch -------------------------------------------------------------------------------


def test_ops_send_cpu_ops_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ops` runs these for CPU tensors (after its checks), not the reference."""
    called: list[str] = []
    names = (
        "rms_norm",
        "swiglu",
        "rope_cache_write",
        "paged_decode_attention",
        "prefill_attention",
    )
    for name in names:

        def spy(*args: object, _name: str = name, **kwargs: object) -> object:
            called.append(_name)
            return getattr(reference, _name)(*args, **kwargs)

        monkeypatch.setattr(cpu_ops, name, spy)
    cos, sin = rope_tables.rope_tables(32, 64, 10000.0)
    q, k = torch.randn(1, 4, 32), torch.randn(1, 2, 32)
    cache = torch.zeros(2, PAGE, 2, 32)
    ops.rms_norm(torch.randn(1, 8), torch.randn(8), 1e-5)
    ops.swiglu(torch.randn(1, 8))
    ops.rope_cache_write(
        q, k, k, torch.tensor([3]), cos, sin, cache, cache.clone(), torch.tensor([3])
    )
    ops.paged_decode_attention(
        q, cache, cache, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([4]), 0.2
    )
    one = torch.tensor([0, 1], dtype=torch.int32)
    ops.prefill_attention(
        q, cache, cache, one, torch.tensor([4]), torch.zeros(1, 1, dtype=torch.int32), 0.2, 1
    )
    assert called == list(names)
