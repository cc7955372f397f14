"""`sv tokenize` (tokenize_main): ids out, text back, one-line errors with exit status 2."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sv_tokenizer import Tokenizer
from sv_tokenizer.cli import tokenize_main
from tokenizer_test_support import tiny_tiktoken_file


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = tokenize_main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_encode_and_decode_with_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tiny_tiktoken_file())
    assert run(["--tokenizer", str(model), "hello"], capsys) == (0, "259\n", "")
    assert run(["--tokenizer", str(model), "--decode", "259", "32,119"], capsys) == (
        0,
        "hello w\n",
        "",
    )
    # the list as `sv generate` prints it (ids=[...]) and /tokenize returns it ([...])
    for ids in (["[259, 32, 119]"], ["ids=[259,", "32,", "119]"], ["[259]"]):
        expected = "hello w\n" if len(ids) > 1 or "32" in ids[0] else "hello\n"
        assert run(["--tokenizer", str(model), "--decode", *ids], capsys) == (0, expected, "")
    # several TEXT arguments are one text joined by spaces
    status, out, _ = run(["--tokenizer", str(model), "hello", "world"], capsys)
    assert status == 0 and out.split() == [
        str(i) for i in Tokenizer.from_file(model).encode("hello world")
    ]


def test_a_lone_dash_reads_standard_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tiny_tiktoken_file())
    monkeypatch.setattr("sys.stdin", io.StringIO("hello w\n"))
    status, out, _ = run(["--tokenizer", str(model), "-"], capsys)
    # less its final newline, as `sv generate -` reads a prompt
    assert status == 0 and out.split() == [
        str(i) for i in Tokenizer.from_file(model).encode("hello w")
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO("259, 32 119"))
    assert run(["--tokenizer", str(model), "--decode", "-"], capsys) == (0, "hello w\n", "")
    # bytes that are not UTF-8: named, exit 2 (not a UnicodeDecodeError's traceback)
    strict = io.TextIOWrapper(io.BytesIO(b"caf\xe9 w\n"), encoding="utf-8", errors="strict")
    monkeypatch.setattr("sys.stdin", strict)
    status, _, err = run(["--tokenizer", str(model), "-"], capsys)
    assert status == 2
    assert err == "sv tokenize: error: standard input is not UTF-8 text: byte 0xe9 at character 3\n"


def test_default_llama_tokenizer_and_special_tokens(
    llama_dir: Path, llama_json: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(["--allow-special", "<|eot_id|>Hi", "<|eot_id|>"], capsys)
    assert status == 0 and out.split() == ["128009", "13347", "220", "128009"]
    assert run(["--model", str(llama_dir), "--decode", "128000 9906"], capsys) == (
        0,
        "<|begin_of_text|>Hello\n",
        "",
    )


def test_the_callers_default_model_comes_before_the_llama_tokenizer(
    llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sv_tokenizer import TokenizerError

    assert tokenize_main(["--decode", "128000"], lambda: Tokenizer.from_model_dir(llama_dir)) == 0
    assert capsys.readouterr().out == "<|begin_of_text|>\n"

    def unavailable() -> Tokenizer:
        raise TokenizerError("the default model is not installed")

    assert tokenize_main(["hi"], unavailable, "a missing model") == 2
    assert capsys.readouterr().err == "sv tokenize: error: the default model is not installed\n"
    assert tokenize_main(["--help"], unavailable, "the embedded model") == 0
    assert "default: the embedded model" in capsys.readouterr().out


def test_special_token_text_is_plain_without_allow_special(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tiny_tiktoken_file())
    status, out, _ = run(["--tokenizer", str(model), "<|eot_id|>"], capsys)
    assert status == 0 and out.split() == [str(b) for b in b"<|eot_id|>"]
    status, out, _ = run(["--tokenizer", str(model), "--allow-special", "<|eot_id|>"], capsys)
    assert status == 0 and out.split() == [str(261 + 9)]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--decode", "--tokenizer", "{model}", "12x"], "'12x' is not a token id"),
        (
            ["--decode", "--tokenizer", "{model}", "99999"],
            "token id 99999 is not in the vocabulary",
        ),
        (["--tokenizer", "{missing}", "hi"], "cannot read the tokenizer file"),
        (["--model", "{missing}", "hi"], "does not exist"),
        (["--model", "", "hi"], "--model must not be empty"),
        (["--tokenizer", "", "hi"], "--tokenizer must not be empty"),
        # digits to str.isdigit, but no token id: ², ① and Arabic-Indic ١٢
        (["--decode", "--tokenizer", "{model}", "²"], "'²' is not a token id"),
        (["--decode", "--tokenizer", "{model}", "①"], "'①' is not a token id"),
        (["--decode", "--tokenizer", "{model}", "١٢"], "'١٢' is not a token id"),
        # more digits than int() converts (4,300): not a ValueError traceback
        (["--decode", "--tokenizer", "{model}", "9" * 5000], f"'{'9' * 40}' is not a token id"),
        (["--model", "{dir}", "--tokenizer", "{model}", "hi"], "not allowed with argument"),
        (["--bogus", "hi"], "unrecognized arguments: --bogus"),
        # An unknown option is the mistake to report, not the TEXT it left missing.
        (["--help-me"], "unrecognized arguments: --help-me"),
        (["--decode"], "the following arguments are required: TEXT"),
        ([], "the following arguments are required: TEXT"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tiny_tiktoken_file())
    values = {"model": str(model), "missing": str(tmp_path / "missing"), "dir": str(tmp_path)}
    status, out, err = run([a.format(**values) for a in argv], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("sv tokenize: error: ") and expected in err, err


def test_without_any_tokenizer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sv_tokenizer.cli.installed_llama_tokenizer_dir", lambda: None)
    status, _, err = run(["hi"], capsys)
    assert status == 2 and "no tokenizer given: pass --model DIR or --tokenizer FILE" in err


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["--help"], capsys)
    assert status == 0 and "--allow-special" in out
