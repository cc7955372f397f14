"""The tokenizer: text <-> token ids for BPE models, byte-level (Llama 3, SmolLM2, Qwen) or
SentencePiece-style with byte fallback (Mistral, Llama 2; see sentencepiece_bpe.py).

encode() runs four stages:

1. added tokens: with `allow_special=True` the special tokens (`<|eot_id|>`…) are cut out of
   the text first and become their ids; without it they are ordinary text, so a user cannot
   type a control token. Non-special added tokens (HF `"special": false`) are always cut out,
   as HF does.
2. pre-tokenization: a regex cuts each stretch of ordinary text into pieces (words, numbers,
   punctuation runs, whitespace runs); see pretokenize.py. A SentencePiece-style vocabulary
   writes spaces as `▁` instead and keeps each stretch whole.
3. BPE: each piece's UTF-8 bytes are merged into token ids; see bpe.py.
4. a cache of piece -> ids: natural text repeats its pieces, so most of them are a single
   dictionary hit. Looking all pieces up is one C-level map(), misses are filled afterwards.

decode() is the concatenation of each token's bytes, decoded as UTF-8 with errors="replace"
(a U+FFFD per invalid sequence), as tiktoken and HF tokenizers do; a SentencePiece-style
tokenizer decodes its byte-fallback runs as HF's ByteFallback does and drops the one leading
space its encoding put there, as its HF decoder does (sentencepiece_bpe.py).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain, compress, repeat
from pathlib import Path

import regex  # type: ignore[import-untyped]  # (no types-regex in the lock)

from .bpe import UTF8_BYTES, PairMerger, RankMerger
from .chat import ChatFormat, ChatMLFormat, Llama3ChatFormat
from .chat_choice import choose_chat_format
from .chat_template import TemplateChatFormat
from .errors import TokenizerError
from .hf_json import AddedToken, id_table_size, parse_hf_tokenizer_json
from .messages import Message
from .model_dir import ModelDirConfig, find_tokenizer_file, read_model_dir_config
from .pretokenize import LLAMA3_PATTERN, PreTokenizer
from .sentencepiece_bpe import LeadingSpace, Pieces, byte_fallback_text
from .tiktoken_file import llama3_special_tokens, parse_tiktoken_bpe

STOP_TOKEN_NAMES = (
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
)
"""Special tokens that end generation wherever a vocabulary defines them: Llama 3's end of
text / turn / message (a tool call), ChatML's end of turn, GPT-2 style end of text."""

TEMPLATE_CACHE_ENTRIES = 8
"""Templates of `template_chat_format` kept compiled, the least recently used dropped first: a
client that sends its template with every request pays jinja's compile once, and each one is
at most a request's size."""

BOS_TOKEN_NAMES = ("<|begin_of_text|>", "<s>")
# What `check_chat_template` renders: roles alternating as every chat template accepts them.
TEMPLATE_CHECK_DIALOG = (
    Message("user", "Hello."),
    Message("assistant", "Hi! How can I help?"),
    Message("user", "Name a colour."),
)

CACHE_MAX_ENTRIES = 1 << 17
"""Pieces cached before the cache is emptied and refilled (bounded memory, no LRU bookkeeping
on the hot path: a hit must cost one dictionary look-up)."""

CACHE_MAX_PIECE_CHARS = 64
"""Longer pieces (rare: long words, whitespace runs) are not worth keeping."""


def check_utf8(text: str, what: str) -> None:
    """TokenizerError if `text` holds bytes that were not UTF-8: Python hands them on as lone
    surrogates U+DC80-U+DCFF (command-line arguments, and standard input read with
    `errors="surrogateescape"`), which encoding would silently turn into U+FFFD."""
    found = _ESCAPED_BYTE.search(text)
    if found is not None:
        byte = ord(found.group()) - 0xDC00
        raise TokenizerError(
            f"{what} is not UTF-8 text: byte 0x{byte:02x} at character {found.start()}"
        )


_ESCAPED_BYTE = regex.compile("[\udc80-\udcff]")


def _replace_surrogates(text: str) -> str:
    """Lone surrogates cannot be UTF-8 encoded: join valid pairs, replace the rest by U+FFFD (as tiktoken)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _alternation(strings: Iterable[str]) -> regex.Pattern[str] | None:
    """A regex matching any of the strings, longest first (HF matches added tokens leftmost-longest)."""
    ordered = sorted(set(strings), key=lambda s: (-len(s), s))
    if not ordered:
        return None
    return regex.compile("|".join(regex.escape(s) for s in ordered))


# A clone made without git-lfs holds this small text file where the tokenizer should be.
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


class Tokenizer:
    """A byte-level BPE tokenizer; build one with `from_file` or `from_model_dir`.

    Public attributes: `bos_id`, `eos_ids` (every stop token), `special_tokens` (name -> id),
    `vocab_size` (ids are 0 .. vocab_size-1), `source` (where it was loaded from),
    `byte_fallback_ids` (a SentencePiece-style vocabulary's `<0xXX>` tokens, else empty) and
    `leading_space` (what decoding drops at the start of a text). The loaders also give it its
    chat format (`choose_chat_format`): `chat_format`.
    """

    def __init__(
        self,
        *,
        source: str,
        merger: RankMerger | PairMerger,
        pretokenizer: PreTokenizer | Pieces,
        token_bytes: Sequence[bytes | None],
        added_tokens: Sequence[AddedToken],
        bos_token: str | None = None,
        eos_token: str | None = None,
        extra_eos_ids: Mapping[int, str] | None = None,
        leading_space: LeadingSpace = LeadingSpace.KEPT,
        byte_fallback_ids: Iterable[int] = (),
    ) -> None:
        self.source = source
        self._merger = merger
        self._pretokenize = pretokenizer
        self.leading_space = leading_space
        self.byte_fallback_ids = frozenset(byte_fallback_ids)
        self._token_bytes: list[bytes | None] = list(token_bytes)
        self.vocab_size = len(self._token_bytes)
        for added in added_tokens:
            if added.id >= self.vocab_size:
                raise TokenizerError(
                    f"{source}: added token {added.content!r} has id {added.id} beyond the vocabulary"
                )
        self.special_tokens: dict[str, int] = {t.content: t.id for t in added_tokens if t.special}
        self._added_ids: dict[str, int] = {t.content: t.id for t in added_tokens}
        self._added_id_set = frozenset(self._added_ids.values())
        plain_added = [t.content for t in added_tokens if not t.special]
        self._special_or_added_regex = _alternation(self._added_ids)
        self._special_regex = _alternation(self.special_tokens)
        self._plain_added_regex = _alternation(plain_added)
        self._piece_cache: dict[str, tuple[int, ...]] = {}

        self.bos_id: int | None = None
        if bos_token is not None:
            self.bos_id = self._named_token_id(bos_token, "bos_token")
        else:
            self.bos_id = next(
                (self._added_ids[n] for n in BOS_TOKEN_NAMES if n in self._added_ids), None
            )
        stop_ids = {
            self.special_tokens[name] for name in STOP_TOKEN_NAMES if name in self.special_tokens
        }
        named_in = extra_eos_ids or {}  # id -> the file that named it (generation_config.json)
        stop_ids.update(named_in)
        if eos_token is not None:
            stop_ids.add(self._named_token_id(eos_token, "eos_token"))
        for stop_id in stop_ids:
            if not 0 <= stop_id < self.vocab_size:
                raise TokenizerError(
                    f"{named_in.get(stop_id, source)}: end-of-sequence id {stop_id} is not a "
                    f"token id (the tokenizer has {self.vocab_size})"
                )
        self.eos_ids: frozenset[int] = frozenset(stop_ids)
        self._chat_format: ChatFormat | None = None  # set by the loaders
        # The model folder's special-token strings (`bos_token`, ...) a jinja template is
        # rendered with, whichever template it is (set by from_model_dir).
        self._template_tokens: dict[str, str] = {}
        # (template, source) -> its format, compiled at first use: template_chat_format's LRU.
        self._template_formats: OrderedDict[tuple[str, str], TemplateChatFormat] = OrderedDict()

    def _named_token_id(self, token: str, role: str) -> int:
        """The id of a token named by its text (tokenizer_config.json's bos_token/eos_token)."""
        if token in self._added_ids:
            return self._added_ids[token]
        as_bytes = token.encode("utf-8")
        for token_id, data in enumerate(self._token_bytes):
            if data == as_bytes:
                return token_id
        raise TokenizerError(f"{self.source}: {role} {token!r} is not a token of this vocabulary")

    # ---------------------------------------------------------------- loading

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a tiktoken-format `tokenizer.model` (Llama 3) or an HF `tokenizer.json`.

        The format is told by the content, not the name (but a `.json` file is read as JSON).
        A tiktoken file gets Llama 3's pre-tokenization pattern and 256 special tokens.
        """
        return cls._load(Path(path), ModelDirConfig())

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        *,
        chat_template: str | None = None,
        chat_template_source: str | None = None,
    ) -> Tokenizer:
        """Load the tokenizer of a model folder (an HF download or sv's converted default model).

        Picks tokenizer.json, else tokenizer.model (also under original/), and reads
        tokenizer_config.json / chat_template.jinja / generation_config.json when present for
        the chat template, the BOS/EOS tokens and the special tokens' names. `chat_template`
        (named by `chat_template_source` in error messages) replaces the folder's template,
        rendered with the folder's special tokens all the same.
        """
        directory = Path(model_dir)
        if not directory.exists():
            raise TokenizerError(f"model folder {directory} does not exist")
        if not directory.is_dir():
            raise TokenizerError(f"{directory}: not a directory")
        config = read_model_dir_config(directory)
        if chat_template is not None:
            config.chat_template = chat_template
            config.chat_template_source = chat_template_source
        return cls._load(find_tokenizer_file(directory), config)

    @classmethod
    def _load(cls, path: Path, config: ModelDirConfig) -> Tokenizer:
        source = str(path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise TokenizerError(
                f"{source}: cannot read the tokenizer file ({error.strerror})"
            ) from None
        if data.startswith(_LFS_POINTER):
            raise TokenizerError(
                f"{source}: a Git LFS pointer, not the tokenizer: the repository was cloned "
                "without git-lfs (run `git lfs pull` in it, or download the file)"
            )
        bos_token = config.template_tokens.get("bos_token")
        if data.lstrip()[:1] == b"{" or path.suffix == ".json":  # (a .json's errors are JSON's)
            spec = parse_hf_tokenizer_json(data, source)
            merger: RankMerger | PairMerger = spec.merger
            pretokenizer: PreTokenizer | Pieces = spec.pretokenizer
            token_bytes, added_tokens = spec.token_bytes, spec.added_tokens
            leading_space = spec.leading_space
            byte_fallback_ids = spec.byte_fallback_ids
            bos_token = bos_token or spec.bos_token
        elif data[:4096].isascii():
            merger, token_bytes, added_tokens = _tiktoken_parts(data, source, config.added_tokens)
            pretokenizer = PreTokenizer.from_pattern(LLAMA3_PATTERN)
            leading_space = LeadingSpace.KEPT
            byte_fallback_ids = frozenset()
        else:
            raise TokenizerError(
                f"{source}: neither a tiktoken BPE file ('<base64 token> <rank>' lines) nor an HF "
                "tokenizer.json (SentencePiece .model files are not supported)"
            )
        tokenizer = cls(
            source=source,
            merger=merger,
            pretokenizer=pretokenizer,
            token_bytes=token_bytes,
            added_tokens=added_tokens,
            bos_token=bos_token,
            eos_token=config.template_tokens.get("eos_token"),
            extra_eos_ids=config.eos_ids,
            leading_space=leading_space,
            byte_fallback_ids=byte_fallback_ids,
        )
        tokenizer._template_tokens = dict(config.template_tokens)
        tokenizer._chat_format = choose_chat_format(
            tokenizer,
            config.chat_template,
            template_tokens=config.template_tokens,
            source=config.chat_template_source,
        )
        return tokenizer

    # ---------------------------------------------------------------- encoding

    def encode(self, text: str, *, allow_special: bool = False, at_start: bool = True) -> list[int]:
        """Token ids of `text`; no BOS/EOS is added.

        With `allow_special=False` (the default) special-token text such as "<|eot_id|>" is
        encoded as ordinary text (tiktoken's `encode_ordinary`); with True it becomes the token.
        `at_start=False`: the text continues an input encoded before it (a chat render cut at
        its special tokens), which only a SentencePiece-style tokenizer's leading `▁` heeds.
        """
        if not isinstance(text, str):  # bytes met the str regex's TypeError deep inside
            raise TokenizerError(f"encode takes a str, got {type(text).__name__}")
        try:
            return self._encode(text, allow_special, at_start)
        except UnicodeEncodeError:
            return self._encode(_replace_surrogates(text), allow_special, at_start)

    def _encode(self, text: str, allow_special: bool, at_start: bool) -> list[int]:
        matcher = self._special_or_added_regex if allow_special else self._plain_added_regex
        if matcher is None:
            return self._encode_ordinary(text, at_start)
        ids: list[int] = []
        position = 0
        for match in matcher.finditer(text):
            if match.start() > position:
                segment = text[position : match.start()]
                ids += self._encode_ordinary(segment, at_start and position == 0)
            ids.append(self._added_ids[match.group()])
            position = match.end()
        if position < len(text):
            ids += self._encode_ordinary(text[position:], at_start and position == 0)
        return ids

    def _encode_ordinary(self, text: str, at_start: bool) -> list[int]:
        pieces = self._pretokenize(text, at_start)
        cache = self._piece_cache
        found: list[tuple[int, ...] | None] = list(map(cache.get, pieces))
        if None in found:
            # Encode each missing piece once (text repeats its new words too), then fill the
            # gaps with one more C-level map(): fresh.get(piece, what the cache had).
            missing = set(compress(pieces, map(operator.is_, found, repeat(None))))
            encode = self._merger.encode
            fresh = {piece: tuple(encode(piece.encode("utf-8"))) for piece in missing}
            found = list(map(fresh.get, pieces, found))
            if len(cache) + len(fresh) > CACHE_MAX_ENTRIES:
                cache.clear()
            cache.update(item for item in fresh.items() if len(item[0]) <= CACHE_MAX_PIECE_CHARS)
        return list(chain.from_iterable(found))  # type: ignore[arg-type]

    # ---------------------------------------------------------------- decoding

    def _bytes_of(self, id: int) -> bytes | None:
        """Token `id`'s bytes, or None for an id without a token."""
        return self._token_bytes[id] if 0 <= id < self.vocab_size else None

    def token_bytes(self, id: int) -> bytes:
        """The bytes token `id` stands for (a special token: its name, UTF-8)."""
        data = self._bytes_of(id)
        if data is None:
            raise TokenizerError(
                f"{self.source}: token id {id!r} is not in the vocabulary "
                f"(0..{self.vocab_size - 1})"
            )
        return data

    def shown_bytes(self, id: int) -> bytes:
        """`token_bytes`, but none for an id without a token: a model's logits may have rows
        past the vocabulary (Qwen pads 151,669 tokens to 151,936), and such a row, sampled,
        shows no text (as in HF's decode)."""
        data = self._bytes_of(id)
        return b"" if data is None else data

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = list(ids)
        if ids and min(ids) >= 0:
            try:
                return b"".join(map(self._token_bytes.__getitem__, ids))  # type: ignore[arg-type]
            except (IndexError, TypeError):
                pass  # an id beyond the vocabulary or without a token: name it below
        return b"".join([self.token_bytes(i) for i in ids])

    def decode(self, ids: Iterable[int], *, continuation: bool = False) -> str:
        """The text of `ids`; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD.
        `continuation`: the ids follow others (a completion's, after its prompt), so a
        SentencePiece tokenizer keeps the leading space it drops at the start of a text."""
        ids = list(ids)
        if self.byte_fallback_ids:
            fallback = self.byte_fallback_ids
            text = byte_fallback_text((self.token_bytes(i), i in fallback) for i in ids)
        else:
            text = self.decode_bytes(ids).decode("utf-8", errors="replace")
        if continuation or not text:
            return text
        if self.leading_space is LeadingSpace.ONE and text.startswith(" "):
            return text[1:]
        if self.drops_spaces_of(ids[0]):
            head = len(self.token_bytes(ids[0]).decode("utf-8"))
            return text[:head].replace(" ", "") + text[head:]
        return text

    def drops_spaces_of(self, first_id: int) -> bool:
        """Whether a decode starting with this token drops its spaces (`LeadingSpace.FIRST_TOKEN`:
        a vocabulary token; added tokens are written as they are)."""
        return self.leading_space is LeadingSpace.FIRST_TOKEN and first_id not in self._added_id_set

    # ---------------------------------------------------------------- chat

    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            raise TokenizerError(
                f"{self.source}: no chat format: the model folder has no chat_template, and neither "
                "<|start_header_id|> (Llama 3) nor <|im_start|> (ChatML) is a special token"
            )
        return self._chat_format

    @property
    def builtin_chat_format(self) -> str | None:
        """The name of the built-in format ("Llama 3" or "ChatML") that chat prompts get
        because the model folder has no chat template of its own (`choose_chat_format`); None
        when it has one, or when there is no chat format at all."""
        if isinstance(self._chat_format, (Llama3ChatFormat, ChatMLFormat)):
            return self._chat_format.NAME
        return None

    def template_chat_format(self, template: str, source: str) -> TemplateChatFormat:
        """The chat format of the jinja `template` in place of the model's (vLLM's per-request
        `chat_template`), rendered with the model folder's special tokens as a template given
        to `from_model_dir` is; `source` names it in messages. It compiles on first use: a
        syntax error, or its own code failing, is then a TokenizerError whose `argument` is
        "chat_template". The last few are kept, compiled (`TEMPLATE_CACHE_ENTRIES`), unlocked:
        threads calling this at once (the server's tokenizer threads) may each compile the
        same template, harmlessly; each cache write is one dict operation."""
        key = (template, source)
        chat_format = self._template_formats.pop(key, None)
        if chat_format is None:
            chat_format = TemplateChatFormat(
                self,
                template,
                template_tokens=self._template_tokens,
                source=source,
                argument="chat_template",
            )
        self._template_formats[key] = chat_format  # now the most recently used
        if len(self._template_formats) > TEMPLATE_CACHE_ENTRIES:
            self._template_formats.popitem(last=False)
        return chat_format

    def check_chat_template(self) -> None:
        """Render a sample dialog with the model's own chat template, if it has one, so that a
        template that cannot render (a jinja syntax error, an expression that fails) is a
        TokenizerError naming its file now, not at the first request. So is one that leaves a
        message's text out (an empty template would make every chat prompt empty)."""
        if isinstance(self._chat_format, TemplateChatFormat):
            rendered = self.decode(self._chat_format.encode_dialog(TEMPLATE_CHECK_DIALOG))
            for message in TEMPLATE_CHECK_DIALOG:
                if message.content not in rendered:
                    raise TokenizerError(
                        f"{self._chat_format.source}: the chat template leaves the "
                        f"{message.role} message {message.content!r} out of a sample dialog "
                        f"(it renders {rendered[:80]!r})"
                    )

    def find_special(self, text: str) -> str | None:
        """The first special token's text occurring in `text`, if any: text that only
        `allow_special=True` turns into a control token. A non-special added token (Qwen3's
        `<think>`) is not one: plain encoding makes it its token too, as HF does."""
        if self._special_regex is None:
            return None
        match = self._special_regex.search(text)
        return match.group() if match else None

    def special_texts_in(self, text: str) -> list[str]:
        """Every special token's text occurring in `text`, in order, as `find_special` finds
        the first (one scan: a long conversation's render holds thousands)."""
        return [] if self._special_regex is None else self._special_regex.findall(text)

    def split_special(self, text: str) -> list[str | int]:
        """`text` cut at its special/added tokens: ordinary strings and the tokens' ids, in order."""
        parts: list[str | int] = []
        position = 0
        if self._special_or_added_regex is not None:
            for match in self._special_or_added_regex.finditer(text):
                if match.start() > position:
                    parts.append(text[position : match.start()])
                parts.append(self._added_ids[match.group()])
                position = match.end()
        if position < len(text):
            parts.append(text[position:])
        return parts

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size})"


def _tiktoken_parts(
    data: bytes, source: str, added_tokens: list[AddedToken] | None
) -> tuple[RankMerger, list[bytes | None], list[AddedToken]]:
    """A tiktoken file's merger, bytes by id and special tokens (Llama 3's unless the folder names them)."""
    ranks = parse_tiktoken_bpe(data, source)
    num_base = len(ranks)
    top_rank = max(ranks.values())
    if top_rank != num_base - 1:
        raise TokenizerError(
            f"{source}: ranks must be 0..{num_base - 1} without gaps, found rank {top_rank}"
        )
    for byte in sorted(UTF8_BYTES):
        if bytes([byte]) not in ranks:
            raise TokenizerError(f"{source}: no token for the single byte 0x{byte:02X}")
    if added_tokens is None:
        added_tokens = [
            AddedToken(name, i, True) for name, i in llama3_special_tokens(num_base).items()
        ]
    else:  # the folder's: what a bad one says is where it came from
        source = f"{source} with tokenizer_config.json's added_tokens_decoder"
    size = id_table_size(
        [num_base - 1, *(t.id for t in added_tokens)],
        num_base + sum(t.id >= num_base for t in added_tokens),
        source,
    )
    token_bytes: list[bytes | None] = [None] * size
    for token, rank in ranks.items():
        token_bytes[rank] = token
    for added in added_tokens:
        content = added.content.encode("utf-8")
        taken_by = token_bytes[added.id]
        if added.id < num_base and taken_by != content:
            # The merger would still give this id to the mergeable token's text: user text
            # would then come out as the added (special) token.
            raise TokenizerError(
                f"{source}: added token {added.content!r} has id {added.id}, already the id "
                f"of the mergeable token {taken_by!r}"
            )
        token_bytes[added.id] = content
    return RankMerger(ranks), token_bytes, added_tokens
