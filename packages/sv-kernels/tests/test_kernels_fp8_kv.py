"""The FP8 (e4m3) KV cache: the reference's quantization against hand-computed values, its
attention against plain attention over the dequantized cache, and the Triton kernels (RoPE +
cache write, decode and prefill attention) against the reference on the same FP8 pages."""

from __future__ import annotations

import math

import pytest
import torch
from kernels_testing import DEVICE, PagedKV, assert_close, gpu_test, randint, randn
from sv_kernels import ops, reference, rope_tables, triton_ops
from sv_kernels.errors import KernelError
from sv_kernels.reference import kv_pages
from sv_kernels.rope_tables import Llama3RopeScaling

FP8 = torch.float8_e4m3fn
LLAMA3 = Llama3RopeScaling(32.0, 1.0, 4.0, 8192)


def random_scales(gen: torch.Generator, hkv: int) -> torch.Tensor:
    """[2, Hkv] FP32 scales between 1/64 and 1/16: values of order 1 then use e4m3's range."""
    return (2.0 ** -randint(gen, 4, 7, 2, hkv).float()).contiguous()


def fp8_paged_kv(
    gen: torch.Generator, lens: list[int], hkv: int, head_dim: int, scales: torch.Tensor
) -> PagedKV:
    """PagedKV's layout (shuffled pages, NaN in every slot no sequence owns), stored as e4m3."""
    return PagedKV.build(gen, lens, hkv, head_dim, torch.float32).quantized(scales)


def test_quantize_kv_rounds_to_e4m3_and_saturates() -> None:
    # e4m3 near 0.2 holds 0.1875 and 0.203125 (3 mantissa bits); the largest finite is 448.
    x = torch.tensor([[[0.1, 1.0, 1000.0, -1000.0, 0.0, 3.0]]])
    stored = reference.quantize_kv(x, torch.tensor([0.5]))
    assert stored.dtype == FP8
    assert stored.float().tolist() == [[[0.203125, 2.0, 448.0, -448.0, 0.0, 6.0]]]


def test_reference_attention_reads_the_fp8_cache_times_its_scales(gen: torch.Generator) -> None:
    """Oracle: plain softmax attention over K and V dequantized by hand (no paging)."""
    hq, hkv, head_dim, lens = 4, 2, 32, [7, 40]
    scales = random_scales(gen, hkv)
    kv = fp8_paged_kv(gen, lens, hkv, head_dim, scales)
    q = randn(gen, len(lens), hq, head_dim, dtype=torch.float32)
    scale = 1 / math.sqrt(head_dim)
    out = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale, scales
    )
    for b in range(len(lens)):
        k8, v8 = kv.contiguous(b)
        k = k8.float() * scales[0][None, :, None]
        v = v8.float() * scales[1][None, :, None]
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        probs = torch.softmax(torch.einsum("hd,khd->hk", q[b], k) * scale, dim=-1)
        expected = torch.einsum("hk,khd->hd", probs, v)
        assert torch.allclose(out[b], expected, atol=1e-5, rtol=1e-5)


def _rope_fp8_case(
    gen: torch.Generator, tokens: int, hq: int, hkv: int, head_dim: int, dtype: torch.dtype
) -> None:
    page_size, num_pages = 16, max(4, 2 * tokens // 16 + 2)
    cos, sin = rope_tables.rope_tables(head_dim, 4096, 500000.0, LLAMA3, device=DEVICE)
    qkv = randn(gen, tokens, hq + 2 * hkv, head_dim, dtype=dtype, scale=4.0)
    qkv[0, hq, 0] = 1e4  # saturates in the cache instead of becoming NaN
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    positions = randint(gen, 0, 4096, tokens)
    slots = torch.randperm(num_pages * page_size, generator=gen, device=DEVICE)[:tokens]
    slots[1::5] = -1  # padding tokens: not written
    scales = random_scales(gen, hkv)
    shape = (num_pages, page_size, hkv, head_dim)
    # The kernel writes a GPU pool's layout (by head), the reference a plain contiguous cache.
    ref_k = torch.full(shape, float("nan"), device=DEVICE).to(FP8)
    ref_v = ref_k.clone()
    k_cache = kv_pages((), *shape, FP8, DEVICE, by_head=True).copy_(ref_k)
    v_cache = kv_pages((), *shape, FP8, DEVICE, by_head=True).copy_(ref_v)
    q_rot = triton_ops.rope_cache_write(
        q, k, v, positions, cos, sin, k_cache, v_cache, slots, scales
    )
    ref_q = reference.rope_cache_write(q, k, v, positions, cos, sin, ref_k, ref_v, slots, scales)
    assert_close(q_rot, ref_q, "rotated q")
    written = torch.zeros(num_pages * page_size, dtype=torch.bool, device=DEVICE)
    written[slots[slots >= 0]] = True
    for name, cache, ref in (("k", k_cache, ref_k), ("v", v_cache, ref_v)):
        flat, ref_flat = cache.reshape(-1, hkv, head_dim), ref.view(-1, hkv, head_dim)
        assert flat[~written].float().isnan().all(), f"{name}: a slot outside slot_mapping changed"
        got, want = flat[written].float(), ref_flat[written].float()
        assert not got.isnan().any(), f"{name}: NaN written (no saturation?)"
        # The same e4m3 value, but for a rare tie broken the other way by the FP32 division:
        # then one e4m3 step (1/8 relative) apart.
        differ = got != want
        assert differ.float().mean() < 0.01, f"{name}: {int(differ.sum())} values differ"
        assert ((got - want).abs() <= want.abs() / 8 + 2.0**-9)[differ].all()
    assert float(k_cache.reshape(-1, hkv, head_dim)[slots[0], 0, 0].float()) in (448.0, -448.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "hq", "hkv", "head_dim"), [(9, 6, 2, 64), (5, 4, 4, 32)])
def test_rope_cache_write_fp8(
    gen: torch.Generator, dtype: torch.dtype, tokens: int, hq: int, hkv: int, head_dim: int
) -> None:
    _rope_fp8_case(gen, tokens, hq, hkv, head_dim, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv", "head_dim"), [(6, 2, 64), (4, 4, 32)])
def test_decode_attention_fp8(
    gen: torch.Generator, dtype: torch.dtype, hq: int, hkv: int, head_dim: int
) -> None:
    lens = [1, 32, 77]
    scales = random_scales(gen, hkv)
    kv = fp8_paged_kv(gen, lens, hkv, head_dim, scales)
    q = randn(gen, len(lens), hq, head_dim, dtype=dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 1 / math.sqrt(head_dim))
    ref = reference.paged_decode_attention(*args, scales)
    for num_splits in (1, 3):
        out = triton_ops.paged_decode_attention(*args, scales, num_splits=num_splits)
        assert_close(out, ref, f"fp8 decode, num_splits={num_splits}")


@gpu_test
@pytest.mark.parametrize(
    ("batch", "context"), [(256, 1024), (48, 1024), (32, 2048), (4, 16384), (1, 32768)]
)
def test_decode_attention_fp8_serving_shapes(
    gen: torch.Generator, batch: int, context: int
) -> None:
    """Llama 3.2 1B's heads at the batches whose default launch shapes differ (unsplit: one
    warp, two; split: four warps and five stages, two and five, four and three), each against
    the reference on the same FP8 pages."""
    hq, hkv, head_dim = 32, 8, 64
    lens = [context, *randint(gen, context // 2, context, batch - 1).tolist()]
    scales = random_scales(gen, hkv)
    kv = fp8_paged_kv(gen, lens, hkv, head_dim, scales)
    q = randn(gen, batch, hq, head_dim, dtype=torch.bfloat16)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 1 / math.sqrt(head_dim))
    ref = reference.paged_decode_attention(*args, scales)
    out = triton_ops.paged_decode_attention(*args, scales)
    assert_close(out, ref, f"fp8 decode, {batch} x {context}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_fp8(gen: torch.Generator, dtype: torch.dtype) -> None:
    hq, hkv, head_dim, q_lens, prefixes = 6, 2, 64, [5, 40], [0, 19]
    scales = random_scales(gen, hkv)
    kv = fp8_paged_kv(gen, [q + p for q, p in zip(q_lens, prefixes, strict=True)], hkv, 64, scales)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=DEVICE)
    q = randn(gen, sum(q_lens), hq, head_dim, dtype=dtype)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.seq_lens, kv.block_tables, 0.125, max(q_lens))
    ref = reference.prefill_attention(*args, scales)
    out = triton_ops.prefill_attention(*args, scales, tile_m=16, tile_n=16)
    assert_close(out, ref, "fp8 prefill")


def test_ops_refuse_mismatched_scales() -> None:
    q = torch.zeros(1, 4, 32)
    cache = torch.zeros(2, 16, 2, 32).to(FP8)
    tables, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(KernelError, match="needs kv_scales"):
        ops.paged_decode_attention(q, cache, cache, tables, lens, 0.1)
    with pytest.raises(KernelError, match=r"kv_scales must be float32 \[2, 2\]"):
        ops.paged_decode_attention(q, cache, cache, tables, lens, 0.1, torch.ones(2, 3))
    with pytest.raises(KernelError, match="kv_scales are for an FP8 cache"):
        plain = torch.zeros(2, 16, 2, 32)
        ops.paged_decode_attention(q, plain, plain, tables, lens, 0.1, torch.ones(2, 2))


@gpu_test
def test_fp8_kernels_at_serving_shapes(gen: torch.Generator) -> None:
    _rope_fp8_case(gen, 2048, 32, 8, 64, torch.bfloat16)
    scales = random_scales(gen, 8)
    lens = [int(n) for n in randint(gen, 1, 4000, 16).tolist()]
    kv = fp8_paged_kv(gen, lens, 8, 64, scales)
    q = randn(gen, len(lens), 32, 64, dtype=torch.bfloat16)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.125)
    assert_close(
        triton_ops.paged_decode_attention(*args, scales),
        reference.paged_decode_attention(*args, scales),
        "fp8 decode at serving shapes",
    )
