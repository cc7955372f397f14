"""`sv bench --help` (and `sv serve --help`'s --log-level) against what the parser does: every
name or value the help lists is one the parser accepts and every one it accepts is listed, and
each default shown is the one a run without the flag gets."""

from __future__ import annotations

import re

import pytest
from sv_cli.bench import main


def _help_of(text: str, flag: str) -> str:
    """The help of `flag` in an argparse --help text, its lines joined by single spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(flag + " "))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if line.lstrip().startswith("-") and line.startswith("  -"):
            break  # the next option
        block.append(line)
    return " ".join(" ".join(block).split())


def _bench_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        main.bench_main(["--help"])
    assert caught.value.code == 0
    return capsys.readouterr().out


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str | None:
    """The usage error `sv bench ARGV` gives while parsing, or None when it takes them."""
    capsys.readouterr()
    try:
        main.parse_args(argv)
    except SystemExit as exit:
        assert exit.code == 2
        return capsys.readouterr().err
    return None


def _listed(help_text: str) -> list[str]:
    """The comma-separated names after "from:" in one option's help."""
    found = re.search(r"\bfrom: ([\w-]+(?:, [\w-]+)*)", help_text)
    assert found, f"no list of names in: {help_text}"
    return found.group(1).split(", ")


def _accepted(
    flag: str, candidates: set[str], capsys: pytest.CaptureFixture[str], refused_as: str
) -> set[str]:
    """The candidates `flag NAME` is not refused for as an unknown name (another usage error,
    such as tp's "--tensor-parallel-size N and --only tp go together", still accepts the name)."""
    accepted = set()
    for name in sorted(candidates):
        err = _refusal([flag, name], capsys)
        if err is None or refused_as not in err:
            accepted.add(name)
    return accepted


def _candidates(text: str, refusal: str | None) -> set[str]:
    """Every word of the help, and every name a refusal's message lists."""
    words = set(re.findall(r"[a-z][\w.-]*[a-z0-9]", text))
    if refusal is not None:
        words |= set(re.findall(r"[a-z][\w.-]*[a-z0-9]", refusal))
    return {w for w in words if "," not in w}


def test_only_help_lists_exactly_the_workloads_the_parser_accepts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The help left out tp and gemv, which the parser took."""
    text = _bench_help(capsys)
    only_help = _help_of(text, "--only")
    listed = _listed(only_help)
    refusal = _refusal(["--only", "no-such-workload"], capsys)
    assert refusal is not None and "unknown --only 'no-such-workload'" in refusal
    accepted = _accepted("--only", _candidates(text, refusal), capsys, "unknown --only")
    assert sorted(listed) == sorted(accepted)
    assert len(listed) == len(set(listed))
    assert {"tp", "gemv", "spec", "long"} <= set(listed)  # the ones the audit saw missing
    for name in listed:  # each also says what it runs
        assert re.search(rf"\b{name}: \w", only_help), name


def test_quantization_help_lists_exactly_the_modes_the_parser_accepts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _bench_help(capsys)
    listed = _listed(_help_of(text, "--quantization"))
    refusal = _refusal(["--quantization", "fp4"], capsys)
    assert refusal is not None
    accepted = _accepted("--quantization", _candidates(text, refusal), capsys, "unknown")
    assert sorted(listed) == sorted(accepted) == ["fp8", "int8"]
    assert _refusal(["--quantization", ",".join(listed)], capsys) is None  # together too
    assert _refusal(["--quantization", ""], capsys) is None
    assert "(default: none" in _help_of(text, "--quantization")


def test_a_bad_quantization_is_one_line_naming_the_modes_and_the_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It was printed without the pointer to --help the command's other errors give."""
    with pytest.raises(SystemExit) as caught:
        main.bench_main(["--quantization", "fp8,fp4"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sv bench: error: ")
    assert "--quantization 'fp4'" in err and "fp8" in err and "int8" in err
    assert err.rstrip().endswith("(see sv bench --help)")


@pytest.mark.parametrize(("flag", "dest"), [("--workdir", "workdir"), ("--preset", "preset")])
def test_help_shows_the_default_a_run_without_the_flag_gets(
    flag: str, dest: str, capsys: pytest.CaptureFixture[str]
) -> None:
    default = getattr(main.parse_args([]), dest)
    assert isinstance(default, str) and default
    assert f"(default {default})" in _help_of(_bench_help(capsys), flag)


def test_workdir_help_says_the_checkpoint_is_written_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "random checkpoint is written" in _help_of(_bench_help(capsys), "--workdir")


def test_serve_log_level_help_names_the_choices_and_the_default() -> None:
    """`sv serve --help` showed --log-level with no line of its own."""
    from sv_server.cli import build_parser

    text = _help_of(build_parser().format_help(), "--log-level")
    choices = re.search(r"--log-level \{([\w,]+)\}", text)
    assert choices, text
    described = text[choices.end() :]
    for level in choices.group(1).split(","):
        assert build_parser().parse_args(["--log-level", level]).log_level == level
        assert re.search(rf"\b{level}\b", described), level
    default = build_parser().parse_args([]).log_level
    assert default == "info" and f"(default {default})" in described
