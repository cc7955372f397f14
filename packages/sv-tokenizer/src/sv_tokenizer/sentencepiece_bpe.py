"""SentencePiece-style BPE with byte fallback, as HF `tokenizer.json` spells it (Mistral, Llama 2).

Unlike byte-level BPE, the vocabulary is of Unicode text where a space is written `▁`
(U+2581), and the merges start from characters, not bytes. A character with no token of its
own becomes the `<0xXX>` tokens of its UTF-8 bytes (`byte_fallback`), else the unknown token.
Two layouts of the same rules exist:

- Llama 2 / Mistral v0.1: `normalizer` = Sequence[Prepend("▁"), Replace(" " -> "▁")], no
  pre-tokenizer: every stretch of text between added tokens gets a `▁` in front;
- tokenizers >= 0.19 (Mistral v0.3): no normalizer, `pre_tokenizer` = Metaspace(replacement
  "▁", prepend_scheme "first" | "always" | "never", split): with "first" only the stretch at
  the very start of the text gets one, and never a second one.

Decoding turns `▁` back into spaces and `<0xXX>` into its byte; the decoder's Strip (or
Metaspace's) then drops one leading space of the whole text: the `▁` encoding put there.
HF's ByteFallback decodes each run of consecutive `<0xXX>` tokens as a whole: its text when the
run is valid UTF-8, else one U+FFFD per token of the run (not Python's one per invalid
sequence), so `fallback_run_text` is how sv decodes a run too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum

import regex  # type: ignore[import-untyped]  # (no types-regex in the lock)

from .bpe import PairMerger

SPACE_MARKER = "\u2581"


class LeadingSpace(Enum):
    """What decoding drops at the start of a text (not of a continuation), as HF's decoders."""

    KEPT = "kept"  # byte-level BPE, or a SentencePiece decoder without a Strip
    ONE = "one"  # a decoder ending in Strip(" ", 1, 0): the text's first space
    FIRST_TOKEN = "first token"  # HF's Metaspace decoder: every ▁ of the first token (not added)


_BYTE_TOKEN = regex.compile(r"<0x([0-9A-Fa-f]{2})>")
# Metaspace's split: a new piece starts at every marker (HF's MergedWithNext).
_MARKER_WORDS = regex.compile(SPACE_MARKER + "[^" + SPACE_MARKER + "]*|[^" + SPACE_MARKER + "]+")

Pieces = Callable[[str, bool], list[str]]
"""Text between added tokens -> the pieces BPE merges; the flag says whether the text starts
the whole input (Metaspace's prepend_scheme "first" needs to know)."""


def token_text_bytes(token: str, *, byte_tokens: bool = True) -> bytes:
    """What a vocabulary entry decodes to: `<0xXX>` its byte (`byte_tokens`: the decoder has
    ByteFallback; else its text), anything else its text with `▁` as a space."""
    byte = _BYTE_TOKEN.fullmatch(token)
    if byte is not None and byte_tokens:
        return bytes([int(byte.group(1), 16)])
    return token.replace(SPACE_MARKER, " ").encode("utf-8")


def fallback_run_text(run: bytes) -> str:
    """The text of a run of consecutive `<0xXX>` tokens, as HF's ByteFallback decoder gives it."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


def byte_fallback_text(tokens: Iterable[tuple[bytes, bool]]) -> str:
    """The text of (token bytes, is a `<0xXX>` token) pairs: runs of byte tokens decoded by
    `fallback_run_text`, every other token its own (always valid) UTF-8 text."""
    parts: list[str] = []
    run = bytearray()
    for data, is_byte_token in tokens:
        if is_byte_token:
            run += data
            continue
        if run:
            parts.append(fallback_run_text(bytes(run)))
            run.clear()
        parts.append(data.decode("utf-8", errors="replace"))
    parts.append(fallback_run_text(bytes(run)))
    return "".join(parts)


class SpaceMarkerPieces:
    """Spaces written as `▁`, one `▁` put in front (see the module doc), then the text cut
    into pieces: whole (Llama 2, Metaspace split=false) or at each `▁` (split=true)."""

    def __init__(self, prepend: str, *, prepend_twice: bool, split: bool) -> None:
        self.prepend = prepend  # "always", "first" or "never"
        self.prepend_twice = prepend_twice  # Prepend adds one even before a leading marker
        self.split = split

    def __call__(self, text: str, at_start: bool) -> list[str]:
        if not text:
            return []
        text = text.replace(" ", SPACE_MARKER)
        wanted = self.prepend == "always" or (self.prepend == "first" and at_start)
        if wanted and (self.prepend_twice or not text.startswith(SPACE_MARKER)):
            text = SPACE_MARKER + text
        return _MARKER_WORDS.findall(text) if self.split else [text]


class CharPairMerger(PairMerger):
    """HF BPE over characters: each character starts as its own token, or its byte-fallback
    tokens, or the unknown token; then the listed merges apply as in `PairMerger`."""

    def __init__(
        self,
        char_ids: dict[str, int],
        pair_ranks: dict[tuple[int, int], int],
        merged_ids: list[int],
        *,
        byte_token_ids: list[int] | None,
        unk_id: int | None,
        fuse_unk: bool,
    ) -> None:
        super().__init__([-1] * 256, pair_ranks, merged_ids, unk_id=unk_id, fuse_unk=fuse_unk)
        self.char_ids = char_ids
        self.byte_token_ids = byte_token_ids  # by byte value, when every one exists

    def encode(self, data: bytes) -> list[int]:
        ids: list[int] = []
        previous_was_unk = False
        for char in data.decode("utf-8"):
            token_id = self.char_ids.get(char)
            if token_id is not None:
                ids.append(token_id)
                previous_was_unk = False
            elif self.byte_token_ids is not None:
                ids += [self.byte_token_ids[b] for b in char.encode("utf-8")]
                previous_was_unk = False
            elif self.unk_id is not None:
                if not (self.fuse_unk and previous_was_unk):
                    ids.append(self.unk_id)
                previous_was_unk = True
        return self.merge(ids)
