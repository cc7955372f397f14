"""Loading: format detection, model folders, and bad files -> TokenizerError naming the file and line/field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_tokenizer import Tokenizer, TokenizerError
from sv_tokenizer.byte_level import BYTE_TO_CHAR
from tokenizer_test_support import tiny_tiktoken_file, tiny_tokenizer_document

FUZZ_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def write(path: Path, content: bytes | str | dict[str, Any]) -> Path:
    if isinstance(content, dict):
        content = json.dumps(content)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(TokenizerError) as caught:
        Tokenizer.from_file(path)
    message = str(caught.value)
    assert message.startswith(str(path)), message
    return message


# ---------------------------------------------------------------- tiktoken files


def test_tiny_tiktoken_file_works(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_file(write(tmp_path / "tokenizer.model", tiny_tiktoken_file()))
    assert tokenizer.encode("hello") == [
        259
    ]  # ranks: he 256, ll 257, hell 258, hello 259, " w" 260
    assert tokenizer.encode("hellish") == [258, *b"ish"]
    assert tokenizer.decode(tokenizer.encode(" world")) == " world"
    assert tokenizer.special_tokens["<|begin_of_text|>"] == 261  # Llama 3's list follows the ranks
    assert tokenizer.vocab_size == 261 + 256


GOOD_LINE = b"aGk= 300\n"  # "hi"


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        (b"aGk=!! 300", "token b'aGk=!!' is not valid base64"),
        (b"aGk 300", "token b'aGk' is not valid base64"),  # missing padding: a truncated line
        (b"aGk= 30x", "rank b'30x' is not a non-negative integer"),
        (b"aGk= -3", "rank b'-3' is not a non-negative integer"),
        # more digits than int() converts (4,300): not a ValueError traceback
        (b"aGk= " + b"9" * 5000, "is too large"),
        (b"aGk= " + b"1" * 19, "is too large"),
        (b"aGk=", "expected '<base64 token> <rank>', found 1 field(s)"),
        (b"aGk= 300 extra", "found 3 field(s)"),
        (b"aGk= 5", "rank 5 is already used on line 6"),
        (b"AA== 300", "token b'\\x00' is already listed on line 1"),
        (b"= 300", "is not valid base64"),
    ],
)
def test_bad_tiktoken_lines(tmp_path: Path, bad_line: bytes, expected: str) -> None:
    lines = tiny_tiktoken_file().splitlines(keepends=True)
    lines.insert(200, bad_line + b"\n")  # becomes line 201
    message = load_error(write(tmp_path / "tokenizer.model", b"".join(lines)))
    assert "line 201: " in message and expected in message, message


def test_tiktoken_file_level_errors(tmp_path: Path) -> None:
    assert "no '<base64 token> <rank>' lines" in load_error(
        write(tmp_path / "empty.model", b"\n\n")
    )
    gap = tiny_tiktoken_file() + b"aGk= 999\n"
    assert "ranks must be 0..261 without gaps, found rank 999" in load_error(
        write(tmp_path / "gap.model", gap)
    )
    lines = tiny_tiktoken_file().splitlines(keepends=True)
    del lines[0x41]  # the byte "A"
    renumbered = b"".join(line.split()[0] + b" %d\n" % i for i, line in enumerate(lines))
    assert "no token for the single byte 0x41" in load_error(
        write(tmp_path / "bytes.model", renumbered)
    )
    binary = b"\n\x0b\x00\x12\x05<unk>\x15\x00\x00\x00\x00\xff\xfe" * 10  # a SentencePiece protobuf
    assert "SentencePiece .model files are not supported" in load_error(
        write(tmp_path / "sp.model", binary)
    )
    with pytest.raises(TokenizerError, match="cannot read the tokenizer file"):
        Tokenizer.from_file(tmp_path / "missing.model")
    # a clone made without git-lfs, and a .json that is not JSON: said as such, where they were
    # read as tiktoken files and blamed on base64
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:4f1c...\nsize 2471645608\n"
    for name in ("tokenizer.json", "tokenizer.model"):
        assert "a Git LFS pointer" in load_error(write(tmp_path / name, pointer))
    assert "invalid JSON at line 1" in load_error(write(tmp_path / "t.json", b"this is not json"))


@FUZZ_SETTINGS
@given(data=st.data())
def test_fuzzed_tiktoken_files_load_or_fail_cleanly(tmp_path: Path, data: st.DataObject) -> None:
    original = tiny_tiktoken_file()
    position = data.draw(st.integers(0, len(original)))
    mutation = data.draw(
        st.one_of(
            st.just(original[:position]),  # truncated
            st.binary(max_size=12).map(
                lambda b: original[:position] + b + original[position + len(b) :]
            ),
            st.binary(max_size=12).map(lambda b: original[:position] + b + original[position:]),
            st.sampled_from([b" ", b"\n", b"=", b"-", b"\t", b"0"]).map(
                lambda b: original[:position] + b + original[position + 1 :]
            ),
        )
    )
    path = write(tmp_path / "fuzz.model", mutation)
    try:
        tokenizer = Tokenizer.from_file(path)
    except TokenizerError as error:
        assert str(error).startswith(str(path))
        return
    text = "hello world, ok?"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_model_dir_tiktoken_uses_config_special_tokens(tmp_path: Path) -> None:
    write(tmp_path / "tokenizer.model", tiny_tiktoken_file())
    added = {
        "261": {"content": "<|start|>", "special": True},
        "262": {"content": "<|stop|>", "special": True},
    }
    write(
        tmp_path / "tokenizer_config.json",
        {"added_tokens_decoder": added, "bos_token": "<|start|>", "eos_token": "<|stop|>"},
    )
    tokenizer = Tokenizer.from_model_dir(tmp_path)
    assert tokenizer.special_tokens == {"<|start|>": 261, "<|stop|>": 262}
    assert tokenizer.bos_id == 261 and tokenizer.eos_ids == {262}
    assert tokenizer.encode("<|stop|>hello", allow_special=True) == [262, 259]


@pytest.mark.parametrize(
    ("added", "expected"),
    [
        # An id the merger gives to ordinary text: "h" would come out as the special token.
        ({"104": {"content": "<|x|>", "special": True}}, "has id 104, already the id of the mergeable token b'h'"),
        ({str(10**12): {"content": "<|x|>", "special": True}}, "token id 1,000,000,000,000 leaves"),
    ],
)  # fmt: skip
def test_model_dir_tiktoken_added_token_errors(
    tmp_path: Path, added: dict[str, Any], expected: str
) -> None:
    write(tmp_path / "tokenizer.model", tiny_tiktoken_file())
    write(tmp_path / "tokenizer_config.json", {"added_tokens_decoder": added})
    with pytest.raises(TokenizerError, match=re.escape(expected)) as caught:
        Tokenizer.from_model_dir(tmp_path)
    assert "tokenizer_config.json's added_tokens_decoder" in str(caught.value)
    # The same id with the mergeable token's own text is that token: accepted.
    write(tmp_path / "tokenizer_config.json", {"added_tokens_decoder": {"104": {"content": "h"}}})
    assert Tokenizer.from_model_dir(tmp_path).encode("h") == [104]


# ---------------------------------------------------------------- tokenizer.json


def test_tiny_tokenizer_json_matches_hf(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    # (HF numbers added tokens from the end of model.vocab whatever their "id": keep them there.)
    document = tiny_tokenizer_document(added=[("<|x|>", 261, True), ("[plain]", 262, False)])
    path = write(tmp_path / "tokenizer.json", document)
    ours, hf = Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(str(path))
    for text in ["hello world", "hellohello  wow", "<|x|> [plain] he'll 12", ""]:
        assert (
            ours.encode(text, allow_special=True) == hf.encode(text, add_special_tokens=False).ids
        )
    hf.encode_special_tokens = (
        True  # special text becomes plain, non-special added tokens still match
    )
    assert ours.encode("<|x|>[plain]") == hf.encode("<|x|>[plain]", add_special_tokens=False).ids
    assert ours.encode("<|x|>[plain]")[-1] == 262
    assert ours.special_tokens == {"<|x|>": 261}


def test_byte_level_alphabet_matches_llama_files(llama_dir: Path, tiktoken_llama: Any) -> None:
    """Meta's tokenizer.json spells the raw bytes of tokenizer.model in GPT-2's alphabet: same map."""
    vocab = json.loads((llama_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    spelled = {token_id: token for token, token_id in vocab.items()}
    for byte in range(256):
        assert spelled[tiktoken_llama.encode_single_token(bytes([byte]))] == BYTE_TO_CHAR[byte]


def broken(mutate: Any) -> dict[str, Any]:
    document = tiny_tokenizer_document()
    mutate(document)
    return document


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (broken(lambda d: d.pop("model")), "field 'model' is missing"),
        (broken(lambda d: d["model"].update(type="Unigram")), "field 'model.type' is 'Unigram'; only 'BPE'"),
        (broken(lambda d: d["model"].update(type="WordPiece")), "field 'model.type' is 'WordPiece'"),
        (broken(lambda d: d["model"].pop("vocab")), "field 'model.vocab' is missing"),
        (broken(lambda d: d["model"].pop("merges")), "field 'model.merges' is missing"),
        (broken(lambda d: d["model"].update(vocab=[])), "field 'model.vocab' must be a non-empty object"),
        (broken(lambda d: d["model"]["vocab"].update(x="7")), "entry 'x' has id '7'"),
        (broken(lambda d: d["model"]["vocab"].update(x=7)), "share id 7"),
        (broken(lambda d: d["model"]["merges"].append("h")), "field 'model.merges[5]' is 'h'; expected"),
        (broken(lambda d: d["model"]["merges"].append(["h", 3])), "field 'model.merges[5]' is ['h', 3]"),
        (broken(lambda d: d["model"]["merges"].append("Ġ hello")), "'Ġhello' is not in model.vocab"),
        (broken(lambda d: d["model"]["vocab"].update({"\u4e00": 400})), "entry '一' (id 400) is not spelled in the byte-level"),
        (broken(lambda d: d["model"].update(dropout=0.1)), "field 'model.dropout' is 0.1"),
        (broken(lambda d: d["model"].update(continuing_subword_prefix="##")), "'model.continuing_subword_prefix' is set"),
        (broken(lambda d: d["model"].update(unk_token="<unk>")), "'model.unk_token' is '<unk>', which is not"),
        (broken(lambda d: d.update(normalizer={"type": "NFKC"})), "field 'normalizer.type' is 'NFKC'"),
        (broken(lambda d: d.update(pre_tokenizer=None)), "field 'pre_tokenizer' is missing"),
        (broken(lambda d: d.update(pre_tokenizer={"type": "Whitespace"})), "must end with a ByteLevel"),
        (
            broken(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed", "invert": False},
                {"type": "ByteLevel", "use_regex": False}]})),
            "field 'pre_tokenizer.pretokenizers[0].behavior' is 'Removed'",
        ),
        (
            broken(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
                {"type": "Metaspace"}, {"type": "ByteLevel"}]})),
            "field 'pre_tokenizer.pretokenizers[0].type' is 'Metaspace'",
        ),
        (broken(lambda d: d["pre_tokenizer"].update(add_prefix_space=True)), "'pre_tokenizer.add_prefix_space' is true"),
        (  # HF refuses a string here; read as a truth value, "no" was true
            broken(lambda d: d["pre_tokenizer"].update(use_regex="no")),
            "field 'pre_tokenizer.use_regex' must be true or false, found a string",
        ),
        (
            broken(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]})),
            "field 'pre_tokenizer.pretokenizers[0].pattern.Regex' is not a valid regex",
        ),
        (broken(lambda d: d.update(decoder={"type": "WordPiece"})), "field 'decoder.type' is 'WordPiece'"),
        (
            broken(lambda d: (d.update(decoder={"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "ByteLevel"}]}),
                              d["model"]["vocab"].update({"<0x0A>": 999}))),
            "field 'decoder' has ByteFallback and model.vocab has <0xXX> byte tokens",
        ),
        (broken(lambda d: d.update(added_tokens=[{"content": "<x>"}])), "field 'added_tokens[0].id' is missing"),
        (broken(lambda d: d.update(added_tokens=[{"id": 5}])), "field 'added_tokens[0].content' is missing"),
        (
            broken(lambda d: d.update(added_tokens=[{"id": 300, "content": "<x>", "lstrip": True}])),
            "field 'added_tokens[0].lstrip' is true for '<x>'",
        ),
        (broken(lambda d: d.update(added_tokens={"id": 3})), "field 'added_tokens' must be a list"),
        (
            broken(lambda d: d.update(added_tokens=[{"id": 3, "content": "<x>"}])),
            "field 'added_tokens[0].id' is 3, already the id of model.vocab entry '$'",
        ),
        (
            broken(lambda d: d.update(added_tokens=[{"id": 300, "content": "<a>"}, {"id": 300, "content": "<b>"}])),
            "field 'added_tokens[1].id' is 300, already the id of added_tokens[0] ('<a>')",
        ),
        (  # ids index a table: one far past the vocabulary would allocate it all
            broken(lambda d: d.update(added_tokens=[{"id": 10**12, "content": "<x>"}])),
            "token id 1,000,000,000,000 leaves 999,999,999,739 ids unused",  # 10**12 + 1 - 262
        ),
        (
            broken(lambda d: d["model"]["vocab"].update({"far": 10**12})),
            "token id 1,000,000,000,000 leaves",
        ),
    ],
)  # fmt: skip
def test_bad_tokenizer_json_fields(tmp_path: Path, document: dict[str, Any], expected: str) -> None:
    message = load_error(write(tmp_path / "tokenizer.json", document))
    assert expected in message, message


def test_bad_json_syntax(tmp_path: Path) -> None:
    message = load_error(
        write(tmp_path / "tokenizer.json", '{\n  "model": {\n    "type": "BPE",,\n')
    )
    assert "invalid JSON at line 3 column" in message
    # an integer of more digits than int() converts (4,300): not a ValueError traceback
    huge = '{"model": {"vocab": {"a": ' + "9" * 5000 + "}}}"
    assert "invalid JSON: a number has too many digits" in load_error(
        write(tmp_path / "h.json", huge)
    )
    assert "field 'model' must be an object, found a list" in load_error(
        write(tmp_path / "b.json", '{"model": []}')
    )


def test_json_top_level_must_be_an_object(tmp_path: Path) -> None:
    assert "invalid JSON at line 1" in load_error(write(tmp_path / "a.json", "{]"))
    assert "not UTF-8 text" in load_error(write(tmp_path / "c.json", b'{"model": "\xff"}'))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        items: list[tuple[Any, Any]] = list(value.items())
        if len(items) > 40:  # vocab: a few entries are enough
            items = items[:3] + items[-3:]
        for key, child in items:
            paths += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in list(enumerate(value))[:3]:
            paths += _paths(child, (*prefix, index))
    return paths


DOCUMENT_PATHS = _paths(tiny_tokenizer_document(added=[("<|x|>", 300, True)]))


@FUZZ_SETTINGS
@given(path=st.sampled_from(DOCUMENT_PATHS), value=JSON_VALUES)
def test_fuzzed_tokenizer_json_loads_or_fails_cleanly(
    tmp_path: Path, path: tuple[Any, ...], value: Any
) -> None:
    document: Any = tiny_tokenizer_document(added=[("<|x|>", 300, True)])
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    file = write(tmp_path / "tokenizer.json", document)
    try:
        tokenizer = Tokenizer.from_file(file)
    except TokenizerError as error:
        assert str(error).startswith(str(file))
        return
    ids = tokenizer.encode("hello world <|x|>", allow_special=True)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)


# ---------------------------------------------------------------- model folders


def test_model_dir_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(TokenizerError, match=re.escape(f"model folder {missing} does not exist")):
        Tokenizer.from_model_dir(missing)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(TokenizerError, match=re.escape(f"{tmp_path / 'a-file'}: not a directory")):
        Tokenizer.from_model_dir(tmp_path / "a-file")
    with pytest.raises(TokenizerError, match="no tokenizer file found"):
        Tokenizer.from_model_dir(tmp_path)
    write(tmp_path / "tokenizer.json", tiny_tokenizer_document(added=[("<s>", 300, True)]))
    config = tmp_path / "tokenizer_config.json"
    for content, expected in [
        ("{oops", "tokenizer_config.json: invalid JSON at line 1"),
        ("[]", "tokenizer_config.json: expected a JSON object"),
        (
            {"chat_template": [{"name": "tool_use", "template": "x"}]},
            "without a template named 'default'",
        ),
        ({"chat_template": 3}, "field 'chat_template' must be a string"),
        ({"bos_token": "<nope>"}, "bos_token '<nope>' is not a token"),
        ({"eos_token": 5}, "field 'eos_token' must be a token string"),
        ({"added_tokens_decoder": {"x": {}}}, "key 'x' is not a token id"),
        ({"added_tokens_decoder": {"\u00b2": {}}}, "key '\u00b2' is not a token id"),
        ({"added_tokens_decoder": {"\u0663": {}}}, "key '\u0663' is not a token id"),
        ({"added_tokens_decoder": {"9" * 5000: {}}}, f"key '{'9' * 40}' is not a token id"),
    ]:
        write(config, content)  # type: ignore[arg-type]
        with pytest.raises(TokenizerError, match=re.escape(expected)):
            Tokenizer.from_model_dir(tmp_path)
    write(
        config,
        {"chat_template": [{"name": "default", "template": "T"}], "bos_token": {"content": "<s>"}},
    )
    write(tmp_path / "generation_config.json", {"eos_token_id": [300, 104]})
    tokenizer = Tokenizer.from_model_dir(tmp_path)
    assert tokenizer.bos_id == 300 and tokenizer.eos_ids == {300, 104}
    write(tmp_path / "generation_config.json", {"eos_token_id": "x"})
    with pytest.raises(
        TokenizerError, match=re.escape("generation_config.json: field 'eos_token_id'")
    ):
        Tokenizer.from_model_dir(tmp_path)
    # an id past the vocabulary is blamed on the file that named it, not on the tokenizer's
    write(tmp_path / "generation_config.json", {"eos_token_id": 99999})
    with pytest.raises(
        TokenizerError, match=re.escape("generation_config.json: end-of-sequence id 99999")
    ):
        Tokenizer.from_model_dir(tmp_path)


def test_model_dir_prefers_tokenizer_json(tmp_path: Path) -> None:
    write(tmp_path / "tokenizer.json", tiny_tokenizer_document())
    write(tmp_path / "tokenizer.model", b"garbage that would fail")
    assert Tokenizer.from_model_dir(tmp_path).source.endswith("tokenizer.json")
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer.model").unlink()
    (tmp_path / "original").mkdir()
    write(tmp_path / "original" / "tokenizer.model", tiny_tiktoken_file())
    assert Tokenizer.from_model_dir(tmp_path).encode("hello") == [259]


def test_config_tokens_may_be_plain_vocabulary_entries(tmp_path: Path) -> None:
    write(tmp_path / "tokenizer.json", tiny_tokenizer_document())
    write(tmp_path / "tokenizer_config.json", {"bos_token": "hello", "eos_token": "ll"})
    tokenizer = Tokenizer.from_model_dir(tmp_path)
    assert tokenizer.bos_id == tokenizer.encode("hello")[0]
    assert tokenizer.eos_ids == set(tokenizer.encode("ll"))


@pytest.mark.parametrize(
    "model_options",
    [
        {},  # no fallback at all: HF drops the byte
        {"unk_token": "<unk>", "fuse_unk": True},
        {"unk_token": "<unk>", "fuse_unk": False},
        # byte-level 0x04 is "Ą" = C4 84: its fallback is <0xC4> <0x84>; 0x06's ("Ć") is missing
        {"unk_token": "<unk>", "byte_fallback": True},
    ],
)
def test_bytes_missing_from_the_vocabulary_match_hf(
    tmp_path: Path, model_options: dict[str, Any]
) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    document: Any = tiny_tokenizer_document()
    vocab = document["model"]["vocab"]
    for byte in (0x04, 0x06):
        del vocab[BYTE_TO_CHAR[byte]]
    vocab["<unk>"] = 1000
    vocab["<0xC4>"] = 1001
    vocab["<0x84>"] = 1002
    document["model"].update(model_options)
    path = write(tmp_path / "tokenizer.json", document)
    ours, hf = Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(str(path))
    for text in ["a\x04b", "\x04\x06\x06x\x04", "hello\x06 world\x04\x04", "\x06"]:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids, (
            text,
            model_options,
        )


_BYTE_LEVEL = {
    "type": "ByteLevel",
    "add_prefix_space": True,
    "trim_offsets": True,
    "use_regex": True,
}
_MARKER_TO_SPACE = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}


@pytest.mark.parametrize(
    "steps",
    [
        [{"type": "ByteFallback"}, {"type": "Fuse"}, _MARKER_TO_SPACE, _BYTE_LEVEL],  # GGUF's
        [_BYTE_LEVEL, {"type": "Fuse"}],
        [_BYTE_LEVEL, _MARKER_TO_SPACE],  # on the decoded text: the user's "▁" a space
        [_BYTE_LEVEL, _BYTE_LEVEL],  # the decoded "é" read as byte-level text: U+FFFD
        [_BYTE_LEVEL, {"type": "ByteFallback"}],  # a decoded "<0x41>" becomes "A"
    ],
)
def test_a_byte_level_decoder_decodes_as_hf_or_is_refused(
    tmp_path: Path, steps: list[dict[str, Any]]
) -> None:
    """HF runs a Sequence decoder's steps in order: the steps after ByteLevel get the decoded
    text, where they are no longer no-ops. A file sv would decode otherwise is refused."""
    tokenizers = pytest.importorskip("tokenizers")
    document: Any = tiny_tokenizer_document()
    document["decoder"] = {"type": "Sequence", "decoders": steps}
    path = write(tmp_path / "tokenizer.json", document)
    hf = tokenizers.Tokenizer.from_file(str(path))
    try:
        ours = Tokenizer.from_file(path)
    except TokenizerError as error:
        assert "field 'decoder.decoders[1].type'" in str(error), error
        return
    for text in ("a\u2581b", "é", "<0x41>", "hello world"):
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == hf.decode(ids), (text, steps)


def test_an_added_token_spelling_a_vocabulary_entry_of_another_id_is_refused(
    tmp_path: Path,
) -> None:
    """HF gives an added token whose text is a vocabulary entry that entry's id, not its own,
    and numbers the added tokens after it otherwise too: sv would encode and decode them by
    the file's ids, so the file is refused by name."""
    tokenizers = pytest.importorskip("tokenizers")
    document: Any = tiny_tokenizer_document()
    entry, entry_id = next((t, i) for t, i in document["model"]["vocab"].items() if i >= 3)
    size = len(document["model"]["vocab"])
    options = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    document["added_tokens"] = [
        {"id": size, "content": entry, "special": True, **options},
        {"id": size + 1, "content": "<x>", "special": True, **options},
    ]
    path = write(tmp_path / "tokenizer.json", document)
    hf = tokenizers.Tokenizer.from_file(str(path))
    assert hf.token_to_id(entry) == entry_id and hf.token_to_id("<x>") != size + 1
    message = load_error(path)
    assert f"'added_tokens[0].id' is {size}, but {entry!r} is model.vocab's token" in message
