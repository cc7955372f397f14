"""StopStringMatcher against a one-shot oracle: at each piece boundary, search the whole text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sv_server.stops import StopStringMatcher


def oracle(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    """Generation ends at the first piece after which a stop string is in the text; the
    output is the text before the earliest-starting stop string present at that moment."""
    text = ""
    for piece in pieces:
        text += piece
        starts = [i for i in (text.find(s) for s in stops) if i >= 0]
        if starts:
            return text[: min(starts)], True
    return text, False


def run(pieces: list[str], stops: list[str]) -> tuple[str, bool, list[str]]:
    matcher = StopStringMatcher(stops)
    released = [matcher.push(p) for p in pieces]
    released.append(matcher.flush())
    return "".join(released), matcher.stopped, released


ALPHABET = st.sampled_from("ab\u00e9\n ")
pieces_st = st.lists(st.text(ALPHABET, max_size=4), max_size=12)
stops_st = st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=4)


@given(pieces_st, stops_st)
def test_matches_the_oracle(pieces: list[str], stops: list[str]) -> None:
    text, stopped, _ = run(pieces, stops)
    assert (text, stopped) == oracle(pieces, stops)


@given(pieces_st, stops_st)
def test_never_releases_part_of_a_stop_string(pieces: list[str], stops: list[str]) -> None:
    """Whatever has been released so far is a prefix of the final answer: nothing is taken back."""
    final, _, released = run(pieces, stops)
    shown = ""
    for chunk in released:
        shown += chunk
        assert final.startswith(shown)


def test_a_stop_string_split_across_pieces() -> None:
    matcher = StopStringMatcher(["</end>"])
    assert matcher.push("Hello </") == "Hello "  # "</" could start "</end>": held back
    assert matcher.push("en") == ""
    assert matcher.push("d> more") == ""
    assert matcher.stopped and matcher.flush() == ""


def test_held_text_comes_back_when_it_was_not_a_stop() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("a ST") == "a "
    assert matcher.push("ay") == "STay"
    assert matcher.push(" S") == " "
    assert matcher.flush() == "S"


def test_first_completed_stop_wins() -> None:
    # "bc" completes before "abcd" could: generation ends there
    assert run(["a", "b", "c", "d"], ["abcd", "bc"])[0] == "a"
    # both present when the piece arrives: the earliest start wins
    assert run(["abcd"], ["abcd", "bc"])[0] == ""


def test_no_stops_passes_everything() -> None:
    matcher = StopStringMatcher([])
    assert matcher.push("abc") == "abc" and matcher.flush() == ""


def test_empty_stop_string_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopStringMatcher(["ok", ""])


def oracle_including(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    """vLLM's include_stop_str_in_output: as `oracle`, but the text ends with the stop string
    (of those starting earliest, the shortest: it was complete first)."""
    text = ""
    for piece in pieces:
        text += piece
        found = [(text.find(s), len(s)) for s in stops if s in text]
        if found:
            start, length = min(found)
            return text[: start + length], True
    return text, False


@given(pieces_st, stops_st)
def test_including_the_stop_string_matches_its_oracle(pieces: list[str], stops: list[str]) -> None:
    matcher = StopStringMatcher(stops, include_stop=True)
    text = "".join([matcher.push(p) for p in pieces]) + matcher.flush()
    assert (text, matcher.stopped) == oracle_including(pieces, stops)


def test_min_tokens_holds_stop_strings_back_until_after_it() -> None:
    """vLLM's min_tokens: a stop string counts only if it ends in the text of the tokens after
    the first min_tokens (a '.' in token 2 ended an answer that had to be 3 tokens long)."""
    m = StopStringMatcher(["."], min_tokens=3)
    pieces = ["Pa", "ris.", " Yes", ". More"]
    out = [m.push(piece, tokens) for tokens, piece in enumerate(pieces, start=1)]
    assert out == ["Pa", "ris.", " Yes", ""] and m.stopped  # the 4th token's '.' stops it
    # One that begins in token 1's text and ends in token 2's counts, as vLLM's search reaches
    # back (1 - new_char_count - len(stop)): the '.' is held back meanwhile.
    m = StopStringMatcher([".x"], min_tokens=1)
    assert [m.push(p, t) for t, p in ((1, "a."), (2, "x"), (3, ".x"))] == ["a", "", ""]
    m = StopStringMatcher(["s."], min_tokens=1)  # the audit's case: " Paris" then "."
    assert [m.push(" Paris", 1), m.push(".", 2)] == [" Pari", ""] and m.stopped


def test_min_tokens_text_held_over_two_pieces_stays_unsearched() -> None:
    """The first min_tokens' text held back past a second piece (it could still begin the
    longer stop string) is not where a stop string may end in the third piece either: the
    '.' of token 1 ended the output at "Hi" once " Ne" had been searched."""
    m = StopStringMatcher([".", ". Next"], min_tokens=1)
    out = [m.push(p, t) for t, p in enumerate(["Hi.", " Ne", "w"], start=1)] + [m.flush()]
    assert "".join(out) == "Hi. New" and not m.stopped


def min_tokens_oracle(pieces: list[str], stops: list[str], min_tokens: int) -> tuple[str, bool]:
    """vLLM's rule on the whole text: generation ends at the first piece past min_tokens after
    which the text holds a stop string that ends past the first min_tokens pieces' text; the
    output is the text before the earliest-starting such stop string."""
    text = ""
    boundary = len("".join(pieces[:min_tokens]))
    for k, piece in enumerate(pieces, start=1):
        text += piece
        if k <= min_tokens:
            continue
        starts = [i for s in stops for i in _occurrences(text, s) if i + len(s) > boundary]
        if starts:
            return text[: min(starts)], True
    return text, False


def _occurrences(text: str, stop: str) -> list[int]:
    return [i for i in range(len(text)) if text.startswith(stop, i)]


@st.composite
def stops_within(draw: st.DrawFn, text: str) -> list[str]:
    """Stop strings, some cut from `text` (so that they straddle piece boundaries often)."""
    stop = st.text(ALPHABET, min_size=1, max_size=4)
    if text:
        cut = st.integers(0, len(text) - 1).flatmap(
            lambda i: st.integers(i + 1, min(len(text), i + 4)).map(lambda j: text[i:j])
        )
        stop = cut | stop
    return draw(st.lists(stop, max_size=4))


@given(st.data())
def test_min_tokens_matches_its_oracle(data: st.DataObject) -> None:
    pieces = data.draw(pieces_st)
    stops = data.draw(stops_within("".join(pieces)))
    min_tokens = data.draw(st.integers(0, 6))
    matcher = StopStringMatcher(stops, min_tokens=min_tokens)
    released = [matcher.push(p, k) for k, p in enumerate(pieces, start=1)]
    released.append(matcher.flush())
    assert ("".join(released), matcher.stopped) == min_tokens_oracle(pieces, stops, min_tokens)
    shown = ""  # and nothing shown is taken back
    for chunk in released:
        shown += chunk
        assert min_tokens_oracle(pieces, stops, min_tokens)[0].startswith(shown)
