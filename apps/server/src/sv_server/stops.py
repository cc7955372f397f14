"""Stop strings over streamed text: cut before the first stop string, never show part of one.

Text arrives in pieces (one per token). A stop string can straddle pieces, so a piece is not
released until it is certain not to begin a stop string: the longest tail of the pending text
that is a proper prefix of some stop string is held back. When a stop string appears, the text
before it is released and the rest is dropped.

Which stop string wins is decided at the first piece that completes one: of the stop strings
present in the text at that moment, the one that starts earliest. (Generation would have ended
there, so a longer stop string that would only complete later never gets the chance.)

With `min_tokens` (vLLM's), a stop string counts only if it ends in the text of the tokens after
the first min_tokens, as vLLM's does (the engine bans stop tokens until then, and a stop string
must not end the output earlier either). It may begin in the text before, as in vLLM, whose
search reaches back a stop string's length less one: so that text too is held back while it
could begin one.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(
        self, stops: Sequence[str], *, include_stop: bool = False, min_tokens: int = 0
    ) -> None:
        """include_stop: the released text ends with the stop string (vLLM's
        include_stop_str_in_output), rather than just before it. min_tokens: see the module
        doc (`push` is then told the token count)."""
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        self.stops = tuple(stops)
        self.include_stop = include_stop
        self.min_tokens = min_tokens
        self._pending = ""  # released to no one yet: might be the start of a stop string
        self._unsearched = 0  # how much of _pending is the first min_tokens' text
        self.stopped = False

    def push(self, text: str, tokens: int | None = None) -> str:
        """Feed the next piece; returns the text now safe to show ('' while it could be a stop
        string). After a stop string is seen, `stopped` is True and every push returns ''.
        `tokens`: the output's tokens so far, this piece's included; while they are at most
        min_tokens no stop string may end in the piece (see the module doc)."""
        if self.stopped or not text:
            return ""
        if not self.stops:
            return text
        pending = self._pending + text
        if tokens is not None and tokens <= self.min_tokens:
            starts = []
            ends_past = len(pending)  # all of it is the first min_tokens' text
        else:
            # A stop string must end past the first min_tokens' text.
            ends_past = self._unsearched
            starts = [
                (i, len(s))
                for i, s in (
                    (pending.find(s, max(0, ends_past - len(s) + 1)), s) for s in self.stops
                )
                if i >= 0
            ]
        if starts:
            self.stopped = True
            self._pending = ""
            start, length = min(starts)
            return pending[: start + length] if self.include_stop else pending[:start]
        held = self._held_back(pending)
        released = len(pending) - held
        self._pending = pending[released:]
        # The first min_tokens' text still held stays unsearchable for a stop string's end in
        # every later push, not only the next one.
        self._unsearched = max(0, ends_past - released)
        return pending[:released]

    def flush(self) -> str:
        """The text held back, when generation ended without a stop string."""
        text, self._pending = ("" if self.stopped else self._pending), ""
        self._unsearched = 0
        return text

    def _held_back(self, pending: str) -> int:
        """Length of the longest tail of `pending` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(pending)), longest, -1):
                if pending.endswith(stop[:n]):
                    longest = n
                    break
        return longest
