"""`sv generate --tensor-parallel-size` end to end on the embedded default model (real
SmolLM2-135M weights: 9 attention heads over 3 KV heads, so 3 ranks on the CPU over gloo)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sv_cli.main import main


def run(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[list[str], str]:
    argv = ["generate", "--stats", "--quantization", "none", "--kv-cache-mib", "8", *flags]
    assert main([*argv, "What is the capital of France?", "10", "Name a colour."]) == 0
    out = capsys.readouterr().out
    return re.findall(r"ids=(\[[\d, ]*\])", out), out


@pytest.mark.slow
def test_three_ranks_generate_what_one_does_and_free_every_page(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, _ = run(capsys)
    three, out = run(capsys, "--tensor-parallel-size", "3")
    assert len(one) == 2 and three == one
    assert "Paris" in out
    pool = int(re.search(r"pool size:\s+(\d+) pages", out).group(1))  # type: ignore[union-attr]
    free = int(re.search(r"final free pages:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert pool == free > 0


def test_a_size_that_does_not_divide_the_heads_names_them(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--tensor-parallel-size", "2", "Hi.", "4"]) != 0
    err = capsys.readouterr().err
    assert "tensor parallel size 2 must divide the model's attention heads (9), key/value " in err
    assert "\n" not in err.strip()


def test_a_size_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["generate", "--tensor-parallel-size", "0", "Hi."])
    assert e.value.code == 2
    assert "--tensor-parallel-size: must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_launches_the_ranks_and_rank_zero_prints_what_one_rank_does(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under torchrun every process runs `sv generate`; ranks 1.. serve rank 0's steps."""
    import subprocess
    import sys

    args = ["--quantization", "none", "--kv-cache-mib", "8", "Name a colour.", "8"]
    assert main(["generate", *args]) == 0
    one = re.findall(r"ids=(\[[\d, ]*\])", capsys.readouterr().out)
    # --standalone: the rendezvous on a free port of localhost, not the fixed 29500 that
    # another job on the machine may hold.
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "3",
    ]
    generate = ["-m", "sv_cli", "generate", "--device", "cpu", "--tensor-parallel-size", "3"]
    done = subprocess.run(
        [*torchrun, *generate, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # All of stderr: a rank's own message comes before torchrun's long summary of the failure.
    assert done.returncode == 0, done.stderr
    assert re.findall(r"ids=(\[[\d, ]*\])", done.stdout) == one  # printed once: by rank 0
