"""Token log-probabilities in OpenAI's response shapes.

chat:        {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
              "refusal": None}
completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}],
              "text_offset": [...]}; with echo the prompt's tokens come first, the very first
              with null log-probabilities (nothing precedes it).

A token is shown as its text, and a byte of it that is no whole UTF-8 character (a
character split across tokens) as `\\xNN`, as OpenAI shows one: distinct byte tokens stay
distinct among a position's top alternatives. Chat also gives each token's raw bytes, so a
client can join split characters back; completions' `text_offset` counts the characters of
the choice's text before each token, a split character counted once, where it starts: each
token advances it by the characters it adds to the text (a stop token, a skipped special token
or a BOS the echoed text leaves out adds none), which the caller gives with it.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import Any

from sv_engine import MAX_LOGPROBS, TokenLogprob
from sv_tokenizer import Tokenizer

from sv_server.request_parsing import Kind

# (token id, its log-probabilities or None, the characters its own text adds to the choice's,
# as the engine decoded it, wherever a stop string held part of it back or cut it): an echoed
# prompt's first token has no log-probabilities.
Scored = tuple[int, TokenLogprob | None, int]


class ScoredTokens:
    """One answer's scored tokens not given yet, each to be given with the text that completes
    its own: never earlier, so the entries given so far spell no more than the text shown so
    far (a stop string, a tool call or a think tag may hold a token's text back while later
    tokens are scored; several tokens may reach a stream at once), and never later. Text is
    counted in the characters each token's own text has as the engine decoded it (`Scored`):
    the text the stop strings let out, up to where a completed one cut it, whose cut tokens
    are only given by a take of them all (at the end of the answer, as the whole answer has
    them). A token of no text of its own goes with the text before it, unless it is a piece of
    a character (its bytes are no whole UTF-8 text): that one waits for the next token with
    text, which completes the character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._pending: list[Scored] = []
        self._given = 0  # the characters of the given tokens' own text
        # The generated tokens' bytes, as the engine's byte-level decoder took them: whether
        # a character they began is still incomplete (SentencePiece's: see _place_byte_run)
        self._byte_tokens = tokenizer.byte_fallback_ids
        self._bytes = None if self._byte_tokens else _utf8_decoder()
        self._run = bytearray()  # SentencePiece: the <0xXX> tokens' bytes not shown yet

    def append(self, scored: Scored) -> None:
        """A generated token's entry. A character its predecessors began and it breaks (it
        begins another: the decoder shows a U+FFFD, in this token's text) is counted on the
        last of them, where it starts, so that this token's offset is its own text's."""
        token_id, logprob, chars = scored
        if self._byte_tokens:
            self._pending.append(scored)
            self._place_byte_run()
            return
        if self._breaks_a_character(token_id, chars) and self._pending:
            before_id, before, before_chars = self._pending[-1]
            self._pending[-1] = (before_id, before, before_chars + 1)
            scored = (token_id, logprob, chars - 1)
        self._pending.append(scored)

    def _breaks_a_character(self, token_id: int, chars: int) -> bool:
        data = self._tokenizer.shown_bytes(token_id)
        if self._bytes is None or not data or (not chars and _whole(data)):
            return False  # (a token of no bytes, or one the text does not show: not decoded)
        began = bool(self._bytes.getstate()[0])  # bytes of an incomplete character
        self._bytes.decode(data)
        return began and chars > 0 and data[0] & 0xC0 != 0x80  # (not a continuation byte)

    def _place_byte_run(self) -> None:
        """SentencePiece: the decoder shows a run of `<0xXX>` tokens' text with the token that
        ends it (or, at the answer's end, with its last): each of the run's characters is
        counted on the token of its last byte (where a split character's is), so that the
        token after the run starts at its own text. (Run tokens given already: left as is.)"""
        token_id, logprob, chars = self._pending[-1]
        if token_id in self._byte_tokens:
            self._run += self._tokenizer.shown_bytes(token_id)
            if not chars:
                return  # the run goes on
            ends, after = len(self._pending), 0  # the answer ended on it: its text is the run's
        elif not self._run or not chars:
            return  # (a token the text does not show: the decoder never saw it)
        else:
            ends, after = len(self._pending) - 1, 1
        run, self._run = bytes(self._run), bytearray()
        shares = _run_shares(run)
        start = ends - len(run)
        moved = sum(shares)
        run_tokens = self._pending[start:ends] if start >= 0 else []
        shown_before = run_tokens if after else run_tokens[:-1]  # (none of the run's text)
        if (
            len(run_tokens) != len(run)
            or any(t not in self._byte_tokens for t, _, _ in run_tokens)
            or any(c for _, _, c in shown_before)
            or moved > chars
            or (not after and moved != chars)
        ):
            return  # (not the run as decoded: a hidden token in it, or part of it given)
        for i, share in enumerate(shares):
            run_id, run_logprob, _ = self._pending[start + i]
            self._pending[start + i] = (run_id, run_logprob, share)
        if after:
            self._pending[-1] = (token_id, logprob, chars - moved)

    def extend(self, scored: Iterable[Scored]) -> None:
        self._pending.extend(scored)

    def take(self, shown: int | None = None) -> list[Scored]:
        """The tokens not given yet whose own text ends within the answer's first `shown`
        characters; None: all of them."""
        count, given = len(self._pending), self._given
        if shown is None:
            given += sum(chars for _, _, chars in self._pending)
        else:
            count, end = 0, given
            for i, (token_id, _, chars) in enumerate(self._pending):
                end += chars
                if end > shown:
                    break
                if chars or not self._piece_of_a_character(token_id):
                    count, given = i + 1, end
        taken, self._pending = self._pending[:count], self._pending[count:]
        self._given = given
        return taken

    def _piece_of_a_character(self, token_id: int) -> bool:
        # (a <0xXX> token's text waits for the end of its run)
        return token_id in self._byte_tokens or not _whole(self._tokenizer.shown_bytes(token_id))


def _whole(data: bytes) -> bool:
    """Whether `data` is whole UTF-8 text (no piece of a character)."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _run_shares(run: bytes) -> list[int]:
    """The characters of a run of `<0xXX>` tokens' text (`fallback_run_text`'s) counted on
    each of its bytes: a character on its last byte; a run of no valid UTF-8 is a U+FFFD for
    each byte."""
    try:
        text = run.decode("utf-8")
    except UnicodeDecodeError:
        return [1] * len(run)
    shares = [0] * len(run)
    at = 0
    for character in text:
        at += len(character.encode("utf-8"))
        shares[at - 1] = 1
    return shares


def _utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


class LogprobsWriter:
    """Renders one choice's log-probabilities, chunk after chunk (completions' text offsets
    run on across chunks). `top`: the alternatives shown per token (an echoed prompt's may
    have been scored with more, for vLLM's prompt_logprobs)."""

    def __init__(self, kind: Kind, tokenizer: Tokenizer, top: int = MAX_LOGPROBS) -> None:
        self._kind = kind
        self._tokenizer = tokenizer
        self._top = top
        self._offset = 0  # completions: where the next token's text starts in the choice's text

    def scored_tokens(self) -> ScoredTokens:
        """An answer's tokens to score, to be rendered here as they are given."""
        return ScoredTokens(self._tokenizer)

    def render(self, scored: Sequence[Scored]) -> dict[str, Any]:
        # (the Responses API's output_text logprobs are chat's entries)
        return self._completion(scored) if self._kind == "completion" else self._chat(scored)

    def _text(self, token_id: int) -> str:
        return _shown(self._tokenizer.shown_bytes(token_id))

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": self._text(token_id),
            "logprob": logprob,
            "bytes": list(self._tokenizer.shown_bytes(token_id)),
        }

    def _chat(self, scored: Sequence[Scored]) -> dict[str, Any]:
        content = []
        for token_id, lp, _ in scored:
            assert lp is not None  # chat has no echo
            entry = self._entry(token_id, lp.logprob)
            entry["top_logprobs"] = [self._entry(t, v) for t, v in lp.top[: self._top]]
            content.append(entry)
        return {"content": content, "refusal": None}

    def _completion(self, scored: Sequence[Scored]) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token_id, lp, characters in scored:
            tokens.append(self._text(token_id))
            offsets.append(self._offset)
            self._offset += characters
            token_logprobs.append(None if lp is None else lp.logprob)
            top.append(None if lp is None else self._completion_top(token_id, lp))
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def _completion_top(self, token_id: int, lp: TokenLogprob) -> dict[str, float]:
        """A position's top alternatives by text, and the chosen token's own entry when it is
        not among them: OpenAI's completions "always return the logprob of the sampled token",
        so a position has up to K + 1 entries (vLLM's too)."""
        shown = lp.top[: self._top]
        top = {self._text(t): v for t, v in shown}
        if all(t != token_id for t, _ in shown):
            top.setdefault(self._text(token_id), lp.logprob)
        return top


# vLLM's stand-in for a log-probability of -inf, which JSON cannot carry.
LOWEST_LOGPROB = -9999.0


class PromptLogprobsWriter:
    """vLLM's `prompt_logprobs` of one prompt: for each of its tokens, None for the first
    (nothing precedes it), else {token id (a string): {"logprob", "rank", "decoded_token"}}:
    the prompt token's own entry first, then the `k` most likely tokens, ranked 1..k (the
    prompt token's own entry, where it is one of them, in its place first with its rank
    there), as vLLM's. A token is shown as completions' logprobs show it (a byte of no whole
    character as `\\xNN`, where vLLM's decode shows U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, k: int) -> None:
        self._tokenizer = tokenizer
        self._k = k

    def render(
        self, scored: Sequence[TokenLogprob | None]
    ) -> list[dict[str, dict[str, Any]] | None]:
        return [None if lp is None else self._position(lp) for lp in scored]

    def _position(self, lp: TokenLogprob) -> dict[str, dict[str, Any]]:
        entries = {str(lp.token_id): self._entry(lp.token_id, lp.logprob, lp.rank)}
        for rank, (token_id, logprob) in enumerate(lp.top[: self._k], start=1):
            entries[str(token_id)] = self._entry(token_id, logprob, rank)
        return entries

    def _entry(self, token_id: int, logprob: float, rank: int | None) -> dict[str, Any]:
        return {
            "logprob": max(logprob, LOWEST_LOGPROB),
            "rank": rank,
            "decoded_token": _shown(self._tokenizer.shown_bytes(token_id)),
        }


def _shown(data: bytes) -> str:
    """A token's bytes as its text: a byte of no whole UTF-8 character as `\\xNN`."""
    return data.decode("utf-8", errors="backslashreplace")
