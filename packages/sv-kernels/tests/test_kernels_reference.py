"""The references themselves against independent oracles (the references are the spec the Triton
kernels are tested against, so they must be right first)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from kernels_testing import PagedKV, assert_close, randn
from sv_kernels import reference, rope_tables
from sv_kernels.rope_tables import Llama3RopeScaling

CPU = torch.device("cpu")


@pytest.fixture
def cpu_gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- rms_norm, swiglu ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_hf_llama_rms_norm(cpu_gen: torch.Generator, dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm  # slow import: only here

    hidden, eps = 96, 1e-5
    x = randn(cpu_gen, 7, hidden, dtype=dtype, scale=3.0)
    residual = randn(cpu_gen, 7, hidden, dtype=dtype)
    hf = LlamaRMSNorm(hidden, eps=eps).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(randn(cpu_gen, hidden, dtype=dtype))
        weight = hf.weight.detach().clone()

        out, s = reference.rms_norm(x, weight, eps)
        assert torch.equal(out, hf(x)) and torch.equal(s, x)

        # With the residual: HF Llama adds in the model dtype, then normalizes the sum.
        out, s = reference.rms_norm(x, weight, eps, residual)
        expected_sum = (x.float() + residual.float()).to(dtype)
        assert torch.equal(s, expected_sum)
        assert torch.equal(out, hf(expected_sum))


def test_rms_norm_matches_hand_formula_in_float64(cpu_gen: torch.Generator) -> None:
    x = randn(cpu_gen, 5, 64, dtype=torch.float32)
    w = randn(cpu_gen, 64, dtype=torch.float32)
    out, _ = reference.rms_norm(x, w, 1e-6)
    xd = x.double()
    expected = w.double() * xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-6)
    assert_close(out.double(), expected, "rms_norm vs float64 formula", tol=1e-6)


def test_swiglu_matches_hand_formula(cpu_gen: torch.Generator) -> None:
    gate_up = randn(cpu_gen, 3, 2 * 40, dtype=torch.float32, scale=4.0)
    gate, up = gate_up[:, :40].double(), gate_up[:, 40:].double()
    expected = gate / (1 + torch.exp(-gate)) * up
    assert_close(reference.swiglu(gate_up).double(), expected, "swiglu vs formula", tol=1e-6)


# --- RoPE ---------------------------------------------------------------------------------


def _hf_llama3_rotary(head_dim: int) -> torch.nn.Module:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_matches_hf_llama3_rotary_past_8192(cpu_gen: torch.Generator, head_dim: int) -> None:
    scaling = Llama3RopeScaling(32.0, 1.0, 4.0, 8192)
    hf = _hf_llama3_rotary(head_dim)
    assert torch.allclose(rope_tables.rope_inv_freq(head_dim, 500000.0, scaling), hf.inv_freq)

    positions = torch.tensor([0, 1, 8191, 8192, 9000, 20000, 65535, 131071])
    cos, sin = rope_tables.rope_tables(head_dim, 131072, 500000.0, scaling)
    q = randn(cpu_gen, len(positions), 4, head_dim, dtype=torch.float32)
    k = randn(cpu_gen, len(positions), 2, head_dim, dtype=torch.float32)

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    hf_cos, hf_sin = hf(q, positions[None, :])  # [1, T, D]
    # HF layout: [batch, heads, T, D]
    hf_q, hf_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin
    )
    ours_q = reference.apply_rope(q, positions, cos, sin)
    ours_k = reference.apply_rope(k, positions, cos, sin)
    assert_close(ours_q, hf_q[0].transpose(0, 1).contiguous(), "rope q vs HF", tol=1e-6)
    assert_close(ours_k, hf_k[0].transpose(0, 1).contiguous(), "rope k vs HF", tol=1e-6)


def test_rope_cache_write_reference_writes_only_its_slots(cpu_gen: torch.Generator) -> None:
    tokens, hq, hkv, d, pages, page = 5, 4, 2, 32, 6, 16
    cos, sin = rope_tables.rope_tables(d, 64, 10000.0)
    q = randn(cpu_gen, tokens, hq, d, dtype=torch.float32)
    k = randn(cpu_gen, tokens, hkv, d, dtype=torch.float32)
    v = randn(cpu_gen, tokens, hkv, d, dtype=torch.float32)
    positions = torch.tensor([3, 9, 0, 40, 63])
    slots = torch.tensor([17, -1, 0, 95, 50])
    k_cache = torch.full((pages, page, hkv, d), float("nan"))
    v_cache = torch.full((pages, page, hkv, d), float("nan"))
    q_rot = reference.rope_cache_write(q, k, v, positions, cos, sin, k_cache, v_cache, slots)
    assert torch.equal(q_rot, reference.apply_rope(q, positions, cos, sin))
    k_rot = reference.apply_rope(k, positions, cos, sin)
    flat_k, flat_v = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat_k[slot], k_rot[t]) and torch.equal(flat_v[slot], v[t])
    untouched = torch.ones(pages * page, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


def test_kv_pages_by_head_store_each_heads_page_as_one_run() -> None:
    """Indexed [layers, P, S, Hkv, D]; by head, (layer l, page p, KV head h)'s S x D values sit
    at element offset ((l * P + p) * Hkv + h) * S * D, one contiguous run (computed by hand)."""
    layers, pages, page, hkv, d = 2, 5, 16, 3, 8
    cache = reference.kv_pages((layers,), pages, page, hkv, d, torch.bfloat16, "cpu", True)
    assert cache.shape == (layers, pages, page, hkv, d)
    assert not cache.any()
    for layer, p, h in ((0, 0, 0), (1, 3, 2), (0, 4, 1)):
        run = cache[layer, p, :, h]
        assert run.is_contiguous()
        assert run.storage_offset() == ((layer * pages + p) * hkv + h) * page * d
    cache[1, 3, 5, 2, 7] = 1.0  # slot 5 of that run, element 7
    flat = cache.transpose(-3, -2).contiguous().view(-1)  # the storage order
    assert flat.nonzero().item() == ((1 * pages + 3) * hkv + 2) * page * d + 5 * d + 7


def test_kv_pages_on_the_cpu_are_plain_and_zeroed() -> None:
    """The CPU's pool (the default off CUDA) is a plain contiguous [layers, P, S, Hkv, D]."""
    cache = reference.kv_pages((2,), 5, 16, 3, 8, torch.float32, "cpu")
    assert cache.shape == (2, 5, 16, 3, 8) and cache.is_contiguous() and not cache.any()


# --- attention ----------------------------------------------------------------------------


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, q_start: int
) -> torch.Tensor:
    """torch's attention on contiguous K/V: q [Tq, Hq, D] at positions q_start.., k/v [Tk, Hkv, D]."""
    q_pos = torch.arange(q.shape[0])[:, None] + q_start
    visible = torch.arange(k.shape[0])[None, :] <= q_pos
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).double(),
        k.transpose(0, 1).double(),
        v.transpose(0, 1).double(),
        attn_mask=visible,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (6, 2), (8, 2)])
def test_decode_reference_matches_sdpa(cpu_gen: torch.Generator, hq: int, hkv: int) -> None:
    lens = [1, 17, 50]
    kv = PagedKV.build(cpu_gen, lens, hkv, 32, torch.float32)
    q = randn(cpu_gen, len(lens), hq, 32, dtype=torch.float32)
    out = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.2
    )
    for b, n in enumerate(lens):
        k, v = kv.contiguous(b)
        expected = _sdpa(q[b : b + 1], k, v, 0.2, q_start=n - 1)[0]
        assert_close(out[b].double(), expected, f"decode reference, sequence {b}", tol=1e-6)


def test_prefill_reference_matches_sdpa_with_cached_prefix(cpu_gen: torch.Generator) -> None:
    q_lens, seq_lens = [3, 20, 1], [3, 45, 30]  # sequences 1 and 2 have a cached prefix
    kv = PagedKV.build(cpu_gen, seq_lens, 2, 32, torch.float32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(cpu_gen, sum(q_lens), 6, 32, dtype=torch.float32)
    out = reference.prefill_attention(
        q, kv.k_cache, kv.v_cache, cu, kv.seq_lens, kv.block_tables, 0.3, max(q_lens)
    )
    for b in range(len(q_lens)):
        k, v = kv.contiguous(b)
        lo, hi = int(cu[b]), int(cu[b + 1])
        expected = _sdpa(q[lo:hi], k, v, 0.3, q_start=seq_lens[b] - q_lens[b])
        assert_close(out[lo:hi].double(), expected, f"prefill reference, sequence {b}", tol=1e-6)


# --- sampling -----------------------------------------------------------------------------


def _lowbias32(x: int) -> int:
    """The hash in plain Python integers (an oracle for the tensor version)."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def test_uniform_noise_is_the_documented_hash() -> None:
    seeds = torch.tensor([0, 12345, -7, 2**40 + 3])
    steps = torch.tensor([0, 5, 99, 2**33])
    u = reference.uniform_noise(seeds, steps, 50)
    for b in range(4):
        h = _lowbias32(_lowbias32(int(seeds[b]) & 0xFFFFFFFF) ^ (int(steps[b]) & 0xFFFFFFFF))
        for col in (0, 1, 49):
            expected = ((_lowbias32(h ^ col) >> 9) + 0.5) / 2**23
            assert float(u[b, col]) == expected
    assert bool(((u > 0) & (u < 1)).all())


def _unhash32(x: int) -> int:
    """The inverse of `_lowbias32` (each of its steps is a bijection on 32-bit integers)."""
    x ^= x >> 16
    x = (x * pow(0x846CA68B, -1, 2**32)) & 0xFFFFFFFF
    x ^= (x >> 15) ^ (x >> 30)
    x = (x * pow(0x7FEB352D, -1, 2**32)) & 0xFFFFFFFF
    x ^= x >> 16
    return x


@pytest.mark.parametrize("target", [0xFFFFFFFF, 0x00000000])
def test_uniform_noise_stays_inside_0_1_at_the_extreme_hashes(target: int) -> None:
    """Pick the step so that column 0 hashes to the largest / smallest 32-bit value."""
    assert _lowbias32(_unhash32(target)) == target
    seed = 0
    step = _unhash32(_unhash32(target)) ^ _lowbias32(seed)
    u = reference.uniform_noise(torch.tensor([seed]), torch.tensor([step]), 1)
    assert 0.0 < float(u[0, 0]) < 1.0
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def _softmax64(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.double(), dim=-1)


def _support(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The columns that may be sampled, from the definitions (float64, sorted)."""
    x = logits.double() / temperature
    order = torch.argsort(x, descending=True)
    keep = torch.zeros_like(x, dtype=torch.bool)
    k = top_k if top_k > 0 else x.numel()
    kept = order[:k]
    probs = _softmax64(x[kept])
    mass_before = torch.cumsum(probs, 0) - probs
    kept = kept[mass_before < top_p] if top_p < 1 else kept
    keep[kept] = True
    return keep


def _sample_many(
    logits: torch.Tensor, n: int, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """n draws for one row (seeds 0..n-1, step 3), in one batched call."""
    return reference.sample(
        logits.expand(n, -1),
        torch.full((n,), temperature),
        torch.full((n,), top_k, dtype=torch.int32),
        torch.full((n,), top_p),
        torch.arange(n, dtype=torch.int64),
        torch.full((n,), 3, dtype=torch.int64),
    )


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.8), (0.9, 4, 0.9)],
)
def test_reference_sampler_frequencies_follow_the_filtered_softmax(
    cpu_gen: torch.Generator, temperature: float, top_k: int, top_p: float
) -> None:
    """Counts over many seeds against the renormalized softmax on the support: a chi-square bound."""
    logits = randn(cpu_gen, 6, dtype=torch.float32, scale=1.5)
    n = 20000
    ids = _sample_many(logits, n, temperature, top_k, top_p)
    support = _support(logits, temperature, top_k, top_p)
    assert support[ids].all(), "a sample fell outside the top-k / top-p support"
    probs = torch.where(support, _softmax64(logits.double() / temperature), 0.0)
    probs = probs / probs.sum()
    counts = torch.bincount(ids, minlength=6).double()
    expected = probs * n
    on = expected > 0
    chi2 = float((((counts - expected) ** 2)[on] / expected[on]).sum())
    dof = int(on.sum()) - 1
    # Far tail of chi-square(dof) (mean dof, sd sqrt(2 dof)): a false alarm is ~1e-6 likely.
    assert chi2 < dof + 10 * math.sqrt(2 * max(dof, 1)) + 10, f"chi2={chi2:.1f} for {dof} dof"


def test_reference_sampler_edge_rules(cpu_gen: torch.Generator) -> None:
    logits = randn(cpu_gen, 4, 300, dtype=torch.float32, scale=2.0)
    n = logits.shape[0]
    seeds = torch.arange(n, dtype=torch.int64) * 7919
    steps = torch.zeros(n, dtype=torch.int64)
    greedy = reference.argmax(logits)

    def draw(temperature: float, top_k: int, top_p: float) -> torch.Tensor:
        return reference.sample(
            logits,
            torch.full((n,), temperature),
            torch.full((n,), top_k, dtype=torch.int32),
            torch.full((n,), top_p),
            seeds,
            steps,
        )

    assert torch.equal(draw(0.0, 0, 1.0), greedy), "temperature 0 is greedy"
    assert torch.equal(draw(0.8, 1, 1.0), greedy), "top-k 1 is greedy"
    assert torch.equal(draw(1.2, 0, 0.0), greedy), "top-p 0 keeps only the largest logit"
    assert torch.equal(draw(0.8, 0, 1.0), draw(0.8, 10_000, 1.0)), "top-k above V is off"
    assert torch.equal(draw(0.8, 0, 1.0), draw(0.8, -3, 1.0)), "negative top-k is off"
    # Without filters a draw is the Gumbel-max of the documented noise (the hash is checked
    # against hand values above): argmax(logits / T - log(-log u)), here at T = 1.3.
    u0 = reference.uniform_noise(seeds, steps, 300)
    u1 = reference.uniform_noise(seeds, steps + 1, 300)
    assert not torch.equal(u0, u1), "the noise depends on the step"
    gumbel_max = torch.argmax(logits.double() / 1.3 - torch.log(-torch.log(u0.double())), dim=-1)
    assert torch.equal(draw(1.3, 0, 1.0), gumbel_max)


def test_reference_sampler_far_from_zero_and_at_a_tiny_temperature(
    cpu_gen: torch.Generator,
) -> None:
    """Logits where FP32 cannot hold the noise beside them still sample by the softmax's limit.

    Eight logits raised by 1e30 (a huge logit_bias) round to one value: the softmax of what FP32
    holds is uniform over them, so every one must come up about equally often, not the lowest
    column each time. And at T = 1e-38, logits / T overflow: the draw is the softmax's limit, the
    largest logit, not the lowest column among the overflowed."""
    tied = torch.cat([torch.full((8,), 1e30), torch.tensor([0.0, -5.0, 1e29])])
    assert bool((tied[:8] + 3.0 == tied[:8]).all()), "the noise must not fit beside 1e30"
    n = 8000
    counts = torch.bincount(_sample_many(tied, n, 1.0, 0, 1.0), minlength=11).double()
    assert float(counts[8:].sum()) == 0.0, "a token 1e29 or more below the top was drawn"
    expected = n / 8
    chi2 = float(((counts[:8] - expected) ** 2 / expected).sum())
    assert chi2 < 7 + 10 * math.sqrt(14) + 10, f"chi2={chi2:.1f} for 7 dof: {counts[:8].tolist()}"

    # (4 or more: FP32 holds 3.4 / 1e-38, so a logit below that would not overflow)
    logits = randn(cpu_gen, 300, dtype=torch.float32, scale=2.0).abs() + 4.0
    assert bool(torch.isinf(logits / 1e-38).all()), "every logit must overflow at T = 1e-38"
    for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.9)):
        ids = _sample_many(logits, 50, 1e-38, top_k, top_p)
        assert bool((ids == int(torch.argmax(logits))).all()), (top_k, top_p)
