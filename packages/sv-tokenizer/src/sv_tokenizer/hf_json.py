"""HF `tokenizer.json` for BPE models: byte-level (Llama 3, SmolLM2, Qwen, GPT-2 style) and
SentencePiece-style with byte fallback (Mistral, Llama 2: see sentencepiece_bpe.py).

What is read: `model` (type BPE: `vocab`, `merges` as "a b" strings or [a, b] pairs,
`ignore_merges`), `pre_tokenizer` (a `Sequence` of `Split` regexes and `Digits`, ending in
`ByteLevel`), `added_tokens`, and, for the BOS token only, `post_processor`.

What is deliberately ignored: `post_processor` for encoding (encode() never adds BOS/EOS; the
chat formats add BOS themselves), `truncation` and `padding` (batching concerns), and decoder
steps that cannot change a byte-level vocabulary's output (`ByteFallback`, `Fuse`, the `▁`
`Replace` that transformers' GGUF converter adds).

The normalizers read: NFC (Qwen) and the SentencePiece layout's Prepend + Replace. Anything
else that would change the tokens (another normalizer, BPE dropout, subword prefixes,
`lstrip`/`rstrip` added tokens, other pre-tokenizers) is a TokenizerError naming the field:
better refuse than encode differently from the model's training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import regex  # type: ignore[import-untyped]  # (no types-regex in the lock)

from .bpe import PairMerger
from .byte_level import BYTE_TO_CHAR, chars_to_bytes
from .errors import TokenizerError
from .pretokenize import (
    DIGIT_RUNS_PATTERN,
    GPT2_PATTERN,
    INDIVIDUAL_DIGITS_PATTERN,
    PreTokenizer,
    RegexSplit,
)
from .sentencepiece_bpe import (
    SPACE_MARKER,
    CharPairMerger,
    LeadingSpace,
    Pieces,
    SpaceMarkerPieces,
    token_text_bytes,
)


@dataclass(frozen=True)
class AddedToken:
    """A token matched as a whole string before pre-tokenization (HF `added_tokens`)."""

    content: str
    id: int
    special: bool


@dataclass
class HFTokenizerSpec:
    merger: PairMerger
    pretokenizer: PreTokenizer | Pieces
    token_bytes: list[bytes | None]  # by id: the vocabulary's bytes, then the added tokens'
    added_tokens: list[AddedToken]
    bos_token: str | None  # the special token the post-processor puts first, if any
    leading_space: LeadingSpace = LeadingSpace.KEPT  # what decoding drops (SentencePiece)
    byte_fallback_ids: frozenset[int] = frozenset()  # the <0xXX> tokens (SentencePiece style)


# Token ids index tables (each id's bytes), so they must be about as many as the tokens the
# file defines: ids this far past their count are a damaged file, not a vocabulary.
MAX_UNUSED_IDS = 65_536
# A token id (or tiktoken rank) written as text: more digits than this is no vocabulary's,
# only a damaged file or argument (and int() refuses 4,301 digits and more).
MAX_ID_DIGITS = 18


def id_table_size(ids: list[int], count: int, source: str) -> int:
    """The size of a table by token id (1 + the largest of `ids`), for a file that defines
    `count` tokens; TokenizerError when that leaves more than MAX_UNUSED_IDS ids unused."""
    size = 1 + max(ids, default=-1)
    if size - count > MAX_UNUSED_IDS:
        raise TokenizerError(
            f"{source}: token id {size - 1:,} leaves {size - count:,} ids unused (the file "
            f"defines {count:,} tokens; ids must be dense, at most {MAX_UNUSED_IDS:,} unused)"
        )
    return size


def parse_json_document(data: bytes, source: str) -> Any:
    """json.loads with errors that name the file, line and column."""
    try:
        return json.loads(data)
    except UnicodeDecodeError as error:
        raise TokenizerError(
            f"{source}: not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    except json.JSONDecodeError as error:
        raise TokenizerError(
            f"{source}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}"
        ) from None
    except RecursionError:
        raise TokenizerError(f"{source}: invalid JSON: nested too deeply") from None
    except ValueError:  # an integer of more digits than Python converts (4,300)
        raise TokenizerError(f"{source}: invalid JSON: a number has too many digits") from None


class _Fields:
    """Typed access to one JSON object, with errors naming the file and the field's path."""

    def __init__(self, source: str, path: str, value: object) -> None:
        if not isinstance(value, dict):
            raise TokenizerError(
                f"{source}: field '{path}' must be an object, found {_kind(value)}"
            )
        self.source = source
        self.path = path
        self.value: dict[str, Any] = value

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> TokenizerError:
        return TokenizerError(f"{self.source}: field '{self.where(key)}' {message}")

    def required(self, key: str) -> Any:
        if key not in self.value:
            raise self.error(key, "is missing")
        return self.value[key]

    def obj(self, key: str) -> _Fields:
        return _Fields(self.source, self.where(key), self.required(key))

    def str_or_none(self, key: str) -> str | None:
        value = self.value.get(key)
        if value is not None and not isinstance(value, str):
            raise self.error(key, f"must be a string, found {_kind(value)}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.value.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, found {_kind(value)}")
        return value


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def parse_hf_tokenizer_json(data: bytes, source: str) -> HFTokenizerSpec:
    root = _Fields(source, "", parse_json_document(data, source))
    model = root.obj("model")
    model_type = model.value.get("type", "BPE")
    if model_type != "BPE":
        raise model.error("type", f"is {model_type!r}; only 'BPE' is supported")
    normalizer = _check_normalizer(root)
    space_marker = _space_marker_pieces(root, normalizer)
    if space_marker is not None:
        return _parse_sentencepiece_bpe(root, model, space_marker)
    pretokenizer = _parse_pre_tokenizer(root, nfc=normalizer == "NFC")
    decodes_byte_fallback = _check_decoder(root)

    dropout = model.value.get("dropout")
    if dropout not in (None, 0, 0.0):
        raise model.error("dropout", f"is {dropout!r}; BPE dropout is not supported")
    for affix in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.str_or_none(affix):
            raise model.error(affix, "is set; subword prefixes/suffixes are not supported")
    ignore_merges = model.flag("ignore_merges")

    vocab = _parse_vocab(model)
    added_tokens = _parse_added_tokens(root)
    added_ids = {token.id for token in added_tokens}
    token_bytes: list[bytes | None] = [None] * _checked_id_table_size(root, vocab, added_tokens)
    for token, token_id in vocab.items():
        as_bytes = chars_to_bytes(token)
        if as_bytes is None:
            if token_id in added_ids:
                continue  # spelled by its added-token content below
            raise model.error(
                "vocab",
                f"entry {token!r} (id {token_id}) is not spelled in the byte-level alphabet",
            )
        token_bytes[token_id] = as_bytes
    for added in added_tokens:
        token_bytes[added.id] = added.content.encode("utf-8")

    # A byte without its own character token is left to HF's fallbacks (see PairMerger).
    byte_ids = [vocab.get(BYTE_TO_CHAR[byte], -1) for byte in range(256)]
    byte_token_ids = [vocab.get(f"<0x{byte:02X}>", -1) for byte in range(256)]
    # HF's byte_fallback acts on the BPE model's input, which is already byte-level text: the
    # fallback of byte b is the `<0xXX>` tokens of the UTF-8 bytes of b's character.
    fallback_ids: list[list[int] | None] = [None] * 256
    if model.flag("byte_fallback"):
        for byte, char in enumerate(BYTE_TO_CHAR):
            ids = [byte_token_ids[b] for b in char.encode("utf-8")]
            fallback_ids[byte] = ids if min(ids) >= 0 else None
    if decodes_byte_fallback and max(byte_token_ids) >= 0:
        # HF would turn <0xXX> tokens into bytes and then read those as byte-level characters:
        # no per-token byte string can express that, so refuse rather than decode differently.
        raise root.error(
            "decoder", "has ByteFallback and model.vocab has <0xXX> byte tokens; not supported"
        )
    unk_token = model.str_or_none("unk_token")
    if unk_token is not None and unk_token not in vocab:
        raise model.error("unk_token", f"is {unk_token!r}, which is not in model.vocab")
    unk_id = vocab[unk_token] if unk_token is not None else None

    pair_ranks, merged_ids = _parse_merges(model, vocab)
    whole_tokens = None
    if ignore_merges:
        whole_tokens = {
            b: i for i, b in enumerate(token_bytes) if b is not None and i not in added_ids
        }
    merger = PairMerger(
        byte_ids,
        pair_ranks,
        merged_ids,
        whole_tokens,
        fallback_ids=fallback_ids,
        unk_id=unk_id,
        fuse_unk=model.flag("fuse_unk"),
    )
    return HFTokenizerSpec(
        merger=merger,
        pretokenizer=pretokenizer,
        token_bytes=token_bytes,
        added_tokens=added_tokens,
        bos_token=_post_processor_bos(root),
    )


def _checked_id_table_size(
    root: _Fields, vocab: dict[str, int], added_tokens: list[AddedToken]
) -> int:
    """The size of the table of bytes by id (`id_table_size`), once no added token has the id
    of a vocabulary entry of other text, nor the text of one of another id: HF would give it
    another id (and renumber the added tokens after it), so sv would encode and decode it
    otherwise."""
    token_of_id = {token_id: token for token, token_id in vocab.items()}
    for index, added in enumerate(added_tokens):
        taken_by = token_of_id.get(added.id)
        if taken_by is not None and taken_by != added.content:
            raise root.error(
                f"added_tokens[{index}].id",
                f"is {added.id}, already the id of model.vocab entry {taken_by!r}",
            )
        vocab_id = vocab.get(added.content)
        if vocab_id is not None and vocab_id != added.id:
            raise root.error(
                f"added_tokens[{index}].id",
                f"is {added.id}, but {added.content!r} is model.vocab's token {vocab_id}",
            )
    added_ids = {token.id for token in added_tokens}
    return id_table_size(
        [*vocab.values(), *added_ids],
        len(vocab) + len(added_ids - set(vocab.values())),
        root.source,
    )


def _parse_vocab(model: _Fields) -> dict[str, int]:
    vocab = model.required("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise model.error("vocab", "must be a non-empty object of token -> id")
    seen: dict[int, str] = {}
    for token, token_id in vocab.items():
        if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
            raise model.error(
                "vocab", f"entry {token!r} has id {token_id!r}; expected an integer >= 0"
            )
        if token_id in seen:
            raise model.error(
                "vocab", f"entries {seen[token_id]!r} and {token!r} share id {token_id}"
            )
        seen[token_id] = token
    return vocab


def _parse_merges(
    model: _Fields, vocab: dict[str, int]
) -> tuple[dict[tuple[int, int], int], list[int]]:
    merges = model.required("merges")
    if not isinstance(merges, list):
        raise model.error("merges", f"must be a list, found {_kind(merges)}")
    # The fast path: every entry well formed (one C-level pass per step); any failure falls
    # through to the checking loop below, which names the bad entry.
    try:
        pairs = [merge.split(" ") if isinstance(merge, str) else merge for merge in merges]
        pair_ids = [(vocab[left], vocab[right]) for left, right in pairs]
        merged_ids = [vocab[left + right] for left, right in pairs]
        if all(left and right for left, right in pairs):
            return dict(zip(pair_ids, range(len(pair_ids)), strict=True)), merged_ids
    except (ValueError, KeyError, TypeError):
        pass
    pair_ranks: dict[tuple[int, int], int] = {}
    merged_ids = []
    for rank, merge in enumerate(merges):
        if isinstance(merge, str):
            pair = merge.split(" ")
        elif isinstance(merge, list):
            pair = merge
        else:
            pair = []
        if len(pair) != 2 or not all(isinstance(part, str) and part for part in pair):
            raise model.error(
                f"merges[{rank}]", f"is {merge!r}; expected 'left right' or [left, right]"
            )
        left, right = pair
        for part in (left, right, left + right):
            if part not in vocab:
                raise model.error(
                    f"merges[{rank}]", f"is {merge!r}, but {part!r} is not in model.vocab"
                )
        # As in HF, a pair listed twice keeps its last rank.
        pair_ranks[(vocab[left], vocab[right])] = rank
        merged_ids.append(vocab[left + right])
    return pair_ranks, merged_ids


def _parse_added_tokens(root: _Fields) -> list[AddedToken]:
    entries = root.value.get("added_tokens") or []
    if not isinstance(entries, list):
        raise root.error("added_tokens", f"must be a list, found {_kind(entries)}")
    tokens: list[AddedToken] = []
    index_of_id: dict[int, int] = {}
    for index, entry in enumerate(entries):
        fields = _Fields(root.source, f"added_tokens[{index}]", entry)
        token_id = fields.required("id")
        content = fields.required("content")
        if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
            raise fields.error("id", f"is {token_id!r}; expected an integer >= 0")
        if not isinstance(content, str) or not content:
            raise fields.error("content", f"is {content!r}; expected a non-empty string")
        earlier = index_of_id.setdefault(token_id, index)
        if earlier != index and tokens[earlier].content != content:
            raise fields.error(
                "id",
                f"is {token_id}, already the id of added_tokens[{earlier}] "
                f"({tokens[earlier].content!r})",
            )
        for option in ("lstrip", "rstrip", "single_word"):
            if fields.flag(option):
                raise fields.error(option, f"is true for {content!r}; this option is not supported")
        tokens.append(AddedToken(content=content, id=token_id, special=fields.flag("special")))
    return tokens


def _check_normalizer(root: _Fields) -> str | None:
    """None (no normalization), "NFC", or "Prepend+Replace" (the SentencePiece layout)."""
    normalizer = root.value.get("normalizer")
    if normalizer is None:
        return None
    fields = _Fields(root.source, "normalizer", normalizer)
    kind = fields.value.get("type")
    # transformers' GGUF converter writes an empty Sequence: no normalization either.
    if kind == "Sequence" and fields.value.get("normalizers") == []:
        return None
    if kind == "NFC":
        return "NFC"
    if kind == "Sequence" and fields.value.get("normalizers") == [
        {"type": "Prepend", "prepend": SPACE_MARKER},
        {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_MARKER},
    ]:
        return "Prepend+Replace"
    raise fields.error(
        "type",
        f"is {kind!r}; supported normalizers: NFC, and Prepend('▁') + Replace(' ' -> '▁')",
    )


def _space_marker_pieces(root: _Fields, normalizer: str | None) -> SpaceMarkerPieces | None:
    """The SentencePiece layout's pieces (sentencepiece_bpe.py), None for a byte-level one."""
    pre = root.value.get("pre_tokenizer")
    if normalizer == "Prepend+Replace":
        if pre is not None:
            raise root.error("pre_tokenizer", "must be null beside the Prepend normalizer")
        return SpaceMarkerPieces("always", prepend_twice=True, split=False)
    if not (isinstance(pre, dict) and pre.get("type") == "Metaspace"):
        return None
    fields = _Fields(root.source, "pre_tokenizer", pre)
    if fields.value.get("replacement", SPACE_MARKER) != SPACE_MARKER:
        raise fields.error("replacement", "must be '▁'")
    if normalizer is not None:
        raise root.error("normalizer", "must be null beside a Metaspace pre-tokenizer")
    scheme = fields.value.get("prepend_scheme", "always")
    if scheme not in ("always", "first", "never"):
        raise fields.error("prepend_scheme", f"is {scheme!r}; expected always, first or never")
    split = fields.flag("split", default=True)
    return SpaceMarkerPieces(scheme, prepend_twice=False, split=split)


def _parse_sentencepiece_bpe(
    root: _Fields, model: _Fields, pieces: SpaceMarkerPieces
) -> HFTokenizerSpec:
    for option in ("ignore_merges",):
        if model.flag(option):
            raise model.error(option, "is true; not supported for a SentencePiece-style BPE")
    dropout = model.value.get("dropout")
    if dropout not in (None, 0, 0.0):
        raise model.error("dropout", f"is {dropout!r}; BPE dropout is not supported")
    for affix in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.str_or_none(affix):
            raise model.error(affix, "is set; subword prefixes/suffixes are not supported")
    leading_space, decodes_bytes = _check_sentencepiece_decoder(root)
    vocab = _parse_vocab(model)
    added_tokens = _parse_added_tokens(root)
    token_bytes: list[bytes | None] = [None] * _checked_id_table_size(root, vocab, added_tokens)
    for token, token_id in vocab.items():
        token_bytes[token_id] = token_text_bytes(token, byte_tokens=decodes_bytes)
    for added in added_tokens:
        token_bytes[added.id] = added.content.encode("utf-8")
    byte_token_ids = [vocab.get(f"<0x{byte:02X}>", -1) for byte in range(256)]
    use_fallback = model.flag("byte_fallback")
    if use_fallback and min(byte_token_ids) < 0:
        missing = byte_token_ids.index(-1)
        raise model.error("vocab", f"has no <0x{missing:02X}> token, which byte_fallback needs")
    unk_token = model.str_or_none("unk_token")
    if unk_token is not None and unk_token not in vocab:
        raise model.error("unk_token", f"is {unk_token!r}, which is not in model.vocab")
    pair_ranks, merged_ids = _parse_merges(model, vocab)
    merger = CharPairMerger(
        {token: i for token, i in vocab.items() if len(token) == 1},
        pair_ranks,
        merged_ids,
        byte_token_ids=byte_token_ids if use_fallback else None,
        unk_id=vocab[unk_token] if unk_token is not None else None,
        fuse_unk=model.flag("fuse_unk"),
    )
    return HFTokenizerSpec(
        merger=merger,
        pretokenizer=pieces,
        token_bytes=token_bytes,
        added_tokens=added_tokens,
        bos_token=_post_processor_bos(root),
        leading_space=leading_space,
        byte_fallback_ids=frozenset(i for i in byte_token_ids if i >= 0 and decodes_bytes),
    )


def _check_sentencepiece_decoder(root: _Fields) -> tuple[LeadingSpace, bool]:
    """Check a SentencePiece-style decoder (▁ -> space, byte fallback, fuse, then a strip of
    the leading space; or Metaspace: ▁ -> space, except that the first token's ▁ are dropped
    where its scheme prepends one, and `<0xXX>` tokens stay text, as HF decodes them).
    (what it drops at the start, whether it decodes byte tokens)."""
    decoder = root.value.get("decoder")
    if decoder is None:
        raise root.error("decoder", "is missing; a SentencePiece-style BPE needs one")
    top = _Fields(root.source, "decoder", decoder)
    if top.value.get("type") == "Metaspace":
        if top.value.get("replacement", SPACE_MARKER) != SPACE_MARKER:  # (HF's default is ▁)
            raise top.error("replacement", "must be '▁'")
        prepends = top.value.get("prepend_scheme", "always") != "never"
        return (LeadingSpace.FIRST_TOKEN if prepends else LeadingSpace.KEPT), False
    steps = top.required("decoders") if top.value.get("type") == "Sequence" else [decoder]
    if not isinstance(steps, list):
        raise top.error("decoders", f"must be a list, found {_kind(steps)}")
    kinds: list[str] = []
    for i, value in enumerate(steps):
        step = _Fields(root.source, f"decoder.decoders[{i}]", value)
        kind = step.value.get("type")
        if kind in ("ByteFallback", "Fuse"):
            kinds.append(kind)
            continue
        if kind == "Replace" and step.value.get("pattern") == {"String": SPACE_MARKER}:
            if step.value.get("content") != " ":
                raise step.error("content", f"is {step.value.get('content')!r}; expected ' '")
            kinds.append(kind)
            continue
        if (
            kind == "Strip"
            and step.value.get("content") == " "
            and not step.value.get("stop")
            and step.value.get("start") == 1
        ):
            kinds.append(kind)
            continue
        raise step.error("type", f"is {kind!r}; not a SentencePiece-style decoder step")
    # HF runs the steps in order, each on every token it is given: only this order decodes
    # as sv does (a Strip before the Fuse drops a space of every token, ByteFallback after it
    # finds no <0xXX> token, and without Replace or ByteFallback `▁` and `<0xXX>` stay text).
    if kinds not in (_SENTENCEPIECE_DECODER, [*_SENTENCEPIECE_DECODER, "Strip"]):
        raise top.error(
            "decoders" if top.value.get("type") == "Sequence" else "type",
            f"steps are {kinds}; expected {_SENTENCEPIECE_DECODER}, then an optional Strip",
        )
    return (LeadingSpace.ONE if kinds[-1] == "Strip" else LeadingSpace.KEPT), True


_SENTENCEPIECE_DECODER = ["Replace", "ByteFallback", "Fuse"]
"""A SentencePiece-style decoder's steps (Llama 2's, Mistral's, Gemma's): `▁` to a space, each
run of `<0xXX>` tokens to its text, then the tokens joined (before a Strip of the leading
space)."""


def _parse_pre_tokenizer(root: _Fields, *, nfc: bool) -> PreTokenizer:
    if root.value.get("pre_tokenizer") is None:
        raise root.error(
            "pre_tokenizer", "is missing; a byte-level BPE needs a ByteLevel pre-tokenizer"
        )
    top = root.obj("pre_tokenizer")
    if top.value.get("type") == "Sequence":
        steps_value = top.required("pretokenizers")
        if not isinstance(steps_value, list):
            raise top.error("pretokenizers", f"must be a list, found {_kind(steps_value)}")
        steps = [
            _Fields(root.source, f"pre_tokenizer.pretokenizers[{i}]", s)
            for i, s in enumerate(steps_value)
        ]
    else:
        steps = [top]
    if not steps or steps[-1].value.get("type") != "ByteLevel":
        raise root.error(
            "pre_tokenizer",
            "must end with a ByteLevel pre-tokenizer (only byte-level BPE is supported)",
        )
    splits = [_parse_split_step(step, is_last=i == len(steps) - 1) for i, step in enumerate(steps)]
    return PreTokenizer([split for split in splits if split is not None], nfc=nfc)


def _parse_split_step(step: _Fields, *, is_last: bool) -> RegexSplit | None:
    kind = step.value.get("type")
    if kind == "ByteLevel":
        if not is_last:
            raise step.error("type", "ByteLevel must be the last pre-tokenizer of the sequence")
        if step.flag("add_prefix_space"):
            raise step.error("add_prefix_space", "is true; this option is not supported")
        return RegexSplit(GPT2_PATTERN) if step.flag("use_regex", default=True) else None
    if kind == "Digits":
        return RegexSplit(
            INDIVIDUAL_DIGITS_PATTERN if step.flag("individual_digits") else DIGIT_RUNS_PATTERN
        )
    if kind == "Split":
        behavior = step.value.get("behavior")
        if behavior != "Isolated":
            raise step.error("behavior", f"is {behavior!r}; only 'Isolated' is supported")
        if step.flag("invert"):
            raise step.error("invert", "is true; this option is not supported")
        pattern = step.obj("pattern")
        if isinstance(pattern.value.get("String"), str):
            return RegexSplit(regex.escape(pattern.value["String"]))
        if not isinstance(pattern.value.get("Regex"), str):
            raise step.error("pattern", "must be {'Regex': ...} or {'String': ...}")
        try:
            return RegexSplit(pattern.value["Regex"])
        except regex.error as error:
            raise pattern.error("Regex", f"is not a valid regex: {error}") from None
    raise step.error("type", f"is {kind!r}; supported pre-tokenizers: Split, Digits, ByteLevel")


def _is_no_op_decoder(step: _Fields) -> bool:
    """Decoder steps that cannot change what a byte-level vocabulary decodes to, before its
    ByteLevel step (they act on the tokens' byte-level spelling).

    transformers' GGUF converter writes ByteFallback + Fuse + Replace('▁' -> ' ') before
    ByteLevel: byte-level tokens never contain '▁', and ByteFallback only acts on `<0xXX>`
    tokens, which a vocabulary using it must not have (checked by the caller).
    """
    kind = step.value.get("type")
    if kind in ("ByteFallback", "Fuse"):
        return True
    return kind == "Replace" and step.value.get("pattern") == {"String": "\u2581"}


def _check_decoder(root: _Fields) -> bool:
    """Refuse decoders that would change a byte-level vocabulary's text; True if one has ByteFallback."""
    decoder = root.value.get("decoder")
    if decoder is None:
        return False
    top = _Fields(root.source, "decoder", decoder)
    if top.value.get("type") == "Sequence":
        steps_value = top.required("decoders")
        if not isinstance(steps_value, list):
            raise top.error("decoders", f"must be a list, found {_kind(steps_value)}")
        steps = [
            _Fields(root.source, f"decoder.decoders[{i}]", s) for i, s in enumerate(steps_value)
        ]
    else:
        steps = [top]
    decoded = False  # whether a ByteLevel step came: the steps after it get the text
    for step in steps:
        kind = step.value.get("type")
        if not decoded and (kind == "ByteLevel" or _is_no_op_decoder(step)):
            decoded = kind == "ByteLevel"
            continue
        if decoded and kind == "Fuse":  # (ByteLevel already gives one string)
            continue
        if decoded:
            # HF would run it on the decoded text: a Replace of '▁' there replaces the user's
            # '▁', a second ByteLevel reads Latin-1 text as bytes ("é" -> U+FFFD).
            raise step.error("type", f"is {kind!r} after the ByteLevel decoder; not supported")
        raise step.error("type", f"is {kind!r}; only a byte-level decoder is supported")
    return any(step.value.get("type") == "ByteFallback" for step in steps)


def _post_processor_bos(root: _Fields) -> str | None:
    """The special token HF's TemplateProcessing puts before a single sequence, if any."""
    processor = root.value.get("post_processor")
    candidates: list[object] = []
    if isinstance(processor, dict):
        candidates = (
            processor.get("processors", [processor])
            if processor.get("type") == "Sequence"
            else [processor]
        )
    for candidate in candidates:
        if isinstance(candidate, dict) and candidate.get("type") == "TemplateProcessing":
            single = candidate.get("single")
            if isinstance(single, list) and single and isinstance(single[0], dict):
                special = single[0].get("SpecialToken")
                if isinstance(special, dict) and isinstance(special.get("id"), str):
                    return str(special["id"])
    return None
