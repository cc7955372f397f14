"""sv_tokenizer must import and work without torch (and without jinja2 until a template is rendered)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tokenizer_test_support import tiny_tiktoken_file

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "jinja2", "numpy", "transformers"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, Block())
"""


def test_import_and_encode_without_torch_or_jinja2(tmp_path: Path) -> None:
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tiny_tiktoken_file())
    script = (
        BLOCKER
        + f"""
import sv_tokenizer
from sv_tokenizer import Tokenizer, StreamDecoder, Message
tokenizer = Tokenizer.from_file({str(model)!r})
assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"
ids = tokenizer.chat_format.encode_user_prompt("hi")
assert ids[0] == tokenizer.bos_id
loaded = {{name.split(".")[0] for name in sys.modules}}
assert not loaded & {{"torch", "jinja2", "numpy"}}, loaded
print("ok")
"""
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
