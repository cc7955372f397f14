"""BPE merging on hand-made vocabularies: hand-computed results, and the heap path == the list path."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sv_tokenizer import bpe
from sv_tokenizer.bpe import PairMerger, RankMerger

SINGLE_BYTES = {bytes([b]): b for b in range(256)}


def rank_merger(*tokens: bytes) -> RankMerger:
    ranks = dict(SINGLE_BYTES)
    for token in tokens:
        ranks[token] = len(ranks)
    return RankMerger(ranks)


def test_rank_rule_hand_computed() -> None:
    merger = rank_merger(b"ab", b"bc", b"abc", b"cd")
    ab, bc, abc, cd = 256, 257, 258, 259
    assert merger.encode(b"abc") == [abc]  # a whole token is taken directly
    # ab (256) merges first, then ab+c = abc (258) beats cd (259); abcd is no token
    assert merger.encode(b"abcd") == [abc, ord("d")]
    assert merger.encode(b"xbcd") == [ord("x"), bc, ord("d")]  # bc (257) beats cd (259)
    assert merger.encode(b"cdab") == [cd, ab]
    assert merger.encode(b"aab") == [ord("a"), ab]
    assert merger.encode(b"") == []


def test_rank_rule_takes_leftmost_of_equal_pairs() -> None:
    merger = rank_merger(b"aa")
    assert merger.encode(b"aaa") == [256, ord("a")]
    assert merger.encode(b"aaaaa") == [256, 256, ord("a")]


def test_pair_rule_only_applies_listed_merges() -> None:
    # vocabulary ids: bytes 0..255, 256 = "ab", 257 = "abc"; merges: (a, b) then (ab, c).
    byte_ids = list(range(256))
    merger = PairMerger(byte_ids, {(97, 98): 0, (256, 99): 1}, [256, 257])
    assert merger.encode(b"abc") == [257]
    assert merger.encode(b"xabcab") == [120, 257, 256]
    # "abc" is reachable only as (ab, c): "bc" is not a merge, so "bcab" stays apart
    assert merger.encode(b"bcab") == [98, 99, 256]


def test_pair_rule_unknown_bytes() -> None:
    byte_ids = list(range(256))
    byte_ids[4] = -1
    dropped = PairMerger(byte_ids, {}, [])
    assert dropped.encode(b"a\x04b") == [97, 98]
    unk = PairMerger(byte_ids, {}, [], unk_id=999, fuse_unk=True)
    assert unk.encode(b"a\x04\x04b\x04") == [97, 999, 98, 999]
    unfused = PairMerger(byte_ids, {}, [], unk_id=999)
    assert unfused.encode(b"\x04\x04") == [999, 999]


VOCAB_TOKENS = [
    b"ab",
    b"ba",
    b"aa",
    b"aab",
    b"bab",
    b"abab",
    b"bb",
    b"abba",
    b"aaaa",
    b"ba ",
    b" a",
]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=600).map(lambda b: bytes(b"ab "[x % 3] for x in b)))
def test_heap_path_equals_list_path(data: bytes) -> None:
    ranks = dict(SINGLE_BYTES)
    for token in VOCAB_TOKENS:
        ranks[token] = len(ranks)
    merger = RankMerger(ranks)
    # pair-rule version of the same vocabulary: every split of every token is a merge
    pair_ranks: dict[tuple[int, int], int] = {}
    for token in VOCAB_TOKENS:
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                pair_ranks[(ranks[left], ranks[right])] = ranks[token]
    merged = list(range(max(ranks.values()) + 1))  # a merge's result id is its rank
    pair_merger = PairMerger(list(range(256)), pair_ranks, merged)

    saved = bpe.LONG_PIECE_BYTES
    try:
        bpe.LONG_PIECE_BYTES = 10**9
        by_list = merger.encode(data)
        pairs_by_list = pair_merger.encode(data)
        bpe.LONG_PIECE_BYTES = 0
        by_heap = merger.encode(data)
        pairs_by_heap = pair_merger.encode(data)
    finally:
        bpe.LONG_PIECE_BYTES = saved
    assert by_heap == by_list
    assert pairs_by_heap == pairs_by_list == by_list  # the rank rule as pairs gives the same result
    assert b"".join(next(t for t, r in ranks.items() if r == i) for i in by_list) == data
