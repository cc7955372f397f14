"""Structured output: what a constrained request must match, and its matcher (llguidance).

A `Grammar` names the constraint (a JSON schema, any JSON object, a regex, a choice of strings,
an EBNF/Lark grammar). `Grammars` turns one into a per-request `GrammarMatcher` over the model's
vocabulary, built from sv's own tokenizer (each id's bytes), never from a hub download. The
engine advances each matcher with every token its request is given, and before each step's
sampling asks `Grammars.bitmask` for the rows' token bitmasks (computed on the host, in
parallel across matchers, while the device runs the forward pass); the sampler applies them.
A matcher may wait for a token before its grammar starts (a reasoning model's `</think>`: the
thinking is free text, the answer after it is constrained); the engine masks nothing for it
until then.

The masks are computed on the engine's thread, so one request's grammar costs every request
its time. The library's lexer runs on fuel: this engine gives it a tenth of the default to start
and a quarter for each mask after (`_INITIAL_LEXER_FUEL`, `_STEP_LEXER_FUEL`). A regex built to
explode (`(a{1000}){1000}`) took 2.0 s for its first mask and 1.4 s for each one after at the
defaults on the 2-core development machine, 0.12 s and 0.09 s with these; ordinary regexes,
JSON schemas (a 60-property one) and grammars take well under a millisecond either way. (That
regex puts its matcher in its error state after a few tokens, at either setting.)

When the grammar is complete, the mask allows only the model's stop tokens, so the grammar's
end ends the request like any stop token (even under ignore_eos: see `Engine.add_request`).
Why llguidance rather than xgrammar: BENCHMARKS.md, "Grammar library". It is imported at the
first constrained request, so an engine that never sees one does not need it installed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from sv_model import TokenBitmask
from sv_tokenizer import Tokenizer

from sv_engine.errors import EngineError

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions

GrammarKind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]
# No free whitespace between JSON tokens: the library's default allows any run of it, and a
# model that keeps choosing newlines (a weak or random one does) never reaches the end.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
# The lexer's fuel (llguidance.LLParserLimits) when it first builds a grammar's regexes, and for
# each mask after: the library's defaults are 1,000,000 and 200,000 (see the module doc).
_INITIAL_LEXER_FUEL, _STEP_LEXER_FUEL = 100_000, 50_000


@dataclass(frozen=True)
class Grammar:
    """A constraint on a request's output. `source` is the schema as JSON text (json_schema),
    the regex, the choices as a JSON list of strings (choice), or EBNF/GBNF/Lark text (grammar);
    json_object takes none. Build with the class methods; `compile` checks it."""

    kind: GrammarKind
    source: str = ""

    @classmethod
    def json_schema(cls, schema: Any) -> Grammar:
        if not isinstance(schema, dict | bool):
            raise EngineError(f"a JSON schema is an object, got {type(schema).__name__}")
        # A boolean is a schema too: true matches any value, as {} does (the library takes
        # only objects once options apply); false matches none, so no output could be made.
        if schema is False:
            raise EngineError("the schema false matches no value, so nothing could be generated")
        return cls("json_schema", json.dumps({} if schema is True else schema))

    @classmethod
    def json_object(cls) -> Grammar:
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", _text("regex", pattern))

    @classmethod
    def choice(cls, choices: Sequence[str]) -> Grammar:
        if isinstance(choices, str) or not choices:
            raise EngineError("a choice needs a non-empty list of strings")
        if not all(isinstance(c, str) for c in choices):
            raise EngineError("every choice must be a string")
        return cls("choice", json.dumps(list(choices)))

    @classmethod
    def ebnf(cls, grammar: str) -> Grammar:
        return cls("grammar", _text("grammar", grammar))

    def compile(self) -> str:
        """The llguidance grammar for this constraint; EngineError naming the problem when the
        library cannot compile it (a bad schema, regex or grammar)."""
        import llguidance

        try:
            if self.kind == "json_object":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    {"type": "object"}, overrides=_JSON_OPTIONS
                )
            elif self.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    self.source, overrides=_JSON_OPTIONS
                )
            elif self.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(self.source)
            elif self.kind == "choice":
                grammar = llguidance.grammar_from("choice", self.source)
            else:
                grammar = llguidance.grammar_from("grammar", self.source)
        except (ValueError, TypeError, RuntimeError) as e:  # how the library reports bad input
            raise EngineError(f"the {self.kind} cannot be compiled: {e}") from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise EngineError(f"the {self.kind} cannot be compiled: {messages[0]}")
        return grammar


def _text(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise EngineError(f"a {kind} must be a non-empty string, got {value!r}")
    return value


class GrammarMatcher:
    """One request's position in its grammar.

    With `after_token` (a reasoning model's `</think>`), the grammar binds only the tokens
    after the first one of that id: until the request is given it, the matcher is `waiting`,
    masks nothing and consumes nothing; that token itself is not the grammar's either, so the
    grammar starts from its initial state on the token after it. With `wait_opener` too (its
    `<think>`), the wait starts only if the request's first token is that one: any other first
    token is already the grammar's, so the first mask allows the grammar's tokens and
    `wait_opener` (`also_allowed`).

    `allowed_ids`: the request's allowed_token_ids. Sampling bans every other id too, so where
    none of them is in the grammar's mask, every logit is banned and the sampled token is
    neither's: the matcher then fails naming allowed_token_ids, not the token it got."""

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        after_token: int | None = None,
        wait_opener: int | None = None,
        allowed_ids: frozenset[int] | None = None,
    ) -> None:
        self._matcher = matcher
        self._after_token = after_token  # None once given (or when the grammar binds at once)
        self._wait_opener = wait_opener  # None once the first token is given
        self._allowed_ids = allowed_ids
        self.error: str | None = None  # why the matcher failed, once it has

    @property
    def waiting(self) -> bool:
        """Whether the grammar has not started yet: its request's token is not to be masked."""
        return self._after_token is not None and self._wait_opener is None

    @property
    def also_allowed(self) -> int | None:
        """A token the mask allows beside the grammar's: the wait's opener, before the first
        token."""
        return self._wait_opener

    def accept(self, token: int) -> None:
        """Advance by the token the request was given. A token the mask did not allow, or a
        grammar past the lexer's limits (`_STEP_LEXER_FUEL`), puts the matcher in its error
        state (`error` says why), whose mask allows only the stop tokens: the request ends,
        and the engine reports it as failed (finish_reason "error"), not as stopped."""
        if self._wait_opener is not None:
            opener, self._wait_opener = self._wait_opener, None
            if token == opener:
                return  # the wait for after_token starts
            self._after_token = None  # this first token is the grammar's
        if self._after_token is not None:
            if token == self._after_token:
                self._after_token = None
            return
        if self.error is None and self._allowed_ids is not None and token not in self._allowed_ids:
            self.error = (
                "no token of allowed_token_ids is one the output constraint allows at this point"
            )
        self._matcher.consume_token(token)
        if self.error is None and self._matcher.is_error():
            self.error = self._matcher.get_error().splitlines()[0]

    def draft_prefix(self, draft: Sequence[int], stop_ids: frozenset[int]) -> int:
        """How many tokens of a speculative draft to verify: those the grammar allows from
        here, up to the first stop token. A token the grammar rejects could never be chosen
        (the mask bans it), so verifying it or anything after it is wasted; a stop token would
        end the request if chosen, so nothing after it is ever kept, and the matcher has no
        mask once it is consumed. While `waiting`, the draft is verified up to (not including)
        the token the grammar waits for: the choice after that token needs the grammar's first
        mask, and a verify step's masks are made before it knows whether the token is kept."""
        if self._wait_opener is not None:
            return 0  # (a first token is sampled at the prompt's end, where nothing is drafted)
        if self._after_token is not None:
            return next((i for i, t in enumerate(draft) if t == self._after_token), len(draft))
        stop = next((i for i, t in enumerate(draft) if t in stop_ids), len(draft))
        return min(stop, self._matcher.validate_tokens(list(draft[:stop])))

    @property
    def matcher(self) -> llguidance.LLMatcher:
        return self._matcher


class Grammars:
    """Matchers over one model's vocabulary. The library's view of the vocabulary takes about
    a second to build (BENCHMARKS.md), so it is built at the first constrained request."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width (may exceed the tokenizer's)
        # (A stop id past the logits, a tokenizer's that the model never emits, is left out.)
        self._stop_ids = sorted(t for t in stop_ids if t < vocab_size)
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None

    def matcher(
        self,
        grammar: Grammar,
        after_token: int | None = None,
        wait_opener: int | None = None,
        allowed_ids: frozenset[int] | None = None,
    ) -> GrammarMatcher:
        """A matcher of `grammar`; with `after_token` (and `wait_opener`), one that binds only
        the tokens after the first of that id (see GrammarMatcher). With `allowed_ids` (the
        request's allowed_token_ids), a grammar that binds at once must allow one of them
        first, or no token could be sampled: refused here, naming allowed_token_ids."""
        import llguidance

        matcher = llguidance.LLMatcher(
            self._vocabulary(),
            grammar.compile(),
            log_level=0,
            limits=llguidance.LLParserLimits(
                initial_lexer_fuel=_INITIAL_LEXER_FUEL, step_lexer_fuel=_STEP_LEXER_FUEL
            ),
        )
        if matcher.is_error():
            raise EngineError(f"the {grammar.kind} cannot be compiled: {matcher.get_error()}")
        constrained = GrammarMatcher(matcher, after_token, wait_opener, allowed_ids)
        if allowed_ids is not None and not constrained.waiting:
            mask = self.bitmask([([0], constrained, ())])
            assert mask is not None
            bits = mask.words.view(np.uint32)[0]
            ids = np.fromiter(allowed_ids, np.int64)
            if not ((bits[ids // 32] >> (ids % 32).astype(np.uint32)) & 1).any():
                raise EngineError.bad_field(
                    "allowed_token_ids",
                    f"has no token the {grammar.kind} allows first, so nothing could be generated",
                )
        return constrained

    def bitmask(
        self, rows: Sequence[tuple[Sequence[int], GrammarMatcher, Sequence[int]]]
    ) -> TokenBitmask | None:
        """The token bitmasks of a step's constrained choices; None when there are none. Each
        entry is (choice rows, matcher, draft): the first choice row gets the matcher's mask;
        with a draft (a verify step; `draft_prefix` checked it), row j + 1 gets the mask once
        draft[:j + 1] is consumed, and the matcher is left where it was. A matcher whose
        grammar is complete allows only the stop tokens."""
        import llguidance
        import llguidance.numpy

        live = list(rows)
        if not live:
            return None
        targets = [row for choice_rows, _, _ in live for row in choice_rows]
        words = np.empty(((len(targets), (self.vocab_size + 31) // 32)), dtype=np.int32)
        if len(live) == 1 and not live[0][2]:
            llguidance.numpy.fill_next_token_bitmask(live[0][1].matcher, words, 0)
            _allow_also(words, live)
            return TokenBitmask(rows=targets, words=words)
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        # (The library's call with drafts takes only non-empty ones.)
        pairs: list[tuple[llguidance.LLMatcher, int]] = []
        drafted: list[tuple[llguidance.LLMatcher, int, list[int]]] = []
        at = 0
        for choice_rows, m, draft in live:
            if draft:
                drafted.append((m.matcher, at, list(draft)))
            else:
                pairs.append((m.matcher, at))
            at += len(choice_rows)
        if pairs:
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, pairs, words)
        if drafted:
            llguidance.numpy.fill_next_token_bitmask_par_with_draft_tokens(
                self._executor, drafted, words
            )
        _allow_also(words, live)
        return TokenBitmask(rows=targets, words=words)

    def _vocabulary(self) -> llguidance.LLTokenizer:
        import llguidance

        if self._lltokenizer is None:
            self._lltokenizer = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(
                    _Vocabulary(self._tokenizer, self.vocab_size, self._stop_ids)
                ),
                n_vocab=self.vocab_size,
                eos_token=self._stop_ids,
            )
        return self._lltokenizer


def _allow_also(
    words: np.ndarray, live: Sequence[tuple[Sequence[int], GrammarMatcher, Sequence[int]]]
) -> None:
    """Set the bit of each matcher's `also_allowed` token in its first row of `words`."""
    bits = words.view(np.uint32)  # (bit 31 of a word is its int32 sign)
    at = 0
    for choice_rows, m, _ in live:
        token = m.also_allowed
        if token is not None:
            bits[at, token // 32] |= np.uint32(1 << (token % 32))
        at += len(choice_rows)


class _Vocabulary:
    """sv's tokenizer as llguidance's TokenizerWrapper reads it: each id's bytes (special
    tokens are flagged, so their names never match text), and an encode function."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = stop_ids[0]
        self.bos_token_id = tokenizer.bos_id
        # Ids the model cannot produce (beyond its logits) are left out. Ids the tokenizer
        # lacks (the model's padding rows: Qwen pads 151,669 tokens to 151,936) are named as
        # special tokens no text or grammar matches: the library sizes its bitmask by this
        # list (its n_vocab does not), and the mask must span every logit.
        size = min(tokenizer.vocab_size, vocab_size)
        padding = range(size, vocab_size)
        self.tokens = [tokenizer.shown_bytes(i) for i in range(size)]
        self.tokens += [f"<|sv padding {i}|>".encode() for i in padding]
        special = [i for i in tokenizer.special_tokens.values() if i < size]
        self.special_token_ids = sorted([*special, *padding])

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", errors="replace"))
