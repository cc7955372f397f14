"""`sv bench --preset`: a name it does not know is refused with the list, and prompts stay the
BENCHMARKS.md workloads at Llama's vocabulary while fitting a smaller one (Mistral's 32,000);
`sv bench --help` cites only documents the repository has."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from sv_cli.bench import inputs, main


def test_unknown_preset_is_refused_with_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main.bench_main(["--preset", "llama-9b"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "unknown preset 'llama-9b'" in err and "llama-3.1-8b" in err and "mistral-7b" in err


@pytest.mark.parametrize("only", ["decod", "decode,throughput,", "load,tps"])
def test_an_unknown_only_name_is_refused_before_anything_runs(
    only: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --only used to run no workload at all (on a GPU: only the rooflines)."""
    with pytest.raises(SystemExit) as caught:
        main.bench_main(["--only", only])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("sv bench: error: unknown --only ") and err.count("\n") == 1
    assert "load,memory,decode,prefill,throughput" in err


def test_prompts_are_the_documented_workload_and_fit_the_vocabulary() -> None:
    rng = random.Random(0)
    documented = [[rng.randint(0, 127999) for _ in range(rng.randint(100, 1024))] for _ in range(4)]
    assert inputs.random_prompts(random.Random(0), 4, 100, 1024) == documented
    small = inputs.random_prompts(random.Random(0), 4, 100, 1024, vocab=32000)
    assert [len(p) for p in small] == [len(p) for p in documented]
    assert max(max(p) for p in small) < 32000


def test_help_cites_only_documents_in_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    """It cited DESIGN.md, a document the repository does not have."""
    with pytest.raises(SystemExit) as caught:
        main.bench_main(["--help"])
    assert caught.value.code == 0
    cited = re.findall(r"[\w-]+\.md\b", capsys.readouterr().out)
    root = Path(__file__).resolve().parents[3]
    assert "BENCHMARKS.md" in cited
    assert [name for name in cited if not (root / name).is_file()] == []
