"""`sv tokenize`: sv-tokenizer's command, defaulting to the model every other `sv` command uses."""

from __future__ import annotations

import sys
from pathlib import Path


def tokenize_main(argv: list[str]) -> int:
    from sv_engine import EngineError
    from sv_engine.default_model import default_model_dir
    from sv_tokenizer import TokenizerError
    from sv_tokenizer.cli import tokenize_main as run

    def default() -> Path:
        try:
            return default_model_dir(progress=lambda message: print(message, file=sys.stderr))
        except EngineError as e:
            raise TokenizerError(str(e)) from e

    return run(argv, default, "the embedded SmolLM2-135M-Instruct")
