"""Incremental decoding for streaming generation.

A token can end in the middle of a multi-byte UTF-8 character (an emoji is often 2-4 byte
tokens), so decoding token by token would print U+FFFD garbage. StreamDecoder keeps the
bytes of an unfinished character until the next token completes it, and emits only whole
characters: the concatenation of every push() and the final flush() equals
`tokenizer.decode(all_ids)` exactly (Python's incremental UTF-8 decoder follows the same
one-U+FFFD-per-invalid-sequence rule as the one-shot decode).
"""

from __future__ import annotations

import codecs

from .tokenizer import Tokenizer


class StreamDecoder:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that became complete with this token (often '', never a cut character)."""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is left: U+FFFD for a character the stream ended in the middle of."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
