"""`sv tokenize`: sv-tokenizer's command, defaulting to the model every other `sv` command uses."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sv_tokenizer import Tokenizer


def tokenize_main(argv: list[str]) -> int:
    from sv_engine import EngineError
    from sv_engine.default_model import damaged_default_model_hint, default_model_dir
    from sv_tokenizer import Tokenizer, TokenizerError
    from sv_tokenizer.cli import tokenize_main as run

    def default() -> Tokenizer:
        try:
            folder = default_model_dir(progress=lambda message: print(message, file=sys.stderr))
        except EngineError as e:
            raise TokenizerError(str(e)) from e
        # Its tokenizer.json alone: encoding and decoding need nothing else of the folder, so
        # a damaged config.json (which the model needs) does not stop them.
        try:
            return Tokenizer.from_file(folder / "tokenizer.json")
        except TokenizerError as e:
            raise TokenizerError(f"{e}{damaged_default_model_hint(folder)}") from e

    return run(argv, default, "the embedded SmolLM2-135M-Instruct")
