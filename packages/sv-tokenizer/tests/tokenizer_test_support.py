"""Corpus and hypothesis strategies shared by the sv-tokenizer tests (conftest puts this folder on sys.path)."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

from hypothesis import strategies as st

# An OpenAI tool definition, as clients send them.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _corpus() -> list[str]:
    zwj_family = "👨\u200d👩\u200d👧\u200d👦"
    return [
        "",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog. 1234567890",
        "DON'T I'Ll we'VE they'Re it'S she'D you'M SHE'LL ' 's 'S 'ſ",
        "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        'if (x != 0) { printf("%d\\n", x); }\r\n\treturn;\r\n',
        "\t\tindented\twith\ttabs\t\n\n\n",
        "trailing spaces   \n   leading spaces",
        " " * 17 + "x" + " " * 33,
        "\n" * 9 + "a" + "\r\n" * 5 + "\r" * 3,
        "12 123 1234 12345 123456789012345 3.14159 1e-10 0x1F 1,000,000",
        "٣٤٥ ١٢ ४५६ 三百 Ⅻ ½ ²³",  # non-ASCII digits and numbers
        "日本語のテキストと中文文本，还有한국어 텍스트。",
        "مرحبا بالعالم! هذا نص عربي. שלום עולם, זה טקסט בעברית.",
        "Здравствуй, мир! Ελληνικά κείμενα.",
        f"family {zwj_family} flag 🏳️\u200d🌈 skin 👍🏽 keycap 1️⃣ 🇯🇵🇫🇷",
        "e\u0301 a\u0300\u0316 Z\u0351\u0358\u0364\u036b combining ḍ̇ q̃",
        "control \x00\x01\x07\x08\x1b[31m\x7f\x85 chars \u200b\u200e\u2028\u2029 \ufeff",
        "supercalifragilisticexpialidocious" * 50,
        "a" * 10_000,
        "😀" * 300,
        "<|begin_of_text|> <|eot_id|><|start_header_id|>user<|end_header_id|> <|im_start|>",
        "<|not_a_special|> <| eot_id |> <|eot_id",
        "mixed: naïve café résumé coöperate — “quotes” ‘single’ … € £ ¥ ©",
        "https://example.com/path?query=1&other=two#frag user@example.com",
        "\u00a0non-breaking\u00a0space\u3000ideographic\u2009thin",
    ]


CORPUS = _corpus()


def assigned_characters() -> st.SearchStrategy[str]:
    """Any character assigned in this Python's Unicode database (no surrogates).

    Characters assigned only in newer Unicode versions than the oracles know (e.g. Unicode 17
    letters the `regex` module has and tiktoken's Rust regex lacks) are classified differently
    by the two regex engines; they are excluded here, and this is documented in the README.
    """
    return st.characters(exclude_categories=("Cs", "Cn"))


def unicode_text(max_size: int = 60) -> st.SearchStrategy[str]:
    return st.text(alphabet=assigned_characters(), max_size=max_size)


def tricky_text() -> st.SearchStrategy[str]:
    """Text biased toward pre-tokenization boundaries: whitespace, digits, apostrophes, letters."""
    pieces = st.sampled_from(
        [" ", "  ", "\n", "\r\n", "\t", "'", "'s", "'LL", "1", "123", "4567", "a", "Ab", "é", "日本", "😀",
         "\u200d", "!", "?!", "...", "<|eot_id|>", "<|im_end|>", "\u00a0", "\x0b", "\x85", "\u3000"]
    )  # fmt: skip
    return st.lists(st.one_of(pieces, unicode_text(8)), max_size=25).map("".join)


def all_assigned_characters() -> Iterator[str]:
    for code_point in range(0x110000):
        character = chr(code_point)
        if unicodedata.category(character) not in ("Cs", "Cn", "Co"):
            yield character


def tiny_tokenizer_document(
    merges: list[str] | None = None,
    added: list[tuple[str, int, bool]] | None = None,
) -> dict[str, object]:
    """A small but complete byte-level BPE tokenizer.json (GPT-2 alphabet, a few merges)."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())  # HF's own 256 byte-level characters
    vocab = {char: i for i, char in enumerate(alphabet)}
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w"] if merges is None else merges
    for merge in merges:
        merged = merge.replace(" ", "")
        vocab.setdefault(merged, len(vocab))
    added = added or []
    return {
        "version": "1.0",
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "special": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
            }
            for c, i, s in added
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "vocab": vocab,
            "merges": merges,
        },
    }


def tiny_tiktoken_file(
    extra: tuple[bytes, ...] = (b"he", b"ll", b"hell", b"hello", b" w"),
) -> bytes:
    """A small valid tiktoken BPE file: the 256 single bytes, then `extra`."""
    import base64

    tokens = [bytes([b]) for b in range(256)] + list(extra)
    return b"".join(base64.b64encode(t) + b" %d\n" % rank for rank, t in enumerate(tokens))


# The Llama 3 Instruct template (the one transformers' Llama 3 converter writes).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
