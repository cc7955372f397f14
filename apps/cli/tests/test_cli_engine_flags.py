"""vLLM's engine flags, shared by `sv generate`, `sv chat` and `sv serve`: each reaches the engine
(seen through --stats, the engine's dtype, or transformers' rendering of the same template), and
a bad value is one line naming the flag, exit code 2."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch
from cli_test_support import one_line_error, sv
from sv_cli.main import main
from sv_engine import Engine, EngineError
from sv_engine.options import add_engine_arguments, chat_template_from_args, engine_from_args
from sv_server.cli import serve_main
from sv_tokenizer import Message

# Not the default model's own template: upper-case roles, the folder's bos_token first.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] | upper }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>ASSISTANT\n{% endif %}"
)
DIALOG = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def _stat(out: str, name: str) -> int:
    match = re.search(rf"{name}:\s+(\d+)", out)
    assert match, out
    return int(match.group(1))


def _engine(*flags: str) -> Engine:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, admission="conservative")
    args = parser.parse_args(["--device", "cpu", "--kv-cache-mib", "8", *flags])
    return engine_from_args(args)[0]


def test_max_num_seqs_caps_the_decode_batch(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = ["Say a.", "Say b.", "Say c.", "Say d.", "Say e."]
    argv = ["generate", "--stats", "--quantization", "none", "--kv-cache-mib", "8", "-n", "3"]
    argv += prompts
    assert main([*argv[:1], "--max-num-seqs", "2", *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert _stat(out, "largest decode batch") == 2
    assert _stat(out, "peak active requests") == 2
    assert main(argv) == 0  # the default (256) runs more together
    assert _stat(capsys.readouterr().out, "largest decode batch") > 2


def test_no_enable_prefix_caching_computes_a_shared_opening_again(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opening = " ".join(["The quick brown fox jumps over the lazy dog."] * 8)
    argv = ["generate", "--stats", "--quantization", "none", f"{opening} Name a colour.", "2"]
    argv.append(f"{opening} Say hello.")
    assert main(argv) == 0
    assert _stat(capsys.readouterr().out, "prefix-cache hit tokens") >= 64
    assert main([*argv[:1], "--no-enable-prefix-caching", *argv[1:]]) == 0
    assert _stat(capsys.readouterr().out, "prefix-cache hit tokens") == 0
    assert _engine("--no-enable-prefix-caching").scheduler.config.prefix_caching is False
    assert _engine("--enable-prefix-caching").scheduler.config.prefix_caching is True


@pytest.mark.parametrize(("flag", "dtype"), [("float16", torch.float16), ("half", torch.float16)])
def test_dtype_float16_runs_on_the_cpu(default_model: Path, flag: str, dtype: torch.dtype) -> None:
    engine = _engine("--dtype", flag, "--quantization", "none")
    assert engine.runner.dtype == dtype
    assert engine.runner.model.weights.embed.dtype == dtype
    completion = engine.generate(["What is the capital of France?"])[0]
    assert "Paris" in completion.text


def test_dtype_auto_is_float32_on_the_cpu(default_model: Path) -> None:
    assert _engine("--quantization", "none").runner.dtype == torch.float32
    assert _engine("--dtype", "bfloat16", "--quantization", "none").runner.dtype == torch.bfloat16


def test_max_num_batched_tokens_reaches_the_scheduler(default_model: Path) -> None:
    engine = _engine("--max-num-seqs", "4", "--max-num-batched-tokens", "64")
    assert engine.scheduler.config.max_num_seqs == 4
    assert engine.scheduler.config.max_step_tokens == 64


def _transformers_ids(model_dir: Path, template: str) -> list[int]:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(
        DIALOG, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def test_chat_template_renders_as_transformers_does(default_model: Path, tmp_path: Path) -> None:
    expected = _transformers_ids(default_model, TEMPLATE)
    messages = [Message(m["role"], m["content"]) for m in DIALOG]
    template_file = tmp_path / "upper.jinja"
    template_file.write_text(TEMPLATE)
    as_file = _engine("--chat-template", str(template_file))
    assert as_file.tokenizer.chat_format.encode_dialog(messages) == expected
    # as text, with \n as a shell passes it (two characters), as vLLM reads it
    as_text = _engine("--chat-template", TEMPLATE.replace("\n", "\\n"))
    assert as_text.tokenizer.chat_format.encode_dialog(messages) == expected
    # the folder's own template renders something else
    assert _engine().tokenizer.chat_format.encode_dialog(messages) != expected


def test_a_folder_without_a_chat_template_is_noted(
    default_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The built-in format a folder's special tokens name stands in for a missing template,
    and the load says so (once); a folder's own template or --chat-template gets no note."""
    bare = tmp_path / "no-template"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (bare / name).symlink_to(default_model / name)
    config = json.loads((default_model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    capsys.readouterr()
    engine = _engine("--model", str(bare))
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"sv: note: {bare} has no chat template" in err
    assert "the built-in ChatML format" in err
    assert engine.tokenizer.builtin_chat_format == "ChatML"
    _engine()
    assert "chat template" not in capsys.readouterr().err
    _engine("--model", str(bare), "--chat-template", TEMPLATE.replace("\n", "\\n"))
    assert "chat template" not in capsys.readouterr().err


def test_chat_template_text_decodes_escapes_and_keeps_other_characters() -> None:
    def read(value: str) -> tuple[str, str] | None:
        return chat_template_from_args(argparse.Namespace(chat_template=value))

    assert read("{{ 'é→' }}\\n\\t\\q") == ("{{ 'é→' }}\n\t\\q", "--chat-template (text)")
    assert read("{{ messages }}") == ("{{ messages }}", "--chat-template (text)")
    for empty in ("", " "):  # (an unset shell variable: it read "." and said "Is a directory")
        with pytest.raises(EngineError, match="--chat-template must not be empty"):
            read(empty)


def test_sv_chat_uses_the_chat_template(default_model: Path, tmp_path: Path) -> None:
    template_file = tmp_path / "upper.jinja"
    template_file.write_text(TEMPLATE)
    done = sv("chat", "--chat-template", str(template_file), "-n", "4", input="Hi\n")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["generate", "--max-num-seqs", "0", "Hi"], ["--max-num-seqs"]),
        (["generate", "--max-num-batched-tokens", "x", "Hi"], ["--max-num-batched-tokens"]),
        (
            ["chat", "--max-num-seqs", "16", "--max-num-batched-tokens", "8"],
            ["--max-num-batched-tokens (8)", "--max-num-seqs (16)"],
        ),
        (["generate", "--dtype", "int8", "Hi"], ["--dtype"]),
        (["generate", "--gpu-memory-utilization", "0", "Hi"], ["--gpu-memory-utilization"]),
        (["chat", "--gpu-memory-utilization", "1.01"], ["--gpu-memory-utilization"]),
        (["generate", "--gpu-memory-utilization", "nan", "Hi"], ["--gpu-memory-utilization"]),
        (
            ["generate", "--gpu-memory-utilization", "0.5", "--kv-cache-mib", "8", "Hi"],
            ["--gpu-memory-utilization", "--kv-cache-mib"],
        ),
        (
            ["generate", "--device", "cpu", "--gpu-memory-utilization", "0.5", "Hi"],
            ["--gpu-memory-utilization", "CPU", "--kv-cache-mib"],
        ),
        (["generate", "--chat-template", "/no/such.jinja", "Hi"], ["--chat-template"]),
        (["chat", "--chat-template", "{{ bad"], ["--chat-template (text): chat_template line"]),
        (["generate", "--chat-template", "{{ 1 }}\\x4", "Hi"], ["--chat-template (text): a bad"]),
    ],
)
def test_bad_engine_flag_is_one_line_naming_it(
    default_model: Path, argv: list[str], names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for name in names:
        assert name in err


def test_a_chat_template_file_that_fails_names_the_flag(
    default_model: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")
    line = one_line_error(sv("generate", "--chat-template", str(broken), "Hi"))
    assert f"--chat-template {broken}: chat_template line 1" in line
    assert "delet" not in line  # not the damaged default model's hint: the folder is fine
    silent = tmp_path / "silent.jinja"
    silent.write_text("{% for m in messages %}{{ m['role'] }}{% endfor %}")
    line = one_line_error(sv("chat", "--chat-template", str(silent)))
    assert f"--chat-template {silent}: the chat template leaves the" in line


def test_serve_takes_the_engine_flags(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--port", "0", "--max-num-seqs", "8", "--max-num-batched-tokens", "4"]
    assert serve_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "--max-num-batched-tokens (4) must be at least --max-num-seqs (8)" in err
