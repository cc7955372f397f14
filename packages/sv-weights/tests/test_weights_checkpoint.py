"""Checkpoint folders: expected tensors, validation, sharding, random checkpoints.

Oracles: transformers' LlamaForCausalLM (its parameter names and shapes, and its loading of our
folders), the `safetensors` package, and the published parameter count of Llama 3.2 1B.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers
from sv_weights import (
    ModelConfig,
    WeightsError,
    expected_tensors,
    llama_3_2_1b_config,
    load_checkpoint,
    read_header,
    save_file,
    tiny_llama_config,
    validate_checkpoint,
    write_random_checkpoint,
)
from sv_weights.checkpoint import INDEX_FILE, read_checkpoint_headers
from sv_weights.device_load import FileSpan
from sv_weights.safetensors import TensorInfo
from sv_weights.synthetic import random_weights


def test_llama_3_2_1b_has_its_published_parameter_count() -> None:
    shapes = expected_tensors(llama_3_2_1b_config())
    assert len(shapes) == 16 * 9 + 2  # 9 tensors per layer, embedding, final norm; lm_head tied
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 1_235_814_400
    assert shapes["model.layers.15.self_attn.k_proj.weight"] == (512, 2048)
    assert "lm_head.weight" not in shapes


@pytest.mark.parametrize(
    "config",
    [
        llama_3_2_1b_config(),
        tiny_llama_config(),
        tiny_llama_config(tie_word_embeddings=False, num_hidden_layers=3, head_dim=32),
    ],
)
def test_expected_tensors_match_transformers_parameters(
    config: ModelConfig, tmp_path: Path
) -> None:
    config.write_json(tmp_path / "config.json")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(tmp_path))
    theirs = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    if config.tie_word_embeddings:
        theirs.pop("lm_head.weight")  # the same tensor as the embedding
    assert expected_tensors(config) == theirs


@pytest.mark.parametrize("tie", [True, False])
def test_random_checkpoint_loads_in_transformers_with_the_same_tensors(
    tmp_path: Path, tie: bool
) -> None:
    config = tiny_llama_config(tie_word_embeddings=tie)
    write_random_checkpoint(tmp_path, config, seed=3)
    ours = load_checkpoint(tmp_path)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    theirs = model.state_dict()
    if tie:
        assert theirs["lm_head.weight"].data_ptr() == theirs["model.embed_tokens.weight"].data_ptr()
        theirs.pop("lm_head.weight")
    assert sorted(ours) == sorted(theirs)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, theirs[name]), name
    with torch.no_grad():
        logits = model(torch.tensor([[1, 17, 300, 42, 7]])).logits.float()
    assert torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0.05  # not degenerate: the tokens are told apart
    assert not torch.allclose(logits[0, 0], logits[0, -1])


def test_random_checkpoint_is_seeded_and_well_scaled(tmp_path: Path) -> None:
    config = tiny_llama_config()
    a = write_random_checkpoint(tmp_path / "a", config, seed=0)
    b = write_random_checkpoint(tmp_path / "b", config, seed=0)
    c = write_random_checkpoint(tmp_path / "c", config, seed=1)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    weights = load_checkpoint(a, dtype=torch.float32)
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert 0.015 < q.std().item() < 0.025 and abs(q.mean().item()) < 0.005
    norm = weights["model.norm.weight"]
    assert 0.9 < norm.mean().item() < 1.1 and norm.std().item() > 0.0
    assert json.loads((a / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_random_checkpoint_in_float32(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path, tiny_llama_config(), dtype=torch.float32)
    assert ModelConfig.from_model_dir(tmp_path).torch_dtype == "float32"
    assert {
        info.dtype for info in read_header(tmp_path / "model.safetensors").tensors.values()
    } == {"F32"}


def test_load_agrees_with_safetensors_oracle_and_converts_dtype(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path, tiny_llama_config())
    oracle = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    converted = load_checkpoint(tmp_path, dtype=torch.float32)
    assert sorted(converted) == sorted(oracle)
    for name, tensor in converted.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, oracle[name].float())
    with pytest.raises(WeightsError, match="non-float dtype"):
        load_checkpoint(tmp_path, dtype=torch.int32)


# ------------------------------------------------------------------------------------------
# validate_checkpoint
# ------------------------------------------------------------------------------------------


def infos_for(config: ModelConfig, dtype: str = "BF16") -> dict[str, TensorInfo]:
    return {
        name: TensorInfo(name, dtype, shape, 0, 0)
        for name, shape in expected_tensors(config).items()
    }


def test_validate_accepts_exact_checkpoint() -> None:
    config = tiny_llama_config()
    validate_checkpoint(config, infos_for(config), "x")
    validate_checkpoint(config, infos_for(config, "F32"), "x")


def test_validate_names_missing_unexpected_wrong_shape_and_dtype() -> None:
    config = tiny_llama_config()
    infos = infos_for(config)
    del infos["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        WeightsError,
        match=r"^ckpt: 1 tensor\(s\) the config needs are missing, e.g. 'model.layers.1.mlp.up_proj.weight'",
    ):
        validate_checkpoint(config, infos, "ckpt")

    infos = infos_for(config)
    infos["model.layers.2.input_layernorm.weight"] = TensorInfo("x", "BF16", (64,), 0, 0)
    with pytest.raises(
        WeightsError,
        match=r"not in a llama checkpoint of this config, e.g. 'model.layers.2.input_layernorm.weight' \(config: 2 layers\)",
    ):
        validate_checkpoint(config, infos, "ckpt")

    infos = infos_for(config)
    infos["model.layers.0.self_attn.k_proj.weight"] = TensorInfo("k", "BF16", (64, 64), 0, 0)
    with pytest.raises(
        WeightsError,
        match=r"'model.layers.0.self_attn.k_proj.weight' has shape \[64, 64\], expected \[32, 64\]",
    ):
        validate_checkpoint(config, infos, "ckpt")

    with pytest.raises(
        WeightsError, match=r"'model.embed_tokens.weight' has dtype I32, expected a float dtype"
    ):
        validate_checkpoint(config, infos_for(config, "I32"), "ckpt")

    untied = tiny_llama_config(tie_word_embeddings=False)
    with pytest.raises(WeightsError, match=r"'lm_head\.weight'"):
        validate_checkpoint(untied, infos_for(config), "ckpt")


@pytest.mark.parametrize("copy", [False, True])
def test_tied_checkpoint_with_an_lm_head(tmp_path: Path, copy: bool) -> None:
    """Accepted when it holds the embedding's values (in any float dtype), and dropped on
    load: the embedding is the output layer."""
    config = tiny_llama_config()
    weights = random_weights(config)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].float()
    config.write_json(tmp_path / "config.json")
    save_file(weights, tmp_path / "model.safetensors")
    loaded = load_checkpoint(tmp_path, copy=copy)
    assert "lm_head.weight" not in loaded and len(loaded) == len(expected_tensors(config))

    weights["lm_head.weight"] = torch.zeros(3, config.hidden_size, dtype=torch.bfloat16)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(
        WeightsError, match=r"'lm_head.weight' has shape \[3, 64\], expected \[512, 64\]"
    ):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("copy", [False, True])
def test_old_checkpoint_rope_buffers_are_ignored_like_transformers(
    tmp_path: Path, copy: bool
) -> None:
    """transformers before 4.31 saved each layer's `rotary_emb.inv_freq` (Llama 2 and its
    fine-tunes hold them): transformers loads such a file ignoring them, and so must we."""
    config = tiny_llama_config(tie_word_embeddings=False)
    weights = random_weights(config, dtype=torch.float32)
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2) / config.head_dim)
    for layer in range(config.num_hidden_layers):
        weights[f"model.layers.{layer}.self_attn.rotary_emb.inv_freq"] = inv_freq
    config.write_json(tmp_path / "config.json")
    save_file(weights, tmp_path / "model.safetensors")
    ours = load_checkpoint(tmp_path, copy=copy)
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert sorted(ours) == sorted(theirs.state_dict()) == sorted(expected_tensors(config))
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize("copy", [False, True])
def test_tied_checkpoint_with_another_lm_head_is_refused(tmp_path: Path, copy: bool) -> None:
    """transformers 5 runs such a head untied (transformers 4 dropped it): dropping it, as
    before, silently ran another model than transformers' on the same folder."""
    config = tiny_llama_config()
    weights = random_weights(config, dtype=torch.float32)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    weights["lm_head.weight"][300, 5] += 0.5
    config.write_json(tmp_path / "config.json")
    save_file(weights, tmp_path / "model.safetensors")
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert torch.equal(theirs.lm_head.weight, weights["lm_head.weight"])
    with pytest.raises(
        WeightsError,
        match=r"tie_word_embeddings true, but the checkpoint's lm_head.weight differs from "
        r"model.embed_tokens.weight \(first in row 300\)",
    ):
        load_checkpoint(tmp_path, copy=copy)


# ------------------------------------------------------------------------------------------
# Sharded checkpoints
# ------------------------------------------------------------------------------------------


def write_sharded(tmp_path: Path, config: ModelConfig, shards: int = 3) -> dict[str, torch.Tensor]:
    weights = random_weights(config, seed=5)
    names = list(weights)
    weight_map: dict[str, str] = {}
    for index in range(shards):
        shard_name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: weights[name] for name in names[index::shards]}
        save_file(part, tmp_path / shard_name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard_name))
    index_json = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (tmp_path / INDEX_FILE).write_text(json.dumps(index_json))
    config.write_json(tmp_path / "config.json")
    return weights


def test_sharded_checkpoint_loads_like_transformers_does(tmp_path: Path) -> None:
    weights = write_sharded(tmp_path, tiny_llama_config(tie_word_embeddings=False))
    ours = load_checkpoint(tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path, dtype=torch.bfloat16
    ).state_dict()
    assert sorted(ours) == sorted(weights) == sorted(theirs)
    for name in weights:
        assert torch.equal(ours[name], weights[name]) and torch.equal(theirs[name], weights[name])
    assert len(read_checkpoint_headers(tmp_path)) == 3


@pytest.mark.parametrize("sharded", [False, True])
def test_copied_load_is_one_allocation_in_model_order(tmp_path: Path, sharded: bool) -> None:
    """The copying load (every device's but the CPU's, and the CPU's with copy=True): the values
    written, in one allocation holding the tensors in `expected_tensors` order, each at an
    aligned offset, with each layer's q, k, v and gate, up end to end (the shards split those
    groups: `write_sharded` deals the tensors out in turn); a tied lm_head is not copied."""
    config = tiny_llama_config()
    if sharded:
        weights = write_sharded(tmp_path, config)
    else:
        weights = random_weights(config)
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
        config.write_json(tmp_path / "config.json")
        save_file(weights, tmp_path / "model.safetensors")
    ours = load_checkpoint(tmp_path, copy=True)
    names = list(expected_tensors(config))
    assert list(ours) == names
    for name in names:
        assert torch.equal(ours[name], weights[name]), name
    assert len({t.untyped_storage().data_ptr() for t in ours.values()}) == 1
    offsets = [ours[name].storage_offset() * ours[name].element_size() for name in names]
    assert offsets == sorted(offsets) and all(at % 256 == 0 for at in offsets)
    used = sum(t.nbytes for t in ours.values())
    assert used <= ours[names[0]].untyped_storage().nbytes() < used + 256 * len(names)
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        for group in (("q", "k", "v"), ("gate", "up")):
            kind = "self_attn" if len(group) == 3 else "mlp"
            parts = [ours[f"{p}{kind}.{n}_proj.weight"] for n in group]
            for a, b in itertools.pairwise(parts):
                assert a.data_ptr() + a.nbytes == b.data_ptr()


def edit_index(tmp_path: Path, edit: object) -> None:
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    edit(index["weight_map"])  # type: ignore[operator]
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))


def test_sharded_errors(tmp_path: Path) -> None:
    config = tiny_llama_config()
    write_sharded(tmp_path, config)
    shard2 = "model-00002-of-00003.safetensors"

    (tmp_path / shard2).rename(tmp_path / "moved")
    with pytest.raises(WeightsError, match=rf"shard '{shard2}' does not exist"):
        load_checkpoint(tmp_path)
    (tmp_path / "moved").rename(tmp_path / shard2)

    edit_index(tmp_path, lambda m: m.update({"model.embed_tokens.weight": shard2}))  # in shard 1
    with pytest.raises(
        WeightsError,
        match=r"holds tensor 'model.embed_tokens.weight', but model.safetensors.index.json maps it to",
    ):
        load_checkpoint(tmp_path)

    write_sharded(tmp_path, config)
    edit_index(tmp_path, lambda m: m.pop("model.norm.weight"))
    with pytest.raises(
        WeightsError, match=r"holds tensor 'model.norm.weight', but .* does not list it"
    ):
        load_checkpoint(tmp_path)

    write_sharded(tmp_path, config)
    edit_index(tmp_path, lambda m: m.update({"model.extra.weight": shard2}))
    with pytest.raises(
        WeightsError,
        match=rf"weight_map puts tensor 'model.extra.weight' in '{shard2}', which does not hold it",
    ):
        load_checkpoint(tmp_path)

    write_sharded(tmp_path, config)
    long_name = "0" * 5000  # past the file system's name limit: the lookup itself fails
    edit_index(tmp_path, lambda m: m.update({"model.norm.weight": long_name}))
    with pytest.raises(WeightsError, match=r"shard '0+\.\.\.0+' cannot be looked up in"):
        load_checkpoint(tmp_path)

    write_sharded(tmp_path, config)
    edit_index(tmp_path, lambda m: m.update({"model.norm.weight": "../elsewhere.safetensors"}))
    with pytest.raises(WeightsError, match="is not a plain file name"):
        load_checkpoint(tmp_path)

    (tmp_path / INDEX_FILE).write_text("{}")
    with pytest.raises(WeightsError, match="non-empty 'weight_map'"):
        load_checkpoint(tmp_path)
    (tmp_path / INDEX_FILE).write_text("nope")
    with pytest.raises(WeightsError, match="not valid JSON"):
        load_checkpoint(tmp_path)
    (tmp_path / INDEX_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(WeightsError, match=r"not valid JSON \(nested too deeply\)"):
        load_checkpoint(tmp_path)
    (tmp_path / INDEX_FILE).unlink()
    with pytest.raises(
        WeightsError, match=r"no model\.safetensors and no model\.safetensors\.index\.json"
    ):
        load_checkpoint(tmp_path)


def test_a_weights_file_that_cannot_be_looked_up_is_named(tmp_path: Path) -> None:
    """A folder whose config.json is within the path length limit and model.safetensors past
    it: the lookup of the weights file fails (as in a folder that cannot be searched). It was
    an OSError from deep inside pathlib, not a WeightsError naming the folder."""
    limit = os.pathconf(tmp_path, "PC_PATH_MAX")
    folder = tmp_path
    while len(str(folder)) + 255 < limit - len("/config.json"):
        folder /= "d" * 250
    folder /= "e" * (limit - 1 - len("/config.json") - len(str(folder)) - 1)
    folder.mkdir(parents=True)
    tiny_llama_config().write_json(folder / "config.json")
    assert len(str(folder / "model.safetensors")) >= limit > len(str(folder / "config.json"))
    with pytest.raises(WeightsError, match=r"model\.safetensors cannot be looked up in .*too long"):
        load_checkpoint(folder)


def test_same_tensor_in_two_shards(tmp_path: Path) -> None:
    config = tiny_llama_config()
    write_sharded(tmp_path, config, shards=2)
    shard1 = tmp_path / "model-00001-of-00002.safetensors"
    shard2 = tmp_path / "model-00002-of-00002.safetensors"
    first = safetensors.torch.load_file(str(shard1))
    second = safetensors.torch.load_file(str(shard2))
    second["model.embed_tokens.weight"] = first["model.embed_tokens.weight"]
    save_file(second, shard2)
    with pytest.raises(
        WeightsError, match=r"tensor 'model\.embed_tokens\.weight' is also in shard"
    ):
        load_checkpoint(tmp_path)


def test_checkpoint_not_matching_config(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path, tiny_llama_config())
    tiny_llama_config(num_hidden_layers=3).write_json(tmp_path / "config.json")
    with pytest.raises(WeightsError, match=r"1 tensor\(s\)|missing"):
        load_checkpoint(tmp_path)
    # a layer count no checkpoint of these tensors can hold is refused before every layer's
    # tensor names are listed (10^9 layers would fill the memory)
    tiny_llama_config(num_hidden_layers=10**6).write_json(tmp_path / "config.json")
    with pytest.raises(
        WeightsError, match=r"num_hidden_layers is 1,000,000, more than the \d+ tensors"
    ):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_weight_is_refused_naming_its_tensor(
    tmp_path: Path, bad: float, copy: bool
) -> None:
    config = tiny_llama_config()
    weights = random_weights(config, seed=1)
    weights["model.layers.1.mlp.up_proj.weight"][3, 5] = bad
    config.write_json(tmp_path / "config.json")
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(
        WeightsError, match=r"model.safetensors: tensor model\.layers\.1\.mlp\.up_proj"
    ):
        load_checkpoint(tmp_path, copy=copy)


@pytest.mark.parametrize("copy", [False, True])
def test_huge_finite_weights_are_not_mistaken_for_damage(tmp_path: Path, copy: bool) -> None:
    """Their float32 sum overflows; the element-wise look that follows clears them."""
    config = tiny_llama_config()
    weights = random_weights(config, seed=1, dtype=torch.float32)
    weights["model.norm.weight"].fill_(3e38)
    config.write_json(tmp_path / "config.json")
    save_file(weights, tmp_path / "model.safetensors")
    loaded = load_checkpoint(tmp_path, copy=copy)["model.norm.weight"]
    assert torch.equal(loaded, weights["model.norm.weight"])


def test_padding_between_copied_tensors_is_not_read_as_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copied load checks the whole allocation in one sum, and the bytes between tensors
    must not spoil it (they start as all-ones here, a NaN in every float type): finite weights
    are cleared by that sum alone, never by the tensor-by-tensor look."""
    import sv_weights.checkpoint as checkpoint

    config = tiny_llama_config()  # its norm weights are smaller than the alignment: padding
    weights = random_weights(config, seed=2)
    config.write_json(tmp_path / "config.json")
    save_file(weights, tmp_path / "model.safetensors")
    real_copy = checkpoint.copy_file_spans_to

    def copy_over_ones(spans: list[FileSpan], dest: torch.Tensor) -> None:
        real_copy(spans, dest)
        covered = torch.zeros(dest.numel(), dtype=torch.bool)
        for span in spans:
            covered[span.dest : span.dest + span.size] = True
        assert not covered.all(), "no padding in this layout: the test would prove nothing"
        dest[~covered] = 0xFF

    def no_tensor_by_tensor_look(tensors: object, source: str) -> None:
        raise AssertionError(f"the one-sum check failed on finite weights from {source}")

    monkeypatch.setattr(checkpoint, "copy_file_spans_to", copy_over_ones)
    monkeypatch.setattr(checkpoint, "check_finite", no_tensor_by_tensor_look)
    loaded = load_checkpoint(tmp_path, copy=True)
    assert all(torch.equal(loaded[name], weights[name]) for name in loaded)
