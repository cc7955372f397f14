"""`sv generate --logprobs K` on the default model: each token's probability and alternatives,
checked against the engine's own Completion.logprobs (which tests against transformers)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from sv_cli.main import main

# The token's repr may be quoted either way ("'s" is).
LINE = re.compile(r"^\s+(\d+)  (['\"]).*\2\s+p=([\d.]+)  logp=(-?[\d.]+)(?:  \| (.*))?$")


@pytest.mark.parametrize("prompts", [["What is the capital of France?"], ["Hi.", "Say yes."]])
def test_each_token_with_its_alternatives(
    default_model: Path, capsys: pytest.CaptureFixture[str], prompts: list[str]
) -> None:
    assert main(["generate", "-n", "6", "--logprobs", "3", *prompts]) == 0
    out = capsys.readouterr().out
    ids = [eval(m) for m in re.findall(r"ids=(\[[\d, ]*\])", out)]
    rows = [LINE.match(line) for line in out.splitlines()]
    found = [m for m in rows if m is not None]
    assert len(found) == sum(map(len, ids))  # one line per output token, stop token included
    for m in found:
        p, logp = float(m.group(3)), float(m.group(4))
        assert p == pytest.approx(math.exp(logp), abs=1e-4)
        alternatives = [float(x) for x in re.findall(r" (\d\.\d{4})(?:  |$)", m.group(5))]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert p <= alternatives[0] + 1e-4  # greedy: the chosen token is the most likely
        assert p == pytest.approx(alternatives[0], abs=1e-4)


@pytest.mark.parametrize("k", ["21", "-1"])
def test_logprobs_out_of_range_is_one_line_and_exit_2(
    k: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error naming the flag (it quoted the engine's "logprobs must be None or ...")."""
    with pytest.raises(SystemExit) as e:
        main(["generate", "--logprobs", k, "Hi"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"sv generate: error: argument --logprobs: must be in 0..20, got {k} (" in err
    assert len(err.strip().splitlines()) == 1


def test_sampling_control_flags_reach_the_params() -> None:
    import argparse

    from sv_cli.common import add_sampling_arguments, sampling_params

    p = argparse.ArgumentParser()
    add_sampling_arguments(p)
    args = p.parse_args(
        [
            "--min-p",
            "0.1",
            "--repetition-penalty",
            "1.2",
            "--frequency-penalty",
            "0.5",
            "--presence-penalty",
            "-0.5",
            "--min-tokens",
            "3",
        ]
    )
    params = sampling_params(args, 8)
    assert (params.min_p, params.repetition_penalty) == (0.1, 1.2)
    assert (params.frequency_penalty, params.presence_penalty, params.min_tokens) == (0.5, -0.5, 3)
    assert sampling_params(p.parse_args([]), 8).processes_logits is False


def test_a_bad_penalty_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--repetition-penalty", "0", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "--repetition-penalty must be" in err and len(err.strip().splitlines()) == 1
