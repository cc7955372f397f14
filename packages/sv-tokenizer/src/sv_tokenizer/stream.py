"""Incremental decoding for streaming generation.

A token can end in the middle of a multi-byte UTF-8 character (an emoji is often 2-4 byte
tokens), so decoding token by token would print U+FFFD garbage. StreamDecoder keeps the
bytes of an unfinished character until the next token completes it, and emits only whole
characters: the concatenation of every push() and the final flush() equals
`tokenizer.decode(all_ids)` exactly (Python's incremental UTF-8 decoder follows the same
one-U+FFFD-per-invalid-sequence rule as the one-shot decode).

A SentencePiece-style tokenizer decodes differently (sentencepiece_bpe.py), and the stream
follows it: a run of `<0xXX>` tokens is held until a token of another kind (or the flush) ends
it, because one invalid byte anywhere in the run turns the whole run into U+FFFDs; and the one
leading space decoding drops is dropped from the first text the stream emits (or, for HF's
Metaspace decoder, every space of the first token), unless the stream is a `continuation` (as
`Tokenizer.decode`'s).
"""

from __future__ import annotations

import codecs

from .sentencepiece_bpe import LeadingSpace, fallback_run_text
from .tokenizer import Tokenizer


class StreamDecoder:
    def __init__(self, tokenizer: Tokenizer, *, continuation: bool = False) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._byte_run = bytearray()  # <0xXX> tokens not yet ended by another token
        self._drops_space = tokenizer.leading_space is LeadingSpace.ONE and not continuation
        self._continuation = continuation
        self._first_token = not continuation  # still to come, for LeadingSpace.FIRST_TOKEN
        self._at_start = True  # nothing emitted yet: the leading space is still to drop

    def push(self, token_id: int) -> str:
        """The text that became complete with this token (often '', never a cut character)."""
        data = self._tokenizer.token_bytes(token_id)
        if self._first_token:
            self._first_token = False
            if self._tokenizer.drops_spaces_of(token_id):
                data = data.replace(b" ", b"")
        if token_id in self._tokenizer.byte_fallback_ids:
            self._byte_run += data
            return ""
        return self._emit(self._end_byte_run() + self._utf8.decode(data))

    def flush(self) -> str:
        """Whatever is left: U+FFFD for a character the stream ended in the middle of."""
        text = self._emit(self._end_byte_run() + self._utf8.decode(b"", final=True))
        self._utf8.reset()
        self._at_start = True
        self._first_token = not self._continuation
        return text

    def _end_byte_run(self) -> str:
        if not self._byte_run:
            return ""
        text = fallback_run_text(bytes(self._byte_run))
        self._byte_run.clear()
        return text

    def _emit(self, text: str) -> str:
        if self._at_start and text:
            self._at_start = False
            if self._drops_space and text.startswith(" "):
                return text[1:]
        return text
