"""`sv chat --reasoning-parser`: a thinking model's <think>...</think> shown dimmed, without
its tags. A small random model (seeded) with Qwen3's real tokenizer and template; a logit bias
on the tags makes it think at random: the raw answer, split by hand, is the dimmed one."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import sv_engine.loading
from cli_test_support import sv

THINK, END = 151667, 151668  # Qwen3's <think> and </think>
DIM, UNDIM = "\x1b[2m", "\x1b[0m"


def test_the_thinking_is_dimmed_without_its_tags(tiny_qwen3_dir: Path) -> None:
    from sv_cli.chat import chat_loop
    from sv_engine import Engine, SamplingParams
    from sv_server.reasoning import parser_for

    engine = Engine.from_model_dir(tiny_qwen3_dir, device="cpu", kv_cache_mib=16)
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


def test_a_parser_the_model_cannot_honour_is_refused_before_the_weights_load(
    default_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the tokenizer is needed to know a model has no think tags: no weights are read."""
    from sv_cli.main import main

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(sv_engine.loading, "load_runner", refuse)
    assert main(["chat", "--model", str(default_model), "--reasoning-parser", "deepseek_r1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "--reasoning-parser deepseek_r1: the model's tokenizer has no '<think>'" in err
