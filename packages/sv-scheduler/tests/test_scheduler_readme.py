"""The README examples of sv-kvcache and sv-scheduler run and print what they say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", ["sv-kvcache", "sv-scheduler"])
def test_readme_example(package: str) -> None:
    text = (PACKAGES / package / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), f"{package}/README.md", "exec"), {})
    # Each print in the example carries its expected output as a trailing comment.
    expected = re.findall(r"print\(.*\)\s+# (.*)", code.group(1))
    assert out.getvalue().splitlines() == expected
