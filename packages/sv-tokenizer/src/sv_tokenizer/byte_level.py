"""GPT-2's byte-level alphabet: the map between the 256 byte values and printable characters.

HF byte-level BPE vocabularies (tokenizer.json) spell every token in this alphabet so that a
token made of arbitrary bytes is still a printable JSON string: printable Latin-1 bytes stand
for themselves and the other 68 bytes (control characters, space, 0x7F-0xA0, 0xAD) are moved
to U+0100 and up, in byte order. The tiktoken format needs none of this: it stores raw bytes.
"""

from __future__ import annotations


def _build_byte_to_char() -> tuple[str, ...]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    next_free = 256
    for b in range(256):
        if b not in chars:
            chars[b] = chr(next_free)
            next_free += 1
    return tuple(chars[b] for b in range(256))


BYTE_TO_CHAR: tuple[str, ...] = _build_byte_to_char()
"""BYTE_TO_CHAR[b] is the character that spells byte b in a byte-level vocabulary."""


# str.translate table: alphabet characters -> the Latin-1 character of their byte; Latin-1
# characters outside the alphabet are deleted (so a changed length reveals them).
_TO_LATIN1: dict[int, int | None] = {
    **{b: None for b in range(256)},
    **{ord(c): b for b, c in enumerate(BYTE_TO_CHAR)},
}


def chars_to_bytes(token: str) -> bytes | None:
    """The bytes a byte-level token stands for, or None if it uses a character outside the alphabet."""
    latin1 = token.translate(_TO_LATIN1)
    if len(latin1) != len(token):
        return None
    try:
        return latin1.encode("latin-1")
    except UnicodeEncodeError:
        return None
