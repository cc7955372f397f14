"""Pre-tokenization: cutting text into the pieces that BPE then merges one at a time.

BPE never merges across two pieces, so a regex decides where words, numbers, punctuation
and whitespace runs begin and end. Every pre-tokenizer this package supports is a regex
"split" that keeps each match as its own piece (HF's `Isolated` behaviour):

- tiktoken's and HF `Split(Regex)`: the model's own pattern (Llama 3: `LLAMA3_PATTERN`);
- HF `ByteLevel` with `use_regex: true`: GPT-2's pattern (`GPT2_PATTERN`);
- HF `Digits`: every digit alone (`individual_digits`) or digit runs;

and a `Sequence` applies them in turn, each one to every piece the previous one made.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import regex  # type: ignore[import-untyped]  # (no types-regex in the lock)

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Llama 3's pre-tokenization pattern (the same string in tokenizer.model's reference code and
in tokenizer.json's `Split` pre-tokenizer)."""

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
"""The pattern HF's `ByteLevel` pre-tokenizer applies when `use_regex` is true."""

INDIVIDUAL_DIGITS_PATTERN = r"\p{N}"
DIGIT_RUNS_PATTERN = r"\p{N}+"
"""HF `Digits`: Rust's `char::is_numeric` is exactly the Unicode categories Nd, Nl and No, \\p{N}."""


TOTAL_PATTERNS = frozenset({LLAMA3_PATTERN, GPT2_PATTERN})
r"""Patterns whose matches tile any text: at every position one alternative matches at least one
character (a letter starts `\p{L}+`, a digit `\p{N}`, whitespace `\s+`, anything else the
`[^\s\p{L}\p{N}]+` run), so findall() never skips a character nor returns an empty match."""


class RegexSplit:
    """Cut text at the matches of one regex; matches and the gaps between them become pieces."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._regex = regex.compile(pattern)
        self._is_total = pattern in TOTAL_PATTERNS
        # findall() returns groups instead of whole matches when the pattern captures.
        self._findall_gives_matches = self._regex.groups == 0

    def split(self, text: str) -> list[str]:
        if self._is_total:
            return self._regex.findall(text)  # type: ignore[no-any-return]
        if self._findall_gives_matches:
            pieces: list[str] = self._regex.findall(text)
            # Still fast when the matches happen to cover the text: a length check is much
            # cheaper than walking match objects.
            if sum(map(len, pieces)) == len(text):
                if "" in pieces:
                    pieces = [p for p in pieces if p]
                return pieces
        return self._split_with_gaps(text)

    def _split_with_gaps(self, text: str) -> list[str]:
        pieces: list[str] = []
        position = 0
        for match in self._regex.finditer(text):
            start, end = match.span()
            if start > position:
                pieces.append(text[position:start])
            if end > start:
                pieces.append(text[start:end])
            position = max(position, end)
        if position < len(text):
            pieces.append(text[position:])
        return pieces


class PreTokenizer:
    """A chain of regex splits; with no split at all the whole text is one piece. `nfc`:
    the text is put in Unicode NFC first (Qwen's `normalizer`)."""

    def __init__(self, splits: Sequence[RegexSplit], *, nfc: bool = False) -> None:
        self.splits = tuple(splits)
        self.nfc = nfc

    @classmethod
    def from_pattern(cls, pattern: str) -> PreTokenizer:
        return cls([RegexSplit(pattern)])

    def __call__(self, text: str, at_start: bool = True) -> list[str]:
        """The pieces of `text` (`at_start`, whether it starts the input, changes nothing
        here; see `sentencepiece_bpe.Pieces`)."""
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        if not self.splits:
            return [text] if text else []
        first, *rest = self.splits
        pieces = first.split(text)
        for step in rest:
            pieces = [smaller for piece in pieces for smaller in step.split(piece)]
        return pieces
