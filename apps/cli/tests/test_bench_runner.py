"""The sizes `sv bench` divides by, against hand counts of the checkpoint; and the bare decode
replay it times, against the step it was loaded with (GPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from sv_cli.bench.runner import (
    decode_replay,
    kv_pool_bytes,
    num_parameters,
    weight_bytes_per_decode_step,
)
from sv_model import ModelRunner, ModelWeights, StepInputs
from sv_weights import ModelConfig, load_checkpoint, tiny_llama_config, write_random_checkpoint


def _runner(model_dir: Path, device: str, dtype: torch.dtype, **kwargs: object) -> ModelRunner:
    config = ModelConfig.from_model_dir(model_dir)
    state = load_checkpoint(model_dir, device=device)
    weights = ModelWeights.from_state_dict(config, state, device, dtype)
    return ModelRunner(config, weights, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("tied", [True, False])
def test_sizes_match_the_checkpoint(tmp_path: Path, tied: bool) -> None:
    """Parameters: every tensor of the file once (a tied LM head is not in the file). A decode
    step reads all of them but the embedding, whose one row per token is not counted, except
    that a tied embedding is read whole as the LM head. The pool: K and V of every layer, for
    the pages asked for plus the scratch page."""
    config = tiny_llama_config(tie_word_embeddings=tied)
    write_random_checkpoint(tmp_path, config, seed=0, dtype=torch.float32)
    state = load_checkpoint(tmp_path)
    in_file = sum(t.numel() for t in state.values())
    embedding = state["model.embed_tokens.weight"].numel()
    runner = _runner(tmp_path, "cpu", torch.float32, num_pages=10)
    weights = runner.model.weights
    assert num_parameters(weights) == in_file
    read_per_step = in_file if tied else in_file - embedding
    assert weight_bytes_per_decode_step(weights) == read_per_step * 4
    per_page = config.num_hidden_layers * 16 * config.num_key_value_heads * config.head_dim
    assert kv_pool_bytes(runner.kv) == 2 * 11 * per_page * 4


def test_decode_replay_needs_cuda_graphs(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path, tiny_llama_config(), seed=0, dtype=torch.float32)
    runner = _runner(tmp_path, "cpu", torch.float32, num_pages=10)
    with pytest.raises(ValueError, match="CUDA graphs"):
        decode_replay(runner, StepInputs([1], [0], [0], [1], [1], [0]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_replay_recomputes_the_loaded_step() -> None:
    """The bare replay the benchmark times computes the step that `decode_replay` loaded:
    its logits equal those of running the step normally, even after the buffer was cleared."""
    from sv_weights import llama_3_2_1b_config

    model_dir = Path(os.environ.get("SV_BENCH_WORKDIR", "/tmp/sv-bench")) / "llama-3.2-1b-random"
    if not (model_dir / "model.safetensors").exists():
        write_random_checkpoint(model_dir, llama_3_2_1b_config(), seed=0, dtype=torch.bfloat16)
    runner = _runner(model_dir, "cuda", torch.bfloat16, num_pages=2048, max_model_len=16384)
    runner.tune_linear()
    runner.set_block_tables([(0, list(range(8)))])
    step = StepInputs([5], [40], [0], [1], [41], [0])
    expected = runner.logits(step)
    replay = decode_replay(runner, step)
    assert runner.decode_graphs is not None
    graph = runner.decode_graphs.for_batch(1)
    with torch.inference_mode():
        graph.logits.zero_()
    replay()
    assert torch.equal(graph.logits[:1], expected)
