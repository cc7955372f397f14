"""A bad sampling flag of `sv generate` or `sv chat` is one line naming the flag as typed (not
the engine's field), exit code 2, before any model loads."""

from __future__ import annotations

import argparse
import re

import pytest
import sv_engine.options
from sv_cli.main import main
from sv_engine import EngineError, SamplingParams

# Each sampling flag with values the engine refuses (or argparse cannot read), by hand from
# the documented ranges: temperature >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1],
# repetition_penalty in [1e-30, 1e30], the other penalties in [-2, 2], min_tokens in
# 0..the output-token limit (generate: 128, chat: 512 by default), seed an integer, allowed
# token ids non-negative integers, comma-separated, bad words not blank.
BAD_VALUES = [
    ("--temperature", "-1"),
    ("--temperature", "nan"),
    ("--temperature", "inf"),
    ("--top-k", "-5"),
    ("--top-k", "1.5"),
    ("--top-p", "0"),
    ("--top-p", "2"),
    ("--top-p", "nan"),
    ("--min-p", "-0.1"),
    ("--min-p", "2"),
    ("--repetition-penalty", "0"),
    ("--repetition-penalty", "-1"),
    ("--repetition-penalty", "1e31"),
    ("--frequency-penalty", "2.5"),
    ("--frequency-penalty", "-inf"),
    ("--presence-penalty", "1e9"),
    ("--presence-penalty", "-3"),
    ("--min-tokens", "-1"),
    ("--min-tokens", "1000"),
    ("--seed", "x"),
    ("--seed", "1.5"),
    ("--allowed-token-ids", ""),
    ("--allowed-token-ids", "1,x"),
    ("--allowed-token-ids", "5,-1"),
    ("--bad-words", ""),
    ("--bad-words", "   "),
]


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: a bad flag must be refused before it."""

    def refuse(args: argparse.Namespace, **overrides: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(sv_engine.options, "engine_from_args", refuse)


@pytest.mark.usefixtures("no_model_load")
@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize(("flag", "value"), BAD_VALUES)
def test_a_bad_sampling_flag_is_one_line_naming_it(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, f"{flag}={value}"] + (["hi"] if command == "generate" else [])
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusal
        code = e.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # The flag opens the message, as argparse's own errors name it: `--top-k must be ...`.
    assert re.match(rf"sv {command}: error: (argument )?{flag}[ :]", lines[0]), lines[0]


def test_min_tokens_is_checked_against_the_output_limit_given(
    no_model_load: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "-n", "5", "--min-tokens", "6", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sv generate: error: --min-tokens must be an integer from 0 to the ")
    assert "(5), got 6" in err


def test_an_error_about_a_field_renames_to_the_callers_name() -> None:
    with pytest.raises(EngineError) as caught:
        SamplingParams(top_p=2.0)
    assert caught.value.field == "top_p"
    assert str(caught.value) == "top_p must be in (0, 1], got 2.0"
    renamed = caught.value.named("--top-p")
    assert (str(renamed), renamed.field) == ("--top-p must be in (0, 1], got 2.0", "--top-p")
    with pytest.raises(ValueError, match="about no field"):
        EngineError("no field here").named("--x")
