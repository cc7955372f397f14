"""The `sv` command, end to end on the embedded default model (SmolLM2-135M-Instruct, CPU)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sv_cli.generate import split_prompts
from sv_cli.main import main


@pytest.fixture(scope="module")
def default_model() -> Path:
    from sv_weights import WeightsError, default_model_dir

    try:
        return default_model_dir(progress=lambda _m: None)
    except WeightsError as e:
        pytest.skip(f"default model unavailable: {e}")


def test_generate_several_prompts_with_stats(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CI end-to-end check: several prompts batched, every pool page free at the end."""
    rc = main(
        [
            "generate",
            "--stats",
            "--kv-cache-mib",
            "8",
            "What is the capital of France?",
            "12",
            "Name a colour.",
            "Say hello.",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for n in range(3):
        assert re.search(rf"=== request {n} \(finish=(stop|length)\) ===", out)
    ids = [eval(m) for m in re.findall(r"ids=(\[[\d, ]*\])", out)]
    assert len(ids) == 3 and all(1 <= len(i) <= 12 for i in ids)
    pool = int(re.search(r"pool size:\s+(\d+) pages", out).group(1))  # type: ignore[union-attr]
    free = int(re.search(r"final free pages:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert pool == free > 0
    assert "Paris" in out


def test_single_prompt_streams_and_prints_ids(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "What is the capital of France?", "16"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out.split("[request 0]")[0]
    assert re.search(r"\[request 0\] finish=(stop|length) ids=\[\d", out)


def test_no_overlap_flag_gives_the_same_output(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--kv-cache-mib", "8", "Name a colour.", "10", "Say hello."]
    assert main(argv) == 0
    overlapped = re.findall(r"ids=(\[[\d, ]*\])", capsys.readouterr().out)
    assert main([argv[0], "--no-overlap", *argv[1:]]) == 0
    plain = re.findall(r"ids=(\[[\d, ]*\])", capsys.readouterr().out)
    assert len(plain) == 2 and plain == overlapped


def test_static_policy_flag(default_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--static", "--stats", "Say hi.", "4", "Say bye."]) == 0
    out = capsys.readouterr().out
    assert re.search(r"peak active requests:\s+2", out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "hello", "0"], "MAX_NEW must be a positive integer"),
        (["generate", "hello", "-3"], "MAX_NEW must be a positive integer"),
        (["generate", "  "], "prompt 1 is empty"),
        (["generate", "--no-such-flag", "hello"], "unrecognized arguments"),
        (["generate", "--model", "/nonexistent/model", "hello"], "does not exist"),
        (["generate", "--temperature", "-1", "hello"], "temperature"),
        (["generate", "--kv-cache-mib", "-1", "hello"], "must be a positive number"),
        (["generate", "--max-model-len", "0", "hello"], "must be at least 1"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def run_cli(argv: list[str]) -> int | str | None:
    """main(), with argparse's own exits turned into a return code."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_prompt_over_the_context_is_refused(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run_cli(["generate", "--max-model-len", "64", " ".join(["word"] * 100)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error" in err and len(err.strip().splitlines()) == 1


def test_split_prompts() -> None:
    assert split_prompts(["a"]) == (["a"], 128)
    assert split_prompts(["a", "7", "b"]) == (["a", "b"], 7)
    assert split_prompts(["a", "b", "7"]) == (["a", "b", "7"], 128)


def test_chat_two_turns_and_reset(default_model: Path) -> None:
    from sv_cli.chat import chat_loop
    from sv_engine import Engine, SamplingParams

    engine = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16)
    inp = io.StringIO("What is the capital of France?\nAnd of Italy?\n/reset\n\n/exit\n")
    out = io.StringIO()
    assert chat_loop(engine, SamplingParams(max_new_tokens=20), None, inp, out) == 0
    text = out.getvalue()
    assert "Paris" in text and "Rome" in text
    assert "(conversation reset)" in text
    # the second turn re-used the first turn's pages from the prefix cache
    assert engine.stats.prefix_cache_hit_tokens > 0
    assert engine.stats.free_pages == engine.stats.pool_pages


def test_the_sv_entry_point_runs(default_model: Path) -> None:
    """The installed console script, as a user runs it."""
    sv = Path(sys.executable).parent / "sv"
    done = subprocess.run(
        [str(sv), "generate", "Say hello.", "4"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "[request 0]" in done.stdout


def test_tokenize_and_inspect_are_wired(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tokenize", "--model", str(default_model), "Hello world"]) == 0
    ids = capsys.readouterr().out
    assert re.search(r"\d", ids)
    assert main(["weights", "inspect", str(default_model)]) == 0
    assert "model.embed_tokens.weight" in capsys.readouterr().out
    assert main(["weights", "inspect", "/nonexistent.safetensors"]) == 2
