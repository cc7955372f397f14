"""The memory the packed weights keep alive, counted by torch's own storages, and the logits of
the model on them against transformers' (the oracle) on the same checkpoint.

The copying load (a GPU's; the CPU's with copy=True, which these tests use to run it in CI)
must leave the weights holding their own bytes and no more: before it, packing q/k/v and
gate/up made new tensors while the other weights stayed views of the whole loaded buffer. The
CPU's default mapped load is meant to keep unpacked weights as views of the mapped file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import transformers
from sv_model import ModelRunner, ModelWeights, StepInputs
from sv_weights import ModelConfig, load_checkpoint
from torch import Tensor


def weight_tensors(weights: ModelWeights) -> list[Tensor]:
    """Every tensor the model uses, each once (a tied LM head is the embedding tensor)."""
    found = [weights.embed, weights.final_norm, weights.lm_head]
    for layer in weights.layers:
        found += [layer.input_norm, layer.qkv, layer.o, layer.post_attention_norm]
        found += [layer.gate_up, layer.down]
    return list({id(t): t for t in found}.values())


def distinct_storage_bytes(tensors: list[Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def load(model_dir: Path, copy: bool) -> tuple[ModelConfig, ModelWeights]:
    config = ModelConfig.from_model_dir(model_dir)
    state = load_checkpoint(model_dir, copy=copy)
    return config, ModelWeights.from_state_dict(config, state, "cpu", torch.float32)


@pytest.mark.parametrize("fixture", ["tiny_dir", "untied_dir"])
def test_copied_load_keeps_only_the_packed_weights(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """After the copying load and packing, the distinct storages the weights view hold at most
    2% more than the weights' own bytes (alignment padding), and the packed matrices are views
    of the loaded allocation, not copies; the methods `sv bench` reports agree."""
    model_dir: Path = request.getfixturevalue(fixture)
    _, weights = load(model_dir, copy=True)
    tensors = weight_tensors(weights)
    own = sum(t.nbytes for t in tensors)
    assert distinct_storage_bytes(tensors) <= 1.02 * own
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert weights.weight_bytes() == own
    assert weights.storage_bytes() == distinct_storage_bytes(tensors)


def test_mapped_cpu_load_keeps_unpacked_weights_as_views_of_the_file(tiny_dir: Path) -> None:
    """The default CPU load of a float32 file: unpacked weights are views of the one mapped
    file (its storage is the whole file). Files sort tensors by name, so gate, up lie end to
    end there and gate_up is a view too; q, k, v do not (k, o, q, v), and qkv is a copy."""
    _, weights = load(tiny_dir, copy=False)
    file_size = os.path.getsize(tiny_dir / "model.safetensors")
    layer = weights.layers[0]
    mapped = [weights.embed, weights.final_norm, layer.o, layer.down, layer.input_norm]
    for tensor in [*mapped, layer.gate_up]:
        assert tensor.untyped_storage().nbytes() == file_size
        assert tensor.untyped_storage().data_ptr() == weights.embed.untyped_storage().data_ptr()
    assert layer.qkv.untyped_storage().nbytes() == layer.qkv.nbytes


@pytest.mark.parametrize("fixture", ["tiny_dir", "untied_dir"])
def test_copied_load_gives_transformers_logits(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """The model on the copied, view-packed weights: teacher-forced logits at every position
    within 1e-4 of transformers' on the same checkpoint, and bit-equal to the mapped load's."""
    model_dir: Path = request.getfixturevalue(fixture)
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    step = StepInputs(ids, list(range(len(ids))), [0], [len(ids)], [len(ids)], [0])
    logits = []
    for copy in (True, False):
        config, weights = load(model_dir, copy=copy)
        runner = ModelRunner(config, weights, num_pages=16)
        runner.set_block_tables([(0, list(range(3)))])
        logits.append(runner.logits(step, every_token=True))
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
    assert float((logits[0] - want).norm() / want.norm()) < 1e-4
    assert torch.equal(logits[0], logits[1])
