"""sv_kernels.ops: dispatch by device, input checks, lazy triton import, CUDA-graph capture."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from kernels_testing import PagedKV, assert_close, gpu_test, randn
from sv_kernels import KernelError, ops, reference, rope_tables

CPU = torch.device("cpu")


def test_cpu_tensors_run_the_reference_without_importing_triton() -> None:
    code = """
import sys
import torch

def triton_modules():
    return {m for m in sys.modules if m == "triton" or m.startswith("triton.")}

before = triton_modules()  # whatever torch itself may load
from sv_kernels import ops, reference
x = torch.randn(3, 8)
w = torch.randn(8)
out, s = ops.rms_norm(x, w, 1e-5, x)
ref, ref_s = reference.rms_norm(x, w, 1e-5, x)
assert torch.equal(out, ref) and torch.equal(s, ref_s)
logits = torch.randn(2, 10)
assert torch.equal(ops.argmax(logits), reference.argmax(logits))
added = sorted(triton_modules() - before)
assert not added, added
assert "sv_kernels.triton_ops" not in sys.modules
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": ""}  # the conftest's setting stays out of the child
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _rope_args() -> dict[str, Any]:
    cos, sin = rope_tables.rope_tables(32, 64, 10000.0)
    return {
        "q": torch.zeros(3, 4, 32),
        "k": torch.zeros(3, 2, 32),
        "v": torch.zeros(3, 2, 32),
        "positions": torch.arange(3),
        "cos": cos,
        "sin": sin,
        "k_cache": torch.zeros(4, 16, 2, 32),
        "v_cache": torch.zeros(4, 16, 2, 32),
        "slot_mapping": torch.arange(3),
    }


def _decode_args() -> dict[str, Any]:
    return {
        "q": torch.zeros(2, 4, 32),
        "k_cache": torch.zeros(4, 16, 2, 32),
        "v_cache": torch.zeros(4, 16, 2, 32),
        "block_tables": torch.zeros(2, 3, dtype=torch.int32),
        "seq_lens": torch.ones(2, dtype=torch.int32),
        "scale": 0.1,
    }


def _with(base: Callable[[], dict[str, Any]], **changes: Any) -> dict[str, Any]:
    return {**base(), **changes}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ops.embedding(torch.zeros(3), torch.zeros(5, 4)), "ids must be an integer"),
        (
            lambda: ops.embedding(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(5, 4)),
            "ids must be [T]",
        ),
        (lambda: ops.rms_norm(torch.zeros(2, 8), torch.zeros(7), 1e-5), "weight has 7"),
        (
            lambda: ops.rms_norm(torch.zeros(2, 8), torch.zeros(8), 1e-5, torch.zeros(2, 9)),
            "residual [2, 9] must have x's shape",
        ),
        (lambda: ops.swiglu(torch.zeros(2, 7)), "even last dim"),
        (
            lambda: ops.rope_cache_write(
                **_with(
                    _rope_args,
                    q=torch.zeros(3, 4, 31),
                    k=torch.zeros(3, 2, 31),
                    v=torch.zeros(3, 2, 31),
                    k_cache=torch.zeros(4, 16, 2, 31),
                    v_cache=torch.zeros(4, 16, 2, 31),
                )
            ),
            "head dim must be even",
        ),
        (lambda: ops.rope_cache_write(**_with(_rope_args, k=torch.zeros(2, 2, 32))), "disagree"),
        (
            lambda: ops.rope_cache_write(**_with(_rope_args, positions=torch.zeros(3))),
            "positions must be an integer",
        ),
        (
            lambda: ops.rope_cache_write(**_with(_rope_args, slot_mapping=torch.arange(4))),
            "slot_mapping has 4",
        ),
        (
            lambda: ops.rope_cache_write(
                **_with(_rope_args, k_cache=torch.zeros(4, 16, 2, 64)[..., ::2])
            ),
            "contiguous along its last dim",
        ),
        (
            lambda: ops.paged_decode_attention(**_with(_decode_args, q=torch.zeros(2, 3, 32))),
            "3 query heads are not a multiple of 2 KV heads",
        ),
        (
            lambda: ops.paged_decode_attention(
                **_with(_decode_args, q=torch.zeros(2, 4, 32, dtype=torch.bfloat16))
            ),
            "q is torch.bfloat16 but the cache is torch.float32",
        ),
        (
            lambda: ops.paged_decode_attention(
                **_with(_decode_args, block_tables=torch.zeros(3, 3, dtype=torch.int32))
            ),
            "block_tables has 3 along dim 0, expected 2",
        ),
        (
            lambda: ops.paged_decode_attention(
                **_with(_decode_args, v_cache=torch.zeros(4, 16, 2, 16))
            ),
            "v_cache [4, 16, 2, 16] torch.float32 must match",
        ),
        (
            lambda: ops.paged_decode_attention(
                **_with(_decode_args, seq_lens=torch.ones(2, device="meta", dtype=torch.int32))
            ),
            "all tensors must be on one device",
        ),
        (
            lambda: ops.prefill_attention(
                torch.zeros(3, 4, 32),
                torch.zeros(4, 16, 2, 32),
                torch.zeros(4, 16, 2, 32),
                torch.tensor([0, 3], dtype=torch.int32),
                torch.tensor([3, 3], dtype=torch.int32),
                torch.zeros(2, 1, dtype=torch.int32),
                0.1,
                3,
            ),
            "cu_seqlens_q has 2 along dim 0, expected 3",
        ),
        (
            lambda: ops.prefill_attention(
                torch.zeros(3, 4, 32),
                torch.zeros(4, 16, 2, 32),
                torch.zeros(4, 16, 2, 32),
                torch.tensor([0, 3], dtype=torch.int32),
                torch.tensor([3], dtype=torch.int32),
                torch.zeros(1, 1, dtype=torch.int32),
                0.1,
                torch.tensor(3),  # type: ignore[arg-type]
            ),
            "max_seqlen_q must be a host int",
        ),
        (lambda: ops.argmax(torch.zeros(2, 0)), "empty vocabulary"),
        (
            lambda: ops.sample(
                torch.zeros(2, 5),
                torch.ones(2),
                torch.zeros(2),
                torch.ones(2),
                torch.zeros(2, dtype=torch.int64),
                torch.zeros(2, dtype=torch.int64),
            ),
            "top_k must be an integer",
        ),
        (
            lambda: ops.sample(
                torch.zeros(2, 5),
                torch.ones(3),
                torch.zeros(2, dtype=torch.int32),
                torch.ones(2),
                torch.zeros(2, dtype=torch.int64),
                torch.zeros(2, dtype=torch.int64),
            ),
            "temperature has 3 along dim 0, expected 2",
        ),
    ],
)
def test_bad_inputs_raise_kernel_error_naming_the_problem(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(KernelError) as info:
        call()
    assert message in str(info.value)


def _mixed_step_attention(decode_tail: ops.DecodeTail) -> torch.Tensor:
    """A packed step of a 3-token prompt chunk and two decodes (contexts 5 and 9)."""
    cache = torch.zeros(4, 16, 2, 32)
    return ops.prefill_attention(
        torch.zeros(5, 4, 32),
        cache,
        cache,
        torch.tensor([0, 3, 4, 5], dtype=torch.int32),
        torch.tensor([3, 5, 9], dtype=torch.int32),
        torch.tensor([[0], [1], [2]], dtype=torch.int32),
        0.1,
        3,
        decode_tail=decode_tail,
    )


def test_a_decode_tail_must_be_the_batch_s_last_one_token_sequences() -> None:
    """On the CPU the tail's promise is checked against the batch (the CUDA path never reads
    device values): sequences that feed one token each, with their own lengths and pages."""
    lens, tables = torch.tensor([5, 9], dtype=torch.int32), torch.tensor([[1], [2]]).int()
    _mixed_step_attention(ops.DecodeTail(lens, tables))  # the true tail
    _mixed_step_attention(ops.DecodeTail(lens[1:], tables[1:]))  # a shorter one is one too
    cases = [
        (ops.DecodeTail(torch.tensor([3, 5, 9]).int(), torch.tensor([[0], [1], [2]]).int()),
         "must feed one token each, got [3, 1, 1]"),
        (ops.DecodeTail(torch.tensor([5, 8]).int(), tables), "must hold the seq_lens"),
        (ops.DecodeTail(lens, torch.tensor([[1], [3]]).int()), "must hold the seq_lens"),
        (ops.DecodeTail(torch.ones(4).int(), torch.zeros(4, 1).int()), "the batch has 3"),
        (ops.DecodeTail(lens, tables[:1]), "decode_tail.block_tables has 1 along dim 0"),
        (ops.DecodeTail(lens.float(), tables), "decode_tail.seq_lens must be an integer"),
    ]  # fmt: skip
    for tail, message in cases:
        with pytest.raises(KernelError, match="prefill_attention: ") as info:
            _mixed_step_attention(tail)
        assert message in str(info.value)


@gpu_test
def test_decode_step_ops_capture_in_a_cuda_graph(gen: torch.Generator) -> None:
    """rms_norm, rope_cache_write, decode attention, argmax and sample under graph capture.

    Capture proves the wrappers never sync with the host; replaying after changing the inputs in
    place (longer sequences, new positions and slots) proves nothing was baked in at capture.
    """
    batch, hq, hkv, d, hidden, vocab = 4, 8, 2, 64, 256, 1000
    dev = torch.device("cuda")
    # A wide block table (46 pages) makes decode attention use 3 context splits and the merge.
    kv = PagedKV.build(gen, [40, 17, 90, 1], hkv, d, torch.bfloat16, spare_table_width=40)
    cos, sin = rope_tables.rope_tables(d, 4096, 500000.0, device=dev)
    x = randn(gen, batch, hidden, dtype=torch.bfloat16)
    residual = randn(gen, batch, hidden, dtype=torch.bfloat16)
    w = randn(gen, hidden, dtype=torch.bfloat16)
    q = randn(gen, batch, hq, d, dtype=torch.bfloat16)
    k = randn(gen, batch, hkv, d, dtype=torch.bfloat16)
    v = randn(gen, batch, hkv, d, dtype=torch.bfloat16)
    logits = randn(gen, batch, vocab, dtype=torch.float32, scale=3.0)
    sampling = (
        torch.tensor([0.0, 0.7, 1.0, 1.2], device=dev),
        torch.tensor([0, 20, 0, 5], dtype=torch.int32, device=dev),
        torch.tensor([1.0, 0.9, 0.5, 1.0], device=dev),
        torch.tensor([1, 2, 3, 4], device=dev),
        torch.zeros(batch, dtype=torch.int64, device=dev),
    )
    # The new token of each sequence goes to the slot after its current last position.
    positions = kv.seq_lens.long().clone()
    page_size = kv.k_cache.shape[1]

    def slots_for(pos: torch.Tensor) -> torch.Tensor:
        pages = kv.block_tables.long().gather(1, (pos // page_size)[:, None])[:, 0]
        return pages * page_size + pos % page_size

    slot_mapping = slots_for(positions)
    seq_lens = kv.seq_lens.clone() + 1
    scale = 1 / math.sqrt(d)

    def step() -> tuple[torch.Tensor, ...]:
        normed, s = ops.rms_norm(x, w, 1e-5, residual)
        q_rot = ops.rope_cache_write(
            q, k, v, positions, cos, sin, kv.k_cache, kv.v_cache, slot_mapping
        )
        attn = ops.paged_decode_attention(
            q_rot, kv.k_cache, kv.v_cache, kv.block_tables, seq_lens, scale
        )
        return normed, s, attn, ops.argmax(logits), ops.sample(logits, *sampling)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()

    # New inputs, written in place: the sequences grow by 6 tokens and the noise step moves on.
    positions += 6
    slot_mapping.copy_(slots_for(positions))
    seq_lens += 6
    x.copy_(randn(gen, batch, hidden, dtype=torch.bfloat16))
    q.copy_(randn(gen, batch, hq, d, dtype=torch.bfloat16))
    sampling[4].fill_(9)
    # The 6 tokens between the old and new positions need K/V: fill them like the model would.
    for offset in range(1, 6):
        pos = positions - 6 + offset
        ref_slots = slots_for(pos)
        pages, offsets = ref_slots // page_size, ref_slots % page_size
        kv.k_cache[pages, offsets] = randn(gen, batch, hkv, d, dtype=torch.bfloat16)
        kv.v_cache[pages, offsets] = randn(gen, batch, hkv, d, dtype=torch.bfloat16)
    graph.replay()
    torch.cuda.synchronize()

    ref_k, ref_v = kv.k_cache.clone(), kv.v_cache.clone()
    ref_q = reference.rope_cache_write(q, k, v, positions, cos, sin, ref_k, ref_v, slot_mapping)
    expected = (
        *reference.rms_norm(x, w, 1e-5, residual),
        reference.paged_decode_attention(ref_q, ref_k, ref_v, kv.block_tables, seq_lens, scale),
    )
    for name, out, ref in zip(
        ("rms_norm", "residual sum", "attention"), outputs[:3], expected, strict=True
    ):
        assert_close(out, ref, f"graph replay: {name}")
    assert torch.equal(outputs[3], reference.argmax(logits))
    assert torch.equal(outputs[4], reference.sample(logits, *sampling))
