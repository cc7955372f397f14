"""`Engine.from_model_dir(quantization=...)`: what the Python API accepts and how it refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sv_engine import Engine, EngineError


@pytest.mark.parametrize("value", ["none", "auto", "FP8"])
def test_a_quantization_outside_the_api_is_refused_naming_none(
    tiny_llama_dir: Path, value: str
) -> None:
    """The CLI's spellings "none" and "auto" are not the API's: the error says None is how the
    API asks for unquantized weights, beside the kinds it takes."""
    message = f"quantization must be None (unquantized) or one of fp8, int8, got {value!r}"
    with pytest.raises(EngineError, match=re.escape(message)):
        Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=1, quantization=value)  # type: ignore[arg-type]
