"""StreamDecoder: the streamed text equals decode(ids), and no chunk ever holds a cut character."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_tokenizer import StreamDecoder, Tokenizer
from tokenizer_test_support import unicode_text

STREAM_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def stream(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    decoder = StreamDecoder(tokenizer)
    return [decoder.push(token_id) for token_id in ids] + [decoder.flush()]


@STREAM_SETTINGS
@given(text=unicode_text(80))
def test_streaming_encoded_text(text: str, llama_model: Tokenizer) -> None:
    ids = llama_model.encode(text)
    chunks = stream(llama_model, ids)
    assert "".join(chunks) == llama_model.decode(ids) == text
    # Valid text never shows a replacement character mid-stream: every chunk is whole characters.
    if "\ufffd" not in text:
        assert all("\ufffd" not in chunk for chunk in chunks)
    # And each chunk ends exactly where a character of the text ends.
    position = 0
    for chunk in chunks:
        assert text[position : position + len(chunk)] == chunk
        position += len(chunk)


@STREAM_SETTINGS
@given(ids=st.lists(st.integers(0, 128255), max_size=40))
def test_streaming_arbitrary_ids_matches_decode(ids: list[int], llama_model: Tokenizer) -> None:
    """Ids that do not form valid UTF-8: same U+FFFD placement as the one-shot decode."""
    assert "".join(stream(llama_model, ids)) == llama_model.decode(ids)


def test_emoji_split_across_tokens(llama_model: Tokenizer) -> None:
    text = "🤖🤖 family 👨\u200d👩\u200d👧"
    ids = llama_model.encode(text)
    decoder = StreamDecoder(llama_model)
    chunks = [decoder.push(i) for i in ids]
    assert "" in chunks  # some tokens end mid-character and emit nothing yet
    assert "".join(chunks) + decoder.flush() == text
    # a 4-byte emoji's tokens, pushed one by one, appear only once complete
    robot = llama_model.encode("🤖")
    assert len(robot) > 1
    decoder = StreamDecoder(llama_model)
    assert [decoder.push(i) for i in robot] == [""] * (len(robot) - 1) + ["🤖"]


def test_truncated_character_flushes_as_replacement(llama_model: Tokenizer) -> None:
    robot = llama_model.encode("🤖")
    decoder = StreamDecoder(llama_model)
    assert decoder.push(robot[0]) == ""
    assert decoder.flush() == "\ufffd"
    assert decoder.push(llama_model.encode("ok")[0]) == "ok"  # usable again after a flush
