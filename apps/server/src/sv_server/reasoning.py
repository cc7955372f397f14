"""Reasoning output (vLLM's `--reasoning-parser`): a chat answer's thinking apart from its answer.

Models such as Qwen3 and DeepSeek-R1 think first, between `<think>` and `</think>`, then answer.
With `sv serve --reasoning-parser qwen3` (or `deepseek_r1`) a chat answer's text is split into
`message.reasoning` (the thinking, without the tags) and `message.content` (the rest);
streamed, the thinking comes as `delta.reasoning` and the answer as `delta.content`. The
thinking is under both of vLLM's names, the same text: `reasoning` (its newer one) and
`reasoning_content` (its older one, which earlier clients read), as vLLM's releases that
renamed the field sent both.

The rule, one for both parsers, over the answer's text (after stop strings, before tool calls):

- The prompt's last think tag decides first, as vLLM's `is_reasoning_end` over the prompt
  does, but only in the answer's own turn (the server passes the tail the prompt adds to the
  history: the generation prompt and a continued message; the thinking an earlier turn kept,
  or a user's quoted tag, says nothing of this answer): a `</think>` there (Qwen3 with `enable_thinking: false` renders an empty, closed think
  block; a prefilled `<think>...</think>`) means the thinking has ended: the answer is content.
- Else the thinking is open from the start when that last tag is a `<think>` (Qwen3-2507 and
  DeepSeek-R1 templates end the prompt so, and so does a prefilled `<think>...` with
  `continue_final_message`), or always under `deepseek_r1` (vLLM's rule: "R1 doesn't generate
  <think> now"). Otherwise it opens only if the answer starts with `<think>`: a model that
  chose not to think answers in `content` alone, with `reasoning_content: null`.
- A leading `<think>` is dropped; the thinking is the text up to the first `</think>`, the
  content is all after it, whitespace included (vLLM keeps Qwen3's "\\n\\n" after `</think>`),
  or null when nothing follows. Later tags are content text.
- No `</think>` (the answer ran out of `max_tokens` mid-thought): all of it is thinking, content
  null. (vLLM's streamed output does this; its non-streamed qwen3 parser returns the text as
  content instead. Here both agree.)

Streamed, text that may be the start of a tag is held back until it is known, so a tag is never
split across the two fields and the concatenated deltas equal the whole answer's fields.

An output constraint binds only the content, never the thinking (vLLM's reasoning-aware
structured output: the grammar starts after the first generated `</think>`), by the same rule
(`grammar_wait`): a prompt that ended the thinking is constrained from the first token; an
answer that is thinking from its start, after its first `</think>`; any other answer thinks
only if its first token is `<think>`, so that first token is `<think>` or the grammar's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sv_tokenizer import Tokenizer

THINK_START = "<think>"
THINK_END = "</think>"
REASONING_PARSERS = ("qwen3", "deepseek_r1")


@dataclass(frozen=True)
class ReasoningParser:
    """`name`: one of REASONING_PARSERS; the ids of the model's `<think>` and `</think>`."""

    name: str
    start_id: int
    end_id: int

    def ended_in_prompt(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt has ended the thinking already: its last think tag is `</think>`."""
        return self._last_tag(prompt_ids) == self.end_id

    def opens_in_thinking(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the answer to `prompt_ids` is thinking from its first character."""
        last = self._last_tag(prompt_ids)
        if last == self.end_id:
            return False
        return self.name == "deepseek_r1" or last == self.start_id

    def grammar_wait(self, prompt_ids: Sequence[int]) -> tuple[int | None, int | None]:
        """Where an output constraint on the answer to `prompt_ids` starts, as the engine's
        (grammar_after_token, grammar_wait_opener): so that it binds the content alone."""
        if self.ended_in_prompt(prompt_ids):
            return None, None
        if self.opens_in_thinking(prompt_ids):
            return self.end_id, None
        return self.end_id, self.start_id

    def _last_tag(self, prompt_ids: Sequence[int]) -> int | None:
        for token in reversed(prompt_ids):
            if token in (self.start_id, self.end_id):
                return token
        return None


def parser_for(name: str, tokenizer: Tokenizer) -> ReasoningParser:
    """The parser `name` for a model with this tokenizer; a ValueError naming the flag when
    the tokenizer has no `<think>` / `</think>` tokens whose text answers show."""
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {name!r}"
        )
    ids = []
    for tag in (THINK_START, THINK_END):
        encoded = tokenizer.encode(tag)
        if len(encoded) != 1:
            raise ValueError(
                f"--reasoning-parser {name}: the model's tokenizer has no {tag!r} token "
                f"({tokenizer.source}); this model does not think between <think> and "
                "</think>: leave the flag out"
            )
        if tag in tokenizer.special_tokens:
            raise ValueError(
                f"--reasoning-parser {name}: {tag!r} is a special token of the model's "
                f"tokenizer ({tokenizer.source}), left out of the answer's text, so the "
                "thinking cannot be told apart"
            )
        ids.append(encoded[0])
    return ReasoningParser(name, ids[0], ids[1])


def split_reasoning(text: str, opens_in_thinking: bool) -> tuple[str | None, str | None]:
    """A whole answer as (reasoning_content, content). Either is None when it has no text:
    reasoning_content when the answer did not think or its thinking is empty
    (`<think></think>`), content when nothing follows the thinking, as a stream, which sends
    no delta for a field without text, shows them."""
    if text.startswith(THINK_START):
        text = text[len(THINK_START) :]
    elif not opens_in_thinking:
        return None, text
    reasoning, _, content = text.partition(THINK_END)
    return reasoning or None, content or None


class ReasoningStream:
    """One streamed answer's text, piece by piece, as (reasoning, content) pieces."""

    def __init__(self, opens_in_thinking: bool) -> None:
        self._thinking = opens_in_thinking
        self._at_start = True  # nothing shown yet: a `<think>` here opens the thinking
        self._held = ""

    @property
    def held(self) -> str:
        """The answer's last text, held back: it may be (the start of) a think tag."""
        return self._held

    def push(self, text: str) -> tuple[str, str]:
        """The next piece of the answer -> the (reasoning, content) text now safe to show."""
        held = self._held + text
        if self._at_start:
            if len(held) < len(THINK_START) and THINK_START.startswith(held):
                self._held = held  # may still become `<think>`
                return "", ""
            self._at_start = False
            if held.startswith(THINK_START):
                held = held[len(THINK_START) :]
                self._thinking = True
        self._held = ""
        if not self._thinking:
            return "", held
        reasoning, tag, content = held.partition(THINK_END)
        if tag:
            self._thinking = False
            return reasoning, content
        kept = _partial_tag(held, THINK_END)
        self._held = held[len(held) - kept :]
        return held[: len(held) - kept], ""

    def finish(self) -> tuple[str, str]:
        """The text held back, once the answer has ended."""
        held, self._held = self._held, ""
        return (held, "") if self._thinking else ("", held)


class ReasoningTokens:
    """How many of one answer's tokens are its thinking: OpenAI's
    `usage.completion_tokens_details.reasoning_tokens`, pushed token by token (each token's
    text).

    By the text, as the split reads it (`split_reasoning`, `ReasoningStream`): a token is
    thinking when its text has a part of the thinking's text (or it has no text yet, a piece
    of a character, where the thinking is). So neither tag is counted, as in vLLM's count for
    its think-tag parsers (`count_reasoning_tokens`: the tokens strictly between `<think>` and
    `</think>`, or all after `<think>` when the thinking never ends), whether the model wrote a
    tag as its one added token or spelled it in ordinary ones ("</", "think", ">"): the split
    reads both as the tag, and a count by token id would count a spelled tag and all after it
    as thinking. Nor is the stop token counted (the caller does not push it: it is no text).

    The count so far never goes down: text that may be the start of `</think>` is counted
    once it is known not to be, or once the answer has ended (`finish`)."""

    def __init__(self, opens_in_thinking: bool) -> None:
        self.opens_in_thinking = opens_in_thinking
        self.count = 0
        self._length = 0  # of the answer's text so far
        self._head = ""  # its text while the start is not known (shorter than `<think>`)
        self._tail = ""  # its last characters, where a `</think>` may have begun
        self._ends: list[int] = []  # where each pushed token's text ends in it
        self._counted = 0  # how many of the tokens are decided (counted, or never to be)
        self._decided = False  # whether the start is known: a leading `<think>` or not
        self._start: int | None = None  # where the thinking starts (decided; None: no thinking)
        self._end: int | None = None  # where it ends: its `</think>`, once written
        self._finished = False

    def push(self, text: str) -> None:
        """The next token's text (empty for a piece of a character)."""
        window_at = self._length - len(self._tail)  # where `window` starts in the text
        window = self._tail + text
        self._length += len(text)
        self._ends.append(self._length)
        self._tail = window[max(len(window) - (len(THINK_END) - 1), 0) :]
        if not self._decided:
            self._head += text
            if len(self._head) < len(THINK_START) and THINK_START.startswith(self._head):
                return  # may still become `<think>`
            self._decide()
            window, window_at = self._head, 0
            self._head = ""
        if self._start is not None and self._end is None:
            at = window.find(THINK_END, max(self._start - window_at, 0))
            self._end = window_at + at if at >= 0 else None
        self._tally()

    def finish(self) -> None:
        """The answer has ended: what was held back as a possible tag is text."""
        if not self._decided:
            self._decide()
        self._finished = True
        self._tally()

    def _decide(self) -> None:
        """As the split: a leading `<think>` is dropped and opens the thinking, else the
        answer thinks from its start when the prompt opened the thinking, or not at all."""
        self._decided = True
        if self._head.startswith(THINK_START):
            self._start = len(THINK_START)
        else:
            self._start = 0 if self.opens_in_thinking else None

    def _tally(self) -> None:
        """Count the tokens now known to be thinking, or not."""
        start = self._start
        if start is None:
            return
        ended = self._end is not None
        if self._end is not None:
            limit = self._end
        elif self._finished:
            limit = self._length
        else:  # a tail that may be the start of `</think>` waits
            tail = self._tail[max(start - (self._length - len(self._tail)), 0) :]
            limit = self._length - _partial_tag(tail, THINK_END)
        final = ended or self._finished
        while self._counted < len(self._ends):
            index = self._counted
            begin = self._ends[index - 1] if index else 0
            end = self._ends[index]
            if end > begin:  # has a part of the thinking's text [start, limit)?
                inside = begin < limit and end > start
                decided = inside or end <= start or final
            else:  # a piece of a character, at `begin`
                inside = start <= begin and (begin < limit or (self._finished and not ended))
                decided = inside or begin < start or final
            if not decided:
                return  # (nor are the tokens after it)
            self.count += inside
            self._counted += 1


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
