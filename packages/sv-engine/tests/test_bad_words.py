"""vLLM's bad_words, the host's part: a word's token ids (with and without a leading space),
and which tokens a step bans from the output it knows, a token still on the device
included. Cases are worked out by hand; the device's check of the pending token and the
engine's output are tested in test_engine_bad_words.py."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
import torch
from sv_engine import EngineError, SamplingParams
from sv_engine.bad_words import bans, history_tail, word_ids
from sv_engine.logit_controls import RowControls, step_controls
from sv_model.logit_processing import LogitProcessor
from sv_model.step import StepInputs
from sv_scheduler import Sequence as Seq


# A made-up tokenizer: each character is a token (its code point), a space and the letter
# after it one token (1000 + the letter), so " ab" is [1097, 98] and "ab" is [97, 98].
def _encode(text: str) -> list[int]:
    out, i = [], 0
    while i < len(text):
        if text[i] == " " and i + 1 < len(text):
            out.append(1000 + ord(text[i + 1]))
            i += 2
        else:
            out.append(ord(text[i]))
            i += 1
    return out


def test_word_ids_keep_the_spaced_variant_only_when_it_is_another_word_of_the_same_length() -> None:
    assert word_ids(_encode, ["ab"]) == ((97, 98), (1097, 98))
    assert word_ids(_encode, ["  ab"]) == ((97, 98), (1097, 98))  # leading whitespace dropped
    # "a b" is [97, 1098], " a b" [1097, 1098]: as long, another first token: kept.
    assert word_ids(_encode, ["a b"]) == ((97, 1098), (1097, 1098))

    def merging(text: str) -> list[int]:  # " ab" as one token: not as long, so dropped
        return [7] if text == " ab" else _encode(text)

    assert word_ids(merging, ["ab"]) == ((97, 98),)

    def same_first(text: str) -> list[int]:  # spaced starts with the same token: dropped
        return [5, 6] if text == " x" else [5, 9]

    assert word_ids(same_first, ["x"]) == ((5, 9),)


def test_a_word_that_encodes_to_nothing_is_refused() -> None:
    with pytest.raises(EngineError, match="bad_words"):
        word_ids(lambda text: [], ["word"])


def test_more_than_1024_tokens_in_all_are_refused() -> None:
    assert len(word_ids(_encode, ["a" * 512])) == 2  # "a"*512 and " a" + "a"*511: 1024
    with pytest.raises(EngineError, match="bad_words must encode to at most 1024 tokens"):
        word_ids(_encode, ["a" * 512, "b"])


A, B, C, D = 10, 11, 12, 13
WORDS = ((A,), (B, C), (A, B, D))


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([], [(A, None)]),  # only the one-token word: nothing has been generated
        ([B], [(A, None), (C, None)]),
        ([A], [(A, None)]),  # (A, B, D) needs two tokens before D
        ([A, B], [(A, None), (C, None), (D, None)]),
        ([D, B], [(A, None), (C, None)]),
        ([C, A, B], [(A, None), (C, None), (D, None)]),  # only the tail counts
        ([None], [(A, None), (C, B)]),  # the newest token still on the device
        ([A, None], [(A, None), (C, B), (D, B)]),
        ([C, None], [(A, None), (C, B)]),  # a known mismatch: no (A, B, D) ban at all
    ],
)
def test_bans(history: list[int | None], expected: list[tuple[int, int | None]]) -> None:
    assert bans(WORDS, history) == expected


def test_history_tail() -> None:
    known = [1, 2, 3, 4, 5]  # prompt [1, 2], output [3, 4, 5]
    assert history_tail(known, 2, 2, False, ()) == [4, 5]
    assert history_tail(known, 2, 5, False, ()) == [3, 4, 5]  # never the prompt
    assert history_tail(known, 2, 2, True, ()) == [5, None]
    assert history_tail(known, 2, 3, False, (8, 9)) == [5, 8, 9]
    assert history_tail(known, 2, 0, True, (8,)) == []


class _Seq:
    """What step_controls reads of a scheduler sequence."""

    def __init__(
        self, token_ids: list[int], num_prompt: int, pending: int, draft: tuple[int, ...] = ()
    ):
        self.token_ids = token_ids
        self.num_prompt_tokens = num_prompt
        self.num_pending = pending
        self.draft = draft
        self.table_row = 0
        self.num_preemptions = 0

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) + self.num_pending - self.num_prompt_tokens


def _controls(words: list[str]) -> RowControls:
    params = SamplingParams(bad_words=words)
    return RowControls(params, frozenset(), [1, 2], word_ids(_encode, words))


def test_step_controls_ban_known_tails_as_biases_and_pending_ones_on_the_device() -> None:
    controls = _controls(["x", "ab"])  # x: 120 and 1120; ab: (97, 98) and (1097, 98)
    known = cast(Seq, _Seq([1, 2, 97], 2, pending=0))
    pending = cast(Seq, _Seq([1, 2, 5], 2, pending=1))
    out = step_controls([(known, controls, 0), (pending, controls, 0)], lambda seq: 7)
    assert out is not None
    inf = float("-inf")
    assert sorted(out.bias) == [
        (0, 98, inf),
        (0, 120, inf),
        (0, 1120, inf),
        (1, 120, inf),
        (1, 1120, inf),
    ]
    # The pending token of row 1 is at row 7 of the previous launch: 98 is banned if it is 97
    # or 1097.
    assert sorted(out.pending_bans) == [(1, 98, 7, 97), (1, 98, 7, 1097)]


def test_step_controls_read_the_drafts_before_a_draft_position() -> None:
    controls = _controls(["ab"])
    seq = cast(Seq, _Seq([1, 2, 5], 2, pending=0, draft=(1097, 6)))

    def no_pending(seq: Seq) -> int:
        raise AssertionError("nothing is pending")

    rows = [(seq, controls, 0), (seq, controls, 1), (seq, controls, 2)]
    out = step_controls(rows, no_pending)
    assert out is not None
    # Choice 1 follows draft 1097: ban 98; choices 0 (after 5) and 2 (after 6) are free.
    assert list(out.bias) == [(1, 98, float("-inf"))]
    assert not out.pending_bans


def test_the_device_bans_where_the_pending_token_matches() -> None:
    """LogitProcessor's half: the ban applies to the rows whose pending id is the expected one,
    read from the previous launch's sampled ids, with no host knowledge of them."""
    last_ids = torch.tensor([97, 1097, 5], dtype=torch.int64)
    processor = LogitProcessor(4, 200, torch.device("cpu"), last_ids)
    controls = step_controls(
        [
            (cast(Seq, _Seq([1, 2], 2, pending=1)), _controls(["ab"]), 0),
            (cast(Seq, _Seq([1, 2], 2, pending=1)), _controls(["ab"]), 0),
            (cast(Seq, _Seq([1, 2], 2, pending=1)), _controls(["ab"]), 0),
        ],
        lambda seq: 0,
    )
    assert controls is not None
    # Rows 0..2 read pending rows 0, 1 and 2 (97, 1097 and 5).
    controls.pending_bans = [(row, t, row, e) for row, t, _, e in controls.pending_bans]
    step = StepInputs([0, 0, 0], [0, 0, 0], [0, 1, 2], [1, 1, 1], [1, 1, 1], [0, 1, 2])
    step.controls = controls
    logits = torch.zeros((3, 200))
    out = processor.process(step, logits)
    assert out[:, 98].tolist() == [float("-inf"), float("-inf"), 0.0]
    assert torch.isfinite(out[:, :98]).all() and torch.isfinite(out[:, 99:]).all()
    assert np.isfinite(logits.numpy()).all()  # the raw logits stay


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("word", "list of strings"),
        ([1], "list of strings"),
        ([""], "empty or blank"),
        (["  "], "empty or blank"),
        (["w"] * 129, "at most 128"),
    ],
)
def test_bad_values_refused(value: object, problem: str) -> None:
    with pytest.raises(EngineError, match=f"bad_words.*{problem}"):
        SamplingParams(bad_words=value)  # type: ignore[arg-type]


def test_a_list_is_kept_as_a_tuple_and_turns_logit_processing_on() -> None:
    p = SamplingParams(bad_words=["a", "b"])  # type: ignore[arg-type]
    assert p.bad_words == ("a", "b") and p.processes_logits
    assert not SamplingParams().processes_logits
