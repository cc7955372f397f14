"""The `sv` command, end to end on the embedded default model (SmolLM2-135M-Instruct, CPU)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_test_support import SV, one_line_error, sv
from sv_cli.generate import split_prompts
from sv_cli.main import main


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
    for n in (1, 2, 3):
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
    assert "Paris" in out.split("[request 1]")[0]
    assert re.search(r"\[request 1\] finish=(stop|length) ids=\[\d", out)


def test_allowed_token_ids_flag_restricts_every_token(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--allowed-token-ids", "11,400,1234", "Say hello.", "6"]) == 0
    out = capsys.readouterr().out
    ids = eval(re.search(r"ids=(\[[\d, ]*\])", out).group(1))  # type: ignore[union-attr]
    assert len(ids) == 6 and set(ids) <= {11, 400, 1234}


def test_no_overlap_flag_gives_the_same_output(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--kv-cache-mib", "8", "Name a colour.", "10", "Say hello."]
    assert main(argv) == 0
    overlapped = re.findall(r"ids=(\[[\d, ]*\])", capsys.readouterr().out)
    assert main([argv[0], "--no-overlap", *argv[1:]]) == 0
    plain = re.findall(r"ids=(\[[\d, ]*\])", capsys.readouterr().out)
    assert len(plain) == 2 and plain == overlapped


def test_speculate_flag_gives_the_same_output_and_reports_acceptance(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = "Repeat exactly: the red fox and the blue bird sat on the old green fence."
    argv = ["generate", "--kv-cache-mib", "8", prompt, "20"]
    assert main(argv) == 0
    plain = re.findall(r"ids=(\[[\d, ]*\])", capsys.readouterr().out)
    assert main([argv[0], "--stats", "--speculate", "ngram", "--spec-k", "3", *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"ids=(\[[\d, ]*\])", out) == plain
    found = re.search(r"speculation:\s+(\d+) drafted, (\d+) accepted", out)
    assert found is not None and 0 < int(found.group(2)) <= int(found.group(1))


def test_bad_speculation_setting_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["generate", "--speculate", "ngram", "--spec-k", "0", "Hi."])
    assert e.value.code == 2
    assert "--spec-k" in capsys.readouterr().err


def test_static_policy_flag(default_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--static", "--stats", "Say hi.", "4", "Say bye."]) == 0
    out = capsys.readouterr().out
    assert re.search(r"peak active requests:\s+2", out)


def _stat(out: str, name: str) -> int:
    return int(re.search(rf"{name}:\s*(\d+)", out).group(1))  # type: ignore[union-attr]


def test_stats_count_a_head_held_back_by_the_static_group(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five prompts on an 11-page pool: three fit at a time. Under --static the fourth waits for
    the whole first group, so it waits at least as many steps as under --continuous (where it
    starts when one finishes), and every one of those steps is counted (it used to count 1)."""
    prompts = ["Name a colour.", "16", "Say hello.", "Name a fruit.", "Count to three.", "Hi."]
    waits = {}
    for policy in ("--continuous", "--static"):
        assert main(["generate", policy, "--stats", "--kv-cache-mib", "8", *prompts]) == 0
        waits[policy] = _stat(capsys.readouterr().out, "admission waits")
    assert waits["--static"] >= waits["--continuous"] > 1


def test_prompts_that_start_alike_share_pages_in_their_first_round(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts with one long opening, given together: the second waits for the first's
    pages and shares them (it used to compute them again: 0 prefix-cache hits)."""
    opening = " ".join(["The quick brown fox jumps over the lazy dog."] * 8)
    argv = ["generate", "--stats", f"{opening} Name a colour.", "4", f"{opening} Say hello."]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert _stat(out, "prefix-cache hit tokens") >= 64
    # every value in one column, the longest label's too
    rows = out[out.index("--- stats ---\n") :].splitlines()[1:]
    columns = {len(row) - len(row.split(":", 1)[1].lstrip()) for row in rows}
    assert len(rows) >= 8 and len(columns) == 1, rows


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "hello", "0"], "MAX_NEW must be a positive integer, got '0'"),
        (["generate", "hello", "-5"], "MAX_NEW must be a positive integer, got '-5'"),
        (["generate", "-n", "0", "hello"], "-n/--max-new-tokens: must be at least 1, got 0"),
        (["generate", "Hi", "3", "  "], "request 2 rejected: the prompt is empty"),
        (["generate", "--kv-cache-mib", "1e300", "Hi"], "a KV cache of 1e+300 MiB does not fit"),
        (["generate", "  "], "request 1 rejected: the prompt is empty"),
        (
            ["generate", "--no-such-flag", "hello"],  # the subcommand's help lists its options
            "sv generate: error: unrecognized arguments: --no-such-flag (see sv generate --help)",
        ),
        (["trace", "report", "t", "-o", "r", "x"], "(see sv trace report --help)"),
        (["generate", "--model", "/nonexistent/model", "hello"], "does not exist"),
        (["generate", "--model", __file__, "hello"], f"{__file__} is not a folder (expected"),
        (["generate", "--temperature", "-1", "hello"], "temperature"),
        (["generate", "--kv-cache-mib", "-1", "hello"], "must be a positive number"),
        (["generate", "--max-model-len", "0", "hello"], "must be at least 1"),
        (["frobnicate"], "invalid choice"),
        (["bench", "--no-such-flag"], "sv bench: error: unrecognized arguments: --no-such-flag"),
        (["weights", "inspect", "--no-such-flag", "x"], "sv weights inspect: error: unrecognized"),
        (["generate", "--spec-k", "3", "hello"], "--spec-k needs --speculate ngram"),
        (
            ["chat", "--max-new", "0"],
            "argument -n/--max-new-tokens/--max-new: must be at least 1, got 0",
        ),
        (
            ["chat", "--spec-ngram", "2", "--spec-max-batch", "4"],
            "--spec-ngram, --spec-max-batch need --speculate ngram",
        ),
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


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["generate", "--no-such-flag"], "sv generate: error: unrecognized arguments: --no-such-flag"),
        (["generate", "--no-such=x"], "sv generate: error: unrecognized arguments: --no-such=x"),
        (["trace", "report", "--no-such-flag", "t"], "sv trace report: error: unrecognized"),
        (["weights", "inspect", "--no-such-flag"], "sv weights inspect: error: unrecognized"),
        (["trace", "--no-such-flag"], "sv trace: error: unrecognized arguments: --no-such-flag"),
        (["--no-such-flag"], "sv: error: unrecognized arguments: --no-such-flag (see sv --help)"),
        # nothing unknown: the missing argument, as before
        (["generate", "--stats"], "sv generate: error: the following arguments are required: "
         "PROMPT (see sv generate --help)"),
    ],
)  # fmt: skip
def test_an_unknown_option_is_reported_before_a_missing_argument(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse checks the required arguments first: `sv generate --no-such-flag` said PROMPT
    was missing, not that the flag is unknown."""
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--bad-words", "foo", "my prompt"],
        ["generate", "--stats", "--bad-words", "bar", "--bad-words", "foo", "my prompt"],
    ],
)
def test_a_list_option_that_took_the_prompt_says_to_end_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--bad-words takes every argument up to the next flag, the prompt too: the error said
    only that PROMPT was missing."""
    assert run_cli(argv) == 2
    assert capsys.readouterr().err == (
        "sv generate: error: the following arguments are required: PROMPT (--bad-words took "
        "'foo' 'my prompt' as its words, which run to the next flag: end them with --, as in "
        "`--bad-words WORD ... -- PROMPT`) (see sv generate --help)\n"
    )


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
    assert split_prompts(["a", "abc"]) == (["a", "abc"], 128)
    assert split_prompts(["a", "3 facts"]) == (["a", "3 facts"], 128)  # a space: a prompt
    assert split_prompts(["a", "007"]) == (["a"], 7)
    assert split_prompts(["a", "7", "b"], max_new_tokens=3) == (["a", "7", "b"], 3)
    for text in ("0", "-5", "+5", "1e3", "10**9", "2.5", ".5", "12abc", "2+2?"):
        with pytest.raises(
            ValueError, match=re.escape(f"MAX_NEW must be a positive integer, got {text!r}")
        ):
            split_prompts(["a", text])
    with pytest.raises(ValueError, match="request 3 rejected: the prompt is empty"):
        split_prompts(["a", "5", "b", " "])
    # "-": standard input's text, less its final newline, once
    assert split_prompts(["-", "5"], stdin=io.StringIO("Two\nlines.\n")) == (["Two\nlines."], 5)
    assert split_prompts(["a", "-"], stdin=io.StringIO("b")) == (["a", "b"], 128)
    # ... a prompt even when it looks like a number (it is never MAX_NEW)
    assert split_prompts(["Hi", "-"], stdin=io.StringIO("7\n")) == (["Hi", "7"], 128)
    date = io.StringIO("2024-06-01\n")
    assert split_prompts(["What day is it?", "-", "9"], stdin=date) == (
        ["What day is it?", "2024-06-01", "9"],
        128,
    )
    with pytest.raises(ValueError, match=r'"-" .* may be given once'):
        split_prompts(["-", "-"], stdin=io.StringIO("x"))
    with pytest.raises(ValueError, match="request 1 rejected: the prompt is empty"):
        split_prompts(["-"], stdin=io.StringIO("\n"))
    # bytes that were not UTF-8 (lone surrogates from argv or stdin): refused, naming the byte,
    # not put into the prompt as U+FFFD
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(ValueError, match="request 2's prompt is not UTF-8 text: byte 0xe9"):
        split_prompts(["a", undecodable])


def test_input_that_is_not_utf8_is_one_line_and_exit_2(default_model: Path) -> None:
    """Under a UTF-8 locale Python reads stdin strictly: a bad byte was a UnicodeDecodeError's
    traceback (sv chat, sv tokenize) or, under C.UTF-8, a silent U+FFFD in the prompt."""
    for argv in (["generate", "-", "5"], ["tokenize", "-"], ["chat", "-n", "5"]):
        done = subprocess.run(
            [str(SV), *argv],
            input=b"caf\xe9 hi\n",
            capture_output=True,
            timeout=300,
            env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
        )
        err = done.stderr.decode()
        assert "Traceback" not in err and "byte 0xe9 at character 3" in err, (argv, err)
        assert done.returncode in (1, 2), (argv, done.returncode)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["chat", "-n", "2", "--system", b"caf\xe9 hi"], "--system"),
        (["generate", "--bad-words", b"caf\xe9 hi", "--", "Hi", "2"], "--bad-words"),
        (["chat", "-n", "2", "--bad-words", b"caf\xe9 hi"], "--bad-words"),
        (["generate", "--chat-template", b"caf\xe9 {{ messages }}", "Hi", "2"], "--chat-template"),
    ],
)
def test_a_flag_text_that_is_not_utf8_is_one_line_and_exit_2(
    argv: list[str | bytes], flag: str
) -> None:
    """A non-UTF-8 byte in an argument arrives as a lone surrogate, which the tokenizer turns
    into U+FFFD: a prompt is refused naming the byte; a system message, a bad word or a
    template text went on silently changed (`--bad-words` then banned another word)."""
    done = subprocess.run(
        [os.fsencode(SV), *(os.fsencode(a) for a in argv)],
        input=b"Hi\n",
        capture_output=True,
        timeout=300,
    )
    error = one_line_error(
        subprocess.CompletedProcess(done.args, done.returncode, "", done.stderr.decode())
    )
    assert flag in error and "byte 0xe9 at character 3" in error, error


def test_chat_ctrl_c_at_the_prompt_exits_130(default_model: Path) -> None:
    """Ctrl-C at the prompt is an interrupt (exit 130, as the README says of every command),
    where Ctrl-D and /exit end the chat normally (0)."""
    from sv_cli.chat import chat_loop
    from sv_engine import Engine, SamplingParams

    class Interrupted(io.StringIO):
        def readline(self, size: int | None = -1) -> str:
            raise KeyboardInterrupt

    engine = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16)
    params = SamplingParams(max_new_tokens=2)
    assert chat_loop(engine, params, None, Interrupted(), io.StringIO()) == 130
    assert chat_loop(engine, params, None, io.StringIO(""), io.StringIO()) == 0


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


def test_chat_commands_and_cut_replies(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/help lists the commands; a mistyped command is refused, not sent to the model; /quit
    ends the chat (the line after it is never read); a reply cut short says why, on stderr:
    the per-response limit, or the context's end."""
    from sv_cli.chat import HELP, chat_loop
    from sv_engine import Engine, SamplingParams

    engine = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16)
    inp = io.StringIO("/help\n/exti\nName three rivers.\n/quit\nNever read.\n")
    out = io.StringIO()
    # (1: piped input had a mistyped command, which a script must see)
    assert chat_loop(engine, SamplingParams(max_new_tokens=3), None, inp, out) == 1
    err = capsys.readouterr().err
    assert HELP in out.getvalue()
    assert "sv chat: unknown command /exti" in err
    assert engine.stats.finished_requests == 1  # the river question alone reached the engine
    assert "the reply stopped at the limit of 3 new tokens (--max-new-tokens)" in err
    small = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16, max_model_len=40)
    inp = io.StringIO("Write a long poem about the sea.\n")
    assert chat_loop(small, SamplingParams(max_new_tokens=100), None, inp, io.StringIO()) == 0
    assert "the end of the model's context (40 tokens): /reset to go on" in capsys.readouterr().err


class _Recording:
    """An engine whose stream() calls are kept (the dialogs chat sent), otherwise the engine."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.dialogs = engine, []

    def stream(self, dialogs: Any, params: Any) -> Any:
        self.dialogs.append(list(dialogs[0]))
        return self.engine.stream(dialogs, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_piped_chat_fails_on_a_refused_turn_and_hints_reset_only_with_history(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first turn longer than the context: refused, and /reset would not help. A later
    turn refused where earlier ones take room: /reset is the hint. Piped, either makes the
    exit status 1; a chat with no refusal is 0."""
    from sv_cli.chat import chat_loop
    from sv_engine import Engine, SamplingParams

    small = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16, max_model_len=48)
    params = SamplingParams(max_new_tokens=4)
    long = "Tell me a very long story about dragons and knights and castles far away. " * 3
    assert chat_loop(small, params, None, io.StringIO(long + "\n"), io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "rejected" in err and "/reset" not in err, err
    inp = io.StringIO("Hi\nHow are you\nWhat is 2+2 and what is 3+3\n")
    assert chat_loop(small, params, None, inp, io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "rejected" in err and err.strip().endswith("(try /reset)"), err
    assert chat_loop(small, params, None, io.StringIO("Hi\n"), io.StringIO()) == 0
    assert small.stats.free_pages == small.stats.pool_pages


def test_an_empty_system_message_is_sent(default_model: Path) -> None:
    """`--system ""` replaces the default system message the template adds without one
    (SmolLM2's names the assistant): it is sent, not dropped."""
    from sv_cli.chat import chat_loop
    from sv_engine import Engine, SamplingParams
    from sv_tokenizer import Message

    engine = _Recording(Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16))
    params = SamplingParams(max_new_tokens=2)
    for system, first in (("", [Message("system", "")]), (None, [])):
        assert chat_loop(engine, params, system, io.StringIO("Hi\n"), io.StringIO()) == 0
        assert engine.dialogs.pop() == [*first, Message("user", "Hi")]


def test_the_sv_entry_point_runs(default_model: Path) -> None:
    """The installed console script, as a user runs it."""
    done = sv("generate", "Say hello.", "4")
    assert done.returncode == 0, done.stderr
    assert re.search(r"\[request 1\] finish=(stop|length) ids=\[(\d+, ){0,3}\d+\]", done.stdout)
    piped = sv("generate", "-", "4", input="Say hello.\n")  # the prompt from a pipe
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == done.stdout


def test_tokenize_and_inspect_are_wired(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tokenize", "--model", str(default_model), "Hello world"]) == 0
    ids = capsys.readouterr().out
    assert re.search(r"\d", ids)
    assert main(["weights", "inspect", str(default_model)]) == 0
    assert "model.embed_tokens.weight" in capsys.readouterr().out
    assert main(["weights", "inspect", "/nonexistent.safetensors"]) == 2


# --- as a user runs it: `sv ...` in a subprocess; every bad input is one line on stderr ------


def test_a_budget_over_the_pool_is_refused(default_model: Path) -> None:
    """The context limit is the model's (8,192 tokens), not the pool's: a budget of more pages
    than the pool holds is refused, and the message says which option sizes the pool."""
    done = sv(
        "generate", "--stats", "--kv-cache-mib", "5", "Write a long story about a dragon.", "100000"
    )
    line = one_line_error(done)
    assert line.startswith("sv generate: error: request 1 rejected: it needs 512 pages")
    assert re.search(r"max_new_tokens \d+ \(clamped from 100000 by max_model_len 8192\)", line)
    assert "the KV-cache pool has only 7 pages" in line and "--kv-cache-mib N" in line
    assert re.search(r"final free pages:\s+7", done.stdout)


def test_max_new_lowered_to_fit_the_context_is_noted(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MAX_NEW over what the context leaves is lowered, and stderr says so for each request
    (it used to end at finish=length without a word)."""
    assert main(["generate", "--max-model-len", "40", "Hi", "16", "Say hello, please."]) == 0
    out, err = capsys.readouterr()
    notes = re.findall(
        r"^sv generate: note: request (\d): MAX_NEW 16 lowered to (\d+), all that the context "
        r"of 40 tokens leaves after its (\d+)-token prompt$",
        err,
        re.MULTILINE,
    )
    assert [n[0] for n in notes] == ["1", "2"] and len(err.splitlines()) == 2, err
    for number, used, prompt in notes:
        assert int(used) + int(prompt) == 40
        found = re.search(rf"=== request {number} \(finish=(\w+)\) ===\n.*\nids=(\[.*\])", out)
        assert found is not None
        assert found.group(1) == "stop" or len(eval(found.group(2))) == int(used)
    assert main(["generate", "--max-model-len", "40", "Hi", "4"]) == 0
    assert capsys.readouterr().err == ""


def test_a_prompt_too_long_for_the_default_pool_names_the_pool(default_model: Path) -> None:
    done = sv("generate", " ".join(["word"] * 6000), "1")
    line = one_line_error(done)
    assert "KV-cache pool has only" in line and "--kv-cache-mib N" in line
    assert "max_model_len" not in line


def test_a_second_argument_that_is_no_number_is_a_prompt(default_model: Path) -> None:
    done = sv("generate", "--max-model-len", "36", "Hi", "abc")
    assert done.returncode == 0, done.stderr
    assert "=== request 1 " in done.stdout and "=== request 2 " in done.stdout


def test_with_max_new_tokens_every_argument_is_a_prompt(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "-n", "2", "Hi", "7"]) == 0
    ids = [eval(m) for m in re.findall(r"ids=(\[[\d, ]*\])", capsys.readouterr().out)]
    assert len(ids) == 2 and all(1 <= len(i) <= 2 for i in ids)
    assert run_cli(["generate", "--help"]) == 0
    assert "With -n/--max-new-tokens every argument is a prompt." in " ".join(
        capsys.readouterr().out.split()
    )


@pytest.mark.parametrize("max_new", ["1e3", "10**9"])
def test_max_new_not_a_positive_integer(max_new: str) -> None:
    line = one_line_error(sv("generate", "Hi", max_new))
    assert f"MAX_NEW must be a positive integer, got {max_new!r}" in line


def test_max_model_len_1(default_model: Path) -> None:
    line = one_line_error(sv("generate", "--max-model-len", "1", "Hi"))
    assert "error: --max-model-len must be at least 2 tokens" in line
    line = one_line_error(sv("generate", "--max-model-len", "999999", "Hi"))
    assert "error: --max-model-len 999999 is over the model's context of 8192 tokens" in line


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_a_load_error_names_the_subcommand(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every error of a subcommand starts with its name, those of the model's load too."""
    extra = {"generate": ["Hi"], "chat": [], "serve": ["--port", "0"]}[command]
    argv = [command, "--model", str(tmp_path / "missing"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"sv {command}: error: model folder {tmp_path / 'missing'} does not exist\n"


def _available_mib() -> int:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    return kib // 1024


def test_a_kv_cache_larger_than_memory_is_refused_first(default_model: Path) -> None:
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo to read the available memory from")
    mib = str(2 * _available_mib())
    line = one_line_error(sv("generate", "--kv-cache-mib", mib, "Hi", "4"))
    assert re.search(
        rf"a KV cache of {mib} MiB does not fit: [\d,]+ MiB of memory is available", line
    )


def _model_copy(default_model: Path, folder: Path) -> Path:
    """The default model's config and tokenizer files (no weights: they are never reached)."""
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model / name, folder / name)
    return folder


def test_a_chat_template_that_fails_is_found_at_load(default_model: Path, tmp_path: Path) -> None:
    folder = _model_copy(default_model, tmp_path / "render")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    line = one_line_error(sv("generate", "--model", str(folder), "Hi"))
    assert f"{folder / 'tokenizer_config.json'}: the chat template failed: TypeError" in line
    # a jinja syntax error in chat_template.jinja (which wins over tokenizer_config.json); sv chat
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    line = one_line_error(sv("chat", "--model", str(folder)))
    assert f"{folder / 'chat_template.jinja'}: chat_template line 1" in line


def test_a_closed_pipe_ends_output_quietly(default_model: Path) -> None:
    """`sv weights inspect DIR | head`: the reader has gone before sv writes anything."""
    child = subprocess.Popen(
        [str(SV), "weights", "inspect", str(default_model)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()
    err = child.stderr.read()
    assert child.wait(timeout=300) == 141  # 128 + SIGPIPE, as a Unix tool's
    assert err == b""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "argv", [["tokenize", "hi"], ["weights", "inspect", "MODEL"], ["generate", "-n", "2", "Hi"]]
)
def test_stdout_on_a_full_disk_is_one_line_and_exit_1(default_model: Path, argv: list[str]) -> None:
    """`sv ... > out.txt` on a full disk (/dev/full fails every write with ENOSPC) ended in a
    traceback."""
    argv = [str(default_model) if a == "MODEL" else a for a in argv]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [str(SV), *argv], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr == "sv: error: [Errno 28] No space left on device\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", [True, False])
@pytest.mark.parametrize(
    "argv", [["--help"], ["generate", "--help"], ["weights", "inspect", "-h"], ["tokenize", "-h"]]
)
def test_help_on_a_full_disk_is_one_line_and_exit_1(argv: list[str], unbuffered: bool) -> None:
    """`sv --help > /dev/full` exited 0 (argparse ignores a failed write: stdout unbuffered) or
    120 with "Exception ignored" (the failure seen only at interpreter exit)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [str(SV), *argv], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300, env=env
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr == "sv: error: [Errno 28] No space left on device\n"


@pytest.mark.parametrize(
    ("closed", "argv"),
    [
        (1, ["--version"]),
        (1, ["tokenize", "Hi"]),
        (0, ["tokenize", "-"]),
        (0, ["generate", "-", "2"]),
        (0, ["chat", "-n", "2"]),
    ],
)
def test_a_closed_standard_stream_is_one_line_and_exit_1(
    default_model: Path, closed: int, argv: list[str]
) -> None:
    """`sv ... >&-` or `<&-`: Python sets sys.stdout or sys.stdin to None, and sv ended in an
    AttributeError's traceback (or wrote nothing and exited 0). As `cat` does, and as a write
    that fails is reported: one line, exit 1."""
    done = subprocess.run(
        [str(SV), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.close(closed),
    )
    stream = "standard input" if closed == 0 else "standard output"
    assert done.stderr == f"sv: error: [Errno 9] {stream}: Bad file descriptor\n", done.stderr
    assert done.returncode == 1


@pytest.mark.parametrize(
    ("argv", "code"), [(["tokenize", "--decode", "x"], 2), (["generate", "Hi", "0"], 2)]
)
def test_a_closed_standard_error_puts_no_message_on_standard_output(
    argv: list[str], code: int
) -> None:
    """`sv ... 2>&-`: Python sets sys.stderr to None, and print(file=None) writes to stdout,
    so an error (or a note) went into the output. It goes nowhere, as a Unix tool's does; the
    exit status still tells."""
    done = subprocess.run(
        [str(SV), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.close(2),
    )
    assert (done.returncode, done.stdout) == (code, ""), done.stdout


def test_text_that_the_output_encoding_cannot_hold_is_escaped(default_model: Path) -> None:
    """Standard output in ASCII (PYTHONIOENCODING=ascii; an ASCII or Latin-1 locale; a Windows
    code page): a character it cannot hold was a UnicodeEncodeError's traceback, exit 1; it is
    written as its \\u escape, as Python writes it to stderr."""
    ids = sv("tokenize", "日本").stdout.split()
    done = sv("tokenize", "--decode", *ids, env={"PYTHONIOENCODING": "ascii"})
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, done.stdout) == (0, "\\u65e5\\u672c\n"), done


def test_tokenize_defaults_to_the_default_model(default_model: Path) -> None:
    from sv_tokenizer import Tokenizer

    done = sv("tokenize", "Hello world")
    assert done.returncode == 0, done.stderr
    expected = Tokenizer.from_model_dir(default_model).encode("Hello world")
    assert done.stdout.split() == [str(i) for i in expected]


def _cached_default_model(default_model: Path, cache: Path) -> Path:
    """A copy of the converted default model under `cache` (for SV_CACHE_DIR) that sv takes
    as current: its stamp, and a model.safetensors (empty: these runs never read it)."""
    from sv_engine.default_model import DEFAULT_MODEL_NAME, STAMP_FILE

    (cache / "models").mkdir()
    cached = _model_copy(default_model, cache / "models" / DEFAULT_MODEL_NAME)
    shutil.copy(default_model / STAMP_FILE, cached / STAMP_FILE)
    (cached / "model.safetensors").touch()
    return cached


def test_tokenize_needs_only_the_default_models_tokenizer(
    default_model: Path, tmp_path: Path
) -> None:
    """A damaged config.json does not stop it (it did); a damaged tokenizer.json is an error
    that says, as sv generate's does, that deleting the folder converts it again."""
    cached = _cached_default_model(default_model, tmp_path)
    (cached / "config.json").write_text("{broken")
    env = {"SV_CACHE_DIR": str(tmp_path)}
    done = sv("tokenize", "Hello world", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == sv("tokenize", "--model", str(default_model), "Hello world").stdout
    (cached / "tokenizer.json").write_text("{broken")
    line = one_line_error(sv("tokenize", "Hello world", env=env))
    assert line.startswith(f"sv tokenize: error: {cached / 'tokenizer.json'}")
    assert line.endswith(f"delete the folder {cached} and the next run converts it again)")


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_streaming_puts_the_stats_on_a_line_of_their_own(
    default_model: Path,
) -> None:
    child = subprocess.Popen(
        [str(SV), "generate", "--stats", "Write a long story about a dragon.", "200"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # As a terminal starts it: a shell's background job (`make test &`) hands its children
        # SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
        preexec_fn=_sigint_at_default,
    )
    assert child.stdout is not None
    # The first streamed byte (read unbuffered: communicate() reads the pipe itself).
    first = os.read(child.stdout.fileno(), 1)
    child.send_signal(signal.SIGINT)
    rest, err = child.communicate(timeout=300)
    out = (first + rest).decode()
    assert child.returncode == 130
    assert err.decode().strip() == "sv: interrupted"
    assert "\n--- stats ---\n" in out and "[request 1]" not in out
    pool = re.search(r"pool size:\s+(\d+)", out)
    free = re.search(r"final free pages:\s+(\d+)", out)
    assert pool and free and pool.group(1) == free.group(1)


# `sv ARGV...` as the console script runs it, with SIGINT sent to the process the moment it
# first looks for the module sys.argv[1]: at a known point of its startup, not at a guessed time.
_SIGINT_AT_IMPORT = """
import os, runpy, signal, sys

module, script, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]

class SigintAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            print(f"test: SIGINT while importing {name}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintAtImport())
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.parametrize(
    "module",
    [
        "torch",  # under sv_engine: the first second or two of every run
        "numpy._core._exceptions",  # in numpy's C initialisation, which mangles the interrupt
        "jinja2",  # loading the model (its chat template), after startup
    ],
)
def test_ctrl_c_at_any_point_of_startup_is_interrupted_and_130(
    default_model: Path, module: str
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _SIGINT_AT_IMPORT, module, str(SV), "generate", "Hi", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_sigint_at_default,
    )
    lines = [line for line in child.stderr.splitlines() if line]
    assert lines == [f"test: SIGINT while importing {module}", "sv: interrupted"], child.stderr
    assert child.returncode == 130
    assert "[request" not in child.stdout


# `sv ARGV...` with SIGINT sent to itself at the start of the engine's first step, and again
# when --stats starts printing: an impatient second Ctrl-C, at a known point of the cleanup.
_SIGINT_TWICE = """
import os, runpy, signal, sys

script, sys.argv = sys.argv[1], sys.argv[1:]
import sv_cli.generate as generate
from sv_engine import Engine

def interrupt():
    os.kill(os.getpid(), signal.SIGINT)

step, print_stats = Engine.step, generate.print_stats
def first_step(self, *args, **kwargs):
    Engine.step = step
    interrupt()
    return step(self, *args, **kwargs)
def interrupted_stats(engine):
    interrupt()
    print_stats(engine)
Engine.step, generate.print_stats = first_step, interrupted_stats
runpy.run_path(script, run_name="__main__")
"""


def test_a_second_ctrl_c_during_the_cleanup_is_no_traceback(default_model: Path) -> None:
    """The first Ctrl-C starts the cleanup (pages back, --stats); a second one then is
    ignored: exit 130 with the one line, the stats whole (it printed a traceback)."""
    child = subprocess.run(
        [sys.executable, "-c", _SIGINT_TWICE, str(SV), "generate", "--stats", "Hi", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_sigint_at_default,
    )
    assert child.stderr.strip() == "sv: interrupted", child.stderr
    assert child.returncode == 130
    pool = re.search(r"pool size:\s+(\d+)", child.stdout)
    free = re.search(r"final free pages:\s+(\d+)", child.stdout)
    assert pool and free and pool.group(1) == free.group(1), child.stdout


def test_uninterrupted_holds_ctrl_c_off_then_gives_it_back() -> None:
    from sv_cli.common import uninterrupted

    seen: list[int] = []

    def record(signum: int, _frame: object) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, record)
    try:
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # (a handler runs between bytecodes: it would have by now)
        assert seen == []
        assert signal.getsignal(signal.SIGINT) is record
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_nan_weights_in_a_damaged_cached_default_model(default_model: Path, tmp_path: Path) -> None:
    """A NaN is named with its tensor; for the cached default model the message says that
    deleting its folder converts it again."""
    from sv_engine.default_model import DEFAULT_MODEL_NAME, STAMP_FILE
    from sv_weights import save_file, tiny_llama_config
    from sv_weights.synthetic import random_weights

    (tmp_path / "models").mkdir()
    cached = _model_copy(default_model, tmp_path / "models" / DEFAULT_MODEL_NAME)
    shutil.copy(default_model / STAMP_FILE, cached / STAMP_FILE)
    config = tiny_llama_config(vocab_size=49152, bos_token_id=1, eos_token_ids=(2,))
    config.write_json(cached / "config.json")
    weights = random_weights(config)
    weights["model.layers.1.self_attn.k_proj.weight"][0, 0] = float("nan")
    save_file(weights, cached / "model.safetensors")
    line = one_line_error(sv("generate", "Hi", "1", env={"SV_CACHE_DIR": str(tmp_path)}))
    assert "tensor model.layers.1.self_attn.k_proj.weight holds NaN or infinite values" in line
    assert f"delete the folder {cached} and the next run converts it again" in line


@pytest.mark.parametrize("mode", ["none", "int8", "fp8"])
def test_quantization_flag_generates_on_the_cpu(
    default_model: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    """Every --quantization mode generates; FP32 and int8 (the CPU default) answer the capital
    question. FP8's 3-bit mantissas move this 135M model more (BENCHMARKS.md): it answers
    something else, so only its output's form is checked."""
    assert main(["generate", "--quantization", mode, "What is the capital of France?", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\[request 1\] finish=(stop|length) ids=\[\d", out)
    if mode != "fp8":
        assert "Paris" in out


def test_cpu_default_quantization_is_int8(tmp_path: Path) -> None:
    """auto: int8 on the CPU, except for a checkpoint that comes quantized, whose author chose
    what stays unquantized (the LM head, here, as published FP8 Llama checkpoints do)."""
    from sv_engine.options import resolve_quantization
    from sv_weights import tiny_llama_config
    from sv_weights.synthetic import fp8_quantization_config

    assert resolve_quantization("auto", "cpu") == "int8"
    assert resolve_quantization("none", "cpu") is None
    assert resolve_quantization("fp8", "cpu") == "fp8"
    raw = tiny_llama_config().to_json_dict()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert resolve_quantization("auto", "cpu", tmp_path) == "int8"
    raw["quantization_config"] = fp8_quantization_config()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert resolve_quantization("auto", "cpu", tmp_path) is None
    assert resolve_quantization("int8", "cpu", tmp_path) == "int8"  # asked for: every matrix


def test_spec_max_batch_flag_sets_the_batch_limit_and_zero_lifts_it() -> None:
    import argparse

    from sv_engine.options import add_engine_arguments, speculation_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, admission="conservative")

    def limit(*flags: str) -> int | None:
        spec = speculation_from_args(parser.parse_args(["--speculate", "ngram", *flags]))
        assert spec is not None
        return spec.max_batch

    assert limit() == 32
    assert limit("--spec-max-batch", "4") == 4
    assert limit("--spec-max-batch", "0") is None


def test_spec_ngram_help_states_the_shortest_suffix_looked_up() -> None:
    """--help gives the shortest suffix the drafter falls back to: SpeculationConfig's
    min_ngram, which --spec-ngram leaves as it is (the help said 2 after the default became 1)."""
    import argparse

    from sv_engine.options import add_engine_arguments, speculation_from_args
    from sv_scheduler import SpeculationConfig

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, admission="conservative")
    action = next(a for a in parser._actions if "--spec-ngram" in a.option_strings)
    shortest = SpeculationConfig().min_ngram
    assert f"shorter ones down to {shortest}" in (action.help or "")
    spec = speculation_from_args(parser.parse_args(["--speculate", "ngram", "--spec-ngram", "4"]))
    assert spec is not None and spec.ngram == 4 and spec.min_ngram == shortest


def test_a_negative_spec_max_batch_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["generate", "--speculate", "ngram", "--spec-max-batch", "-1", "Hi."])
    assert e.value.code == 2
    assert "--spec-max-batch" in capsys.readouterr().err


def test_bad_words_flag_equals_the_engine(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--bad-words (several words, ended by --) gives the engine's tokens with those bad_words,
    and the plain run's differ."""
    from sv_engine import Engine, SamplingParams

    engine = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16)
    prompt = engine.encode_prompt("Say hello.")
    plain = engine.generate([prompt], SamplingParams(max_new_tokens=6))[0]
    banned = SamplingParams(max_new_tokens=6, bad_words=["Hello", "zebra"])
    want = engine.generate([prompt], banned)[0].output_ids
    assert want != plain.output_ids
    assert main(["generate", "--bad-words", "Hello", "zebra", "--", "Say hello.", "6"]) == 0
    out = capsys.readouterr().out
    assert eval(re.search(r"ids=(\[[\d, ]*\])", out).group(1)) == want  # type: ignore[union-attr]


def test_version_is_the_packages() -> None:
    """`sv --version`, as `vllm --version`: the version apps/cli/pyproject.toml declares."""
    import tomllib

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    done = sv("--version")
    assert done.returncode == 0 and done.stdout == f"sv {declared['project']['version']}\n"


def test_the_parser_needs_no_package_metadata(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source tree run from PYTHONPATH (the GPU machine's way) has no installed metadata:
    every command still parses, and --version says where it runs from."""
    import importlib.metadata

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(SystemExit) as e:
        main(["generate", "--help"])
    assert e.value.code == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == "sv (from a source tree, not an installed package)\n"


def test_kv_cache_dtype_help_states_the_pool_ratio_of_each_default(default_model: Path) -> None:
    """--kv-cache-dtype fp8 against auto (the weights' dtype): an FP8 pool holds twice the
    tokens of BF16's (CUDA's default) and four times FP32's (the CPU's), measured on the
    engine's pools; the help said "twice the tokens" only, which the CPU's default is not."""
    import argparse

    import torch
    from sv_engine import Engine
    from sv_engine.options import add_engine_arguments

    def pool_pages(kv_cache_dtype: str, dtype: torch.dtype | None) -> int:
        engine = Engine.from_model_dir(
            default_model,
            device="cpu",
            kv_cache_mib=8,
            kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
            dtype=dtype,
        )
        return engine.stats.pool_pages

    fp8 = pool_pages("fp8", None)  # (8 MiB is not a whole number of pages: floors)
    assert fp8 // 4 == pool_pages("auto", None) > 0  # the CPU's default: FP32
    assert fp8 // 2 == pool_pages("auto", torch.bfloat16)
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, admission="conservative")
    action = next(a for a in parser._actions if "--kv-cache-dtype" in a.option_strings)
    text = " ".join((action.help or "").split())
    assert "twice the tokens of BF16's" in text and "four times FP32's" in text
