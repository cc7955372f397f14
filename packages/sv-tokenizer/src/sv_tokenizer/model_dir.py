"""What a model folder says about its tokenizer besides the tokenizer file itself.

- `tokenizer_config.json`: `chat_template` (a string, or a list of named templates), the
  `bos_token` / `eos_token` / `pad_token` / `unk_token` strings the template may use, and
  `added_tokens_decoder` (the special tokens' names and ids; used with a tiktoken file,
  which has none of its own);
- `chat_template.jinja`: where newer transformers versions save the template (wins);
- `generation_config.json` and `config.json`: `eos_token_id` (an id or a list of ids): the
  ids generation stops at (Llama 3.2 Instruct lists <|end_of_text|>, <|eom_id|>, <|eot_id|>).

Every file is optional; a present but malformed one is a TokenizerError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import TokenizerError
from .hf_json import MAX_ID_DIGITS, AddedToken, parse_json_document

TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer.model", "original/tokenizer.model")
"""Looked for in this order: HF's file first (it carries its own special tokens), then the
tiktoken file, also where Meta's HF uploads keep it (`original/`)."""

TEMPLATE_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)


@dataclass
class ModelDirConfig:
    chat_template: str | None = None
    chat_template_source: str | None = None  # the file it came from, for error messages
    template_tokens: dict[str, str] = field(
        default_factory=dict
    )  # bos_token etc., for the template
    eos_ids: dict[int, str] = field(default_factory=dict)  # id -> the file that names it
    added_tokens: list[AddedToken] | None = None  # from added_tokens_decoder


def find_tokenizer_file(model_dir: Path) -> Path:
    for name in TOKENIZER_FILE_NAMES:
        candidate = model_dir / name
        if candidate.is_file():
            return candidate
    raise TokenizerError(
        f"{model_dir}: no tokenizer file found (looked for {', '.join(TOKENIZER_FILE_NAMES)})"
    )


def _read_json_object(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    document = parse_json_document(path.read_bytes(), str(path))
    if not isinstance(document, dict):
        raise TokenizerError(f"{path}: expected a JSON object at the top level")
    return document


def _token_string(value: object, path: Path, key: str) -> str | None:
    """A special token in tokenizer_config.json: a string, or an AddedToken object with `content`."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(
        f"{path}: field '{key}' must be a token string or an object with 'content'"
    )


def _eos_token_ids(document: dict[str, Any], path: Path) -> set[int]:
    value = document.get("eos_token_id")
    if value is None:
        return set()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise TokenizerError(
            f"{path}: field 'eos_token_id' must be an id or a list of ids, found {value!r}"
        )
    return set(values)


def _chat_template(value: object, path: Path) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if (
                isinstance(entry, dict)
                and entry.get("name") == "default"
                and isinstance(entry.get("template"), str)
            ):
                return str(entry["template"])
        raise TokenizerError(
            f"{path}: field 'chat_template' is a list without a template named 'default'"
        )
    raise TokenizerError(
        f"{path}: field 'chat_template' must be a string or a list of named templates"
    )


def _added_tokens_decoder(value: object, path: Path) -> list[AddedToken]:
    where = f"{path}: field 'added_tokens_decoder'"
    if not isinstance(value, dict):
        raise TokenizerError(f"{where} must be an object of id -> token")
    tokens = []
    for key, entry in value.items():
        if not (key.isascii() and key.isdecimal()) or len(key) > MAX_ID_DIGITS:
            raise TokenizerError(f"{where}: key {key[:40]!r} is not a token id")
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("content"), str)
            or not entry["content"]
        ):
            raise TokenizerError(f"{where}: entry {key} needs a non-empty 'content' string")
        tokens.append(
            AddedToken(
                content=entry["content"], id=int(key), special=bool(entry.get("special", False))
            )
        )
    return tokens


def read_model_dir_config(model_dir: Path) -> ModelDirConfig:
    config = ModelDirConfig()
    tokenizer_config_path = model_dir / "tokenizer_config.json"
    tokenizer_config = _read_json_object(tokenizer_config_path)
    if tokenizer_config is not None:
        config.chat_template = _chat_template(
            tokenizer_config.get("chat_template"), tokenizer_config_path
        )
        config.chat_template_source = str(tokenizer_config_path)
        for key in TEMPLATE_TOKEN_KEYS:
            token = _token_string(tokenizer_config.get(key), tokenizer_config_path, key)
            if token is not None:
                config.template_tokens[key] = token
        if "added_tokens_decoder" in tokenizer_config:
            config.added_tokens = _added_tokens_decoder(
                tokenizer_config["added_tokens_decoder"], tokenizer_config_path
            )
    template_file = model_dir / "chat_template.jinja"
    if template_file.is_file():
        try:
            config.chat_template = template_file.read_text(encoding="utf-8")
            config.chat_template_source = str(template_file)
        except UnicodeDecodeError as error:
            raise TokenizerError(f"{template_file}: not UTF-8 text (byte {error.start})") from None
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        document = _read_json_object(path)
        if document is not None:
            for eos_id in _eos_token_ids(document, path):
                config.eos_ids.setdefault(eos_id, str(path))
    return config
