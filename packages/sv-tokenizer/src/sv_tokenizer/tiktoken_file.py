"""The tiktoken BPE file (Llama 3's `tokenizer.model`): one `<base64 token> <rank>` per line.

The file holds only the mergeable tokens. The pre-tokenization pattern and the special tokens
are not in it: they are part of Meta's reference tokenizer code, reproduced here for Llama 3.
"""

from __future__ import annotations

import base64
import binascii

from .errors import TokenizerError
from .hf_json import MAX_ID_DIGITS

LLAMA3_NUM_SPECIAL_TOKENS = 256

LLAMA3_NAMED_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",  # end of message: the model wants a tool's result next
    "<|eot_id|>",  # end of turn
    "<|python_tag|>",
)


def llama3_special_tokens(num_base_tokens: int) -> dict[str, int]:
    """Llama 3.1/3.2's 256 special tokens, numbered from the end of the mergeable vocabulary.

    The order is that of Meta's reference `tokenizer.py` (and of the `added_tokens` of Meta's
    tokenizer.json): 11 named tokens, then `<|reserved_special_token_2|>` up to `_246|>`.
    HF's text-only checkpoints call id 128005 `<|reserved_special_token_2|>` instead of
    `<|step_id|>` (and shift the reserved numbers by one); only unused reserved names differ,
    and a model folder's tokenizer_config.json, when present, supplies its own names.
    """
    reserved = LLAMA3_NUM_SPECIAL_TOKENS - len(LLAMA3_NAMED_SPECIAL_TOKENS)
    names = [
        *LLAMA3_NAMED_SPECIAL_TOKENS,
        *(f"<|reserved_special_token_{2 + i}|>" for i in range(reserved)),
    ]
    return {name: num_base_tokens + i for i, name in enumerate(names)}


def _shorten(line: bytes) -> str:
    text = repr(line)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_tiktoken_bpe(data: bytes, source: str) -> dict[bytes, int]:
    """Parse the file's bytes into {token bytes: rank}; any bad line is a TokenizerError.

    `source` (the file's path) starts every error message, followed by the 1-based line.
    Blank lines are skipped, as tiktoken does.
    """
    ranks: dict[bytes, int] = {}
    line_of_rank: dict[int, int] = {}
    for line_number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source} line {line_number}"
        fields = line.split()
        if len(fields) != 2:
            raise TokenizerError(
                f"{where}: expected '<base64 token> <rank>', found {len(fields)} "
                f"field(s): {_shorten(line)}"
            )
        token_b64, rank_text = fields
        try:
            token = base64.b64decode(token_b64, validate=True)
        except (binascii.Error, ValueError):
            raise TokenizerError(
                f"{where}: token {_shorten(token_b64)} is not valid base64"
            ) from None
        if not token:
            raise TokenizerError(f"{where}: the token is empty")
        if not rank_text.isdigit():  # bytes.isdigit(): ASCII digits only, no sign, no '_'
            raise TokenizerError(
                f"{where}: rank {_shorten(rank_text)} is not a non-negative integer"
            )
        if len(rank_text) > MAX_ID_DIGITS:  # (ranks are dense from 0: a damaged line)
            raise TokenizerError(f"{where}: rank {_shorten(rank_text)} is too large")
        rank = int(rank_text)
        if rank in line_of_rank:
            raise TokenizerError(
                f"{where}: rank {rank} is already used on line {line_of_rank[rank]}"
            )
        if token in ranks:
            first_line = line_of_rank[ranks[token]]
            raise TokenizerError(f"{where}: token {token!r} is already listed on line {first_line}")
        line_of_rank[rank] = line_number
        ranks[token] = rank
    if not ranks:
        raise TokenizerError(f"{source}: no '<base64 token> <rank>' lines found")
    return ranks
