"""A model folder's own jinja chat template (tokenizer_config.json / chat_template.jinja).

Rendering follows transformers' apply_chat_template: a sandboxed jinja2 environment with
trim_blocks and lstrip_blocks, the loopcontrols extension, a `{% generation %}` tag, its
`tojson` (no HTML escaping), `raise_exception()` and `strftime_now()`, and the variables
`messages`, `add_generation_prompt`, `tools`/`documents` (None), the folder's special
token strings (`bos_token`, `eos_token`, …) and the caller's `chat_template_kwargs` (e.g.
Qwen3's `enable_thinking`). jinja2 is imported only when a template is first rendered (it is
the optional `chat-template` extra).

`chat_template_kwargs` may not replace a variable the format sets itself (above, and the
environment's functions); a name the template never reads is dropped, as vLLM drops it, so a
client that sends one model's option (Qwen3's `enable_thinking`) can talk to any model. `continue_final_message` cuts the render as transformers does: a tag after the last
message's content marks where its text ends (and whether the template kept its trailing
whitespace).

Keeping client text out of the control tokens: the render mixes the template's own special
tokens with text the client sent, and encoding it with special tokens allowed would let a
message containing "<|eot_id|>" close its turn. So special tokens are looked for only in the
template's own text, found by rendering the conversation a second time with stand-ins:

- every string the client sent (contents, names, call ids, earlier thinking, a tool call's
  argument strings, the tool definitions' strings; a dict key only where it may spell a special
  token, as below, since templates look keys up by name) is a private-use sentinel (equal
  strings the same one: a template may compare messages), wrapped in
  the string's leading/trailing whitespace (so that `| trim` behaves as on the real text), with
  the texts the template searches strings for kept as they are around it (so that Qwen3's
  `'</think>' in content` and `content.split('</think>')` take the same branches and cut at
  the same places);
- each sentinel is matched to what the template wrote for it in the real render: the string
  itself or, within `tojson`'s output, its JSON-escaped form. The pieces must give the real
  render exactly, else the stand-ins are not trusted.

The text searched for special tokens is the stand-in render's outside its sentinels, which holds
no client string that holds special-token text: a client's text holding the sentinel
characters, or a template cutting a sentinel apart, can make the matching fail, never forge a
token.

Where a template tests what a string says (a call id's length, a tool name among built-in ones)
the stand-ins render otherwise: then only the strings that may spell a special token stand in
(those that hold special-token text in any letter case, or begin with the end of one or end
with the start of one, which the text written next to them could complete: a template may
change a tool name's case as well as a content's), the rest is template text, and that
text must hold the special tokens of the same render with every content plain letters (a
template that lower-cases contents could make a user's "<|EOT_ID|>" a control token; equal
contents alike, different ones not, for a template that compares messages) and every other
string's special-token delimiters ('<', '>', ...) private-use characters (a template that
writes a tool name `| replace('-', '_')` could make "<|eot-id|>" one; a name without them,
which a template may compare with a built-in one, is left as it is). A string
that may spell a special token and that even this cannot keep apart (the template transforms
it) is refused with a TokenizerError. Roles and `chat_template_kwargs` are always template
text: they are refused up front if they hold special-token text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from itertools import zip_longest
from typing import TYPE_CHECKING, Any, Protocol

from .chat import ChatTokenizer, check_template_kwargs, generation_prompt
from .errors import TokenizerError
from .messages import Message, Tools, check_tools

if TYPE_CHECKING:
    import jinja2.nodes

_OPEN = "\U000f0000"  # Supplementary Private Use Area-A: rare in real text, untouched by
_CLOSE = "\U000f0001"  # upper/lower/trim/escaping filters (`tojson` without ensure_ascii too)
_SENTINEL = re.compile(f"{_OPEN}([0-9]+){_CLOSE}")
# transformers' continue_final_message tag, as a private-use character: the space after it is
# dropped by a template that strips the content's end, which then loses its trailing whitespace.
_CONTINUE = "\U000f0002"
_CONTINUE_TAG = _CONTINUE + " "
# The first of the private-use characters that stand in for a special token's delimiters in
# the check of a transforming template (`_defused`).
_DELIMITER_STAND_INS = 0xF0100

# Variables the format sets itself: what transformers passes besides the caller's kwargs (and
# vLLM's own request fields), and every special-token name transformers may pass.
_SET_BY_THE_FORMAT = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
    }
)

RenderFunction = Callable[..., str]
Segment = tuple[str, bool]  # a piece of a render, and whether it is client text


# str methods whose first argument is a text the template looks for in a string.
_SEARCHING_METHODS = frozenset(
    {
        "split",
        "rsplit",
        "partition",
        "rpartition",
        "startswith",
        "endswith",
        "find",
        "rfind",
        "index",
        "rindex",
        "count",
        "replace",
        "removeprefix",
        "removesuffix",
    }
)


def _unchanged(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class CompiledTemplate:
    render: RenderFunction
    variables: frozenset[str]  # the names the template reads from its caller
    functions: frozenset[str]  # the environment's own names (range, namespace, raise_exception…)
    # the texts it looks for in strings (`'</think>' in content`), as one regex group
    searched: re.Pattern[str] | None


class TemplateTokenizer(ChatTokenizer, Protocol):
    """What a template format needs of a tokenizer beyond `ChatTokenizer`: the BOS token's
    text for `bos_token`, and finding and cutting at special-token text."""

    @property
    def bos_id(self) -> int | None: ...

    def token_bytes(self, id: int) -> bytes: ...

    def find_special(self, text: str) -> str | None: ...

    def special_texts_in(self, text: str) -> list[str]: ...

    def split_special(self, text: str) -> list[str | int]: ...


def compile_chat_template(
    template: str, source: str, argument: str = "messages"
) -> CompiledTemplate:
    """Compile the template as transformers does. `argument`: the TokenizerError argument of a
    fault in the template's own code (a syntax error, a failing expression)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.meta
        import jinja2.nodes
        import jinja2.sandbox
    except ImportError:
        raise TokenizerError(
            f"{source}: rendering this model's chat_template needs jinja2: "
            "install sv-tokenizer[chat-template]"
        ) from None

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}…{% endgeneration %}` marks assistant text for training masks: render the body."""

        tags = {"generation"}  # noqa: RUF012 (jinja2's declared class attribute)

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(
                self.call_method("_render_body"), [], [], body
            ).set_lineno(lineno)

        def _render_body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: object,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    try:
        compiled = environment.from_string(template)
        syntax = environment.parse(template)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise TokenizerError(
            f"{source}: chat_template line {error.lineno}: {error.message}",
            argument=argument,
        ) from None

    def render(**variables: Any) -> str:
        try:
            return compiled.render(**variables)
        except jinja2.exceptions.TemplateError as error:
            raise TokenizerError(
                f"{source}: the chat template refused the conversation: {error}"
            ) from None
        except Exception as error:  # the template's own code failed (e.g. `'a' + 1`)
            raise TokenizerError(
                f"{source}: the chat template failed: {type(error).__name__}: {error}",
                argument=argument,
            ) from None

    return CompiledTemplate(
        render,
        frozenset(jinja2.meta.find_undeclared_variables(syntax)),
        frozenset(environment.globals),
        _searched_texts(syntax),
    )


def _searched_texts(syntax: jinja2.nodes.Template) -> re.Pattern[str] | None:
    """The string constants the template looks for in a string: `'x' in s`, `s.split('x')`
    (and the other `_SEARCHING_METHODS`), `s | replace('x', …)`; longest first, as one regex
    group (so that split() keeps them)."""
    import jinja2.nodes as nodes

    found: list[nodes.Expr] = []
    for compare in syntax.find_all(nodes.Compare):
        if compare.ops[0].op in ("in", "notin"):
            found.append(compare.expr)
    for call in syntax.find_all(nodes.Call):
        if isinstance(call.node, nodes.Getattr) and call.node.attr in _SEARCHING_METHODS:
            found += call.args[:1]
    for filter in syntax.find_all(nodes.Filter):
        if filter.name == "replace":
            found += filter.args[:1]
    texts = {
        node.value
        for node in found
        if isinstance(node, nodes.Const) and isinstance(node.value, str) and node.value
    }
    if not texts:
        return None
    return re.compile(f"({'|'.join(map(re.escape, sorted(texts, key=len, reverse=True)))})")


@dataclass(frozen=True)
class _Options:
    """What a render takes besides the messages."""

    add_generation_prompt: bool
    tools: Tools | None
    variables: Mapping[str, Any]


class TemplateChatFormat:
    def __init__(
        self,
        tokenizer: TemplateTokenizer,
        template: str,
        *,
        template_tokens: Mapping[str, str] | None = None,
        source: str | None = None,
        argument: str = "messages",
    ) -> None:
        """`source` names the file that holds the template, for error messages. `argument`:
        what a server names when the template's own code fails: "messages" for the model's
        template (it rendered a sample dialog at load, so these messages made it fail),
        "chat_template" for a template the request brought."""
        self.tokenizer = tokenizer
        self.template = template
        self.source = source or f"{tokenizer.source} chat_template"
        self.argument = argument
        self.template_tokens = dict(template_tokens or {})
        if "bos_token" not in self.template_tokens and tokenizer.bos_id is not None:
            self.template_tokens["bos_token"] = tokenizer.token_bytes(tokenizer.bos_id).decode(
                "utf-8", "replace"
            )
        self._compiled: CompiledTemplate | None = None

    def _template(self) -> CompiledTemplate:
        if self._compiled is None:
            self._compiled = compile_chat_template(self.template, self.source, self.argument)
        return self._compiled

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Tools | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The template's text for this conversation, exactly as transformers renders it."""
        messages, options = self._prepare(
            messages, add_generation_prompt, continue_final_message, tools, chat_template_kwargs
        )
        rendered = self._render_messages(messages, options)
        return rendered[: _continued_end(rendered)] if continue_final_message else rendered

    def _prepare(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool | None,
        continue_final_message: bool,
        tools: Tools | None,
        chat_template_kwargs: Mapping[str, Any] | None,
    ) -> tuple[Sequence[Message], _Options]:
        """The options checked; with continue_final_message, the tag after the last content."""
        generation = generation_prompt(messages, add_generation_prompt, continue_final_message)
        check_tools(tools)
        options = _Options(generation, tools, self._variables(chat_template_kwargs))
        if continue_final_message:
            last = messages[-1]
            messages = [*messages[:-1], replace(last, content=last.content + _CONTINUE_TAG)]
        return messages, options

    def _variables(self, chat_template_kwargs: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """The caller's template variables, checked (none replaces one the format sets), less
        those the template never reads."""
        variables = check_template_kwargs(chat_template_kwargs)
        if not variables:
            return variables
        template = self._template()
        for key in variables:
            if (
                key in _SET_BY_THE_FORMAT
                or key in self.template_tokens
                or key in template.functions
            ):
                raise TokenizerError(
                    f"chat_template_kwargs {key!r}: the chat format sets this template variable "
                    "itself (from the conversation, its own arguments or the model folder); it "
                    "cannot be replaced",
                    argument="chat_template_kwargs",
                )
        return {key: value for key, value in variables.items() if key in template.variables}

    def _render_messages(self, messages: Sequence[Message], options: _Options) -> str:
        return self._render_dicts([_as_dict(m) for m in messages], options)

    def _render_stand_ins(
        self, messages: Sequence[Message], options: _Options, stand_ins: _StandIns
    ) -> str:
        """The render with the client's strings that `stand_ins` chooses as stand-ins."""
        tools = stand_ins.value(list(options.tools)) if options.tools else None
        return self._render_dicts(
            [_as_dict(m, stand_ins.text, stand_ins.value) for m in messages],
            replace(options, tools=tools),
        )

    def _render_dicts(self, messages: list[dict[str, Any]], options: _Options) -> str:
        return self._template().render(
            **self.template_tokens,
            **options.variables,
            messages=messages,
            add_generation_prompt=options.add_generation_prompt,
            tools=list(options.tools) if options.tools else None,
            documents=None,
        )

    def encode_dialog(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Tools | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        messages, options = self._prepare(
            messages, add_generation_prompt, continue_final_message, tools, chat_template_kwargs
        )
        self._check_template_text(messages, options)
        rendered = self._render_messages(messages, options)
        self._check_tools_rendered(messages, options, rendered)
        end = _continued_end(rendered) if continue_final_message else len(rendered)
        return self._encode_segments(_cut(self._segments(messages, options, rendered), end))

    def _check_template_text(self, messages: Sequence[Message], options: _Options) -> None:
        """Refuse special-token text in what is always template text: roles (templates compare
        them) and template variables (templates test them)."""
        for key, value in options.variables.items():
            forged = self._forged_in(value)
            if forged is not None:
                raise TokenizerError(
                    f"chat_template_kwargs {key!r} contains the token {forged}",
                    argument="chat_template_kwargs",
                )
        for index, message in enumerate(messages):
            forged = self.tokenizer.find_special(message.role)
            if forged is not None:
                raise TokenizerError(
                    f"chat message {index}: role {message.role!r} contains the token {forged}"
                )

    def _segments(
        self, messages: Sequence[Message], options: _Options, rendered: str
    ) -> list[Segment]:
        """The render cut into template text and client text (the module docstring tells how),
        or a TokenizerError when client text holding special-token text cannot be kept apart."""
        segments = self._cut_at_stand_ins(messages, options, rendered, _every_string)
        if segments is not None:
            return segments
        chosen = self._may_spell_special
        segments = self._cut_at_stand_ins(messages, options, rendered, chosen)
        if segments is None:
            self._refuse_special_text(messages, options, rendered)
            # No client text stood in, and still the render was not matched: the template's
            # own text holds what reads as a sentinel (or it renders differently each time).
            chosen, segments = _no_string, [(rendered, False)]
        self._check_untransformed(messages, options, chosen, segments)
        return segments

    def _refuse_special_text(
        self, messages: Sequence[Message], options: _Options, rendered: str
    ) -> None:
        """Refuse a client string that may spell a special token and that the template
        transforms, so that it cannot be kept apart from the template's text: the first one
        that alone as a stand-in does not give the render, else the first that may spell one."""
        spelling = [
            (where, text)
            for where, text in _client_strings(messages, options.tools)
            if self._may_spell_special(text)
        ]
        if not spelling:
            return
        where, text = next(
            (
                (where, text)
                for where, text in spelling
                if self._cut_at_stand_ins(messages, options, rendered, text.__eq__) is None
            ),
            spelling[0],
        )
        token = self.tokenizer.find_special(text)
        what = (
            "a special token's text in some letter case, or the start or end of one"
            if token is None
            else f"the special token text {token!r}"
        )
        raise TokenizerError(
            f"{where} contains {what} and this chat template transforms it, so it "
            "cannot be kept as plain text"
        )

    def _may_spell_special(self, text: str) -> bool:
        """Whether `text` holds special-token text, or could spell some with the text written
        next to it (it begins with the end of a special token's text or ends with its start),
        in any letter case: a template may change a string's case (`| lower` makes a tool
        named "<|EOT_ID|>" a control token)."""
        tokens, starts, ends, longest = self._special_token_parts
        return any(
            tokens.search(folded) is not None
            or any(folded[-cut:] in starts or folded[:cut] in ends for cut in range(1, longest + 1))
            for folded in {text.lower(), text.upper().lower()}  # "ı".upper() is "I"
        )

    @cached_property
    def _special_token_parts(
        self,
    ) -> tuple[re.Pattern[str], frozenset[str], frozenset[str], int]:
        """The special tokens' texts in lower case: a pattern finding any of them, every proper
        start and every proper end of them, and the longest one's length."""
        tokens = sorted({token.lower() for token in self.tokenizer.special_tokens}, key=len)
        starts = frozenset(token[:cut] for token in tokens for cut in range(1, len(token)))
        ends = frozenset(token[cut:] for token in tokens for cut in range(1, len(token)))
        found = re.compile("|".join(map(re.escape, reversed(tokens))) or "(?!)")
        return found, starts, ends, max(map(len, starts), default=0)

    def _stand_ins(
        self, chosen: Callable[[str], bool], others: Callable[[str], str] = _unchanged
    ) -> _StandIns:
        return _StandIns(chosen, self._template().searched, self._may_spell_special, others)

    def _defused(self, text: str) -> str:
        """`text` with every character that opens or closes a special token's text replaced
        by a private-use character of its own: the same length and equal strings alike (a
        template may test a call id's length or compare names), but no rewriting of other
        characters (`replace('-', '_')`) can make it a special token."""
        return text.translate(self._delimiter_stand_ins)

    @cached_property
    def _delimiter_stand_ins(self) -> dict[int, str]:
        """A private-use character for each character a special token's text begins or ends
        with ('<' and '>' for "<|eot_id|>"), letters and digits left out: a string without
        them (a built-in tool's name, which templates compare) keeps its text."""
        delimiters = sorted(
            {
                end
                for token in self.tokenizer.special_tokens
                if token
                for end in (token[0], token[-1])
                if not end.isalnum() and not end.isspace()
            }
        )
        return {ord(char): chr(_DELIMITER_STAND_INS + n) for n, char in enumerate(delimiters)}

    def _cut_at_stand_ins(
        self,
        messages: Sequence[Message],
        options: _Options,
        rendered: str,
        chosen: Callable[[str], bool],
    ) -> list[Segment] | None:
        """The render cut at the client strings `chosen` stands in, or None if rendering them
        as stand-ins does not give the render."""
        stand_ins = self._stand_ins(chosen)
        try:
            with_stand_ins = self._render_stand_ins(messages, options, stand_ins)
        except TokenizerError:  # the template refuses a stand-in (e.g. checks an id's length)
            return None
        return _matched(with_stand_ins, stand_ins.texts, rendered)

    def _check_untransformed(
        self,
        messages: Sequence[Message],
        options: _Options,
        chosen: Callable[[str], bool],
        segments: list[Segment],
    ) -> None:
        """Client text left in the template's text holds no special-token text, but a template
        that transforms it could make some (`| lower` a user's "<|EOT_ID|>"): the template text
        must hold the special tokens of the same render with every content plain letters (not
        empty: a template may refuse an empty message), equal contents alike and different
        ones not, since a template may compare messages (Mistral's writes the tools before
        the user message that equals the last one)."""
        made = [
            token
            for text, is_client in segments
            if not is_client
            for token in self.tokenizer.special_texts_in(text)
        ]
        letters: dict[str, str] = {}
        plain = [
            replace(m, content=letters.setdefault(m.content, _plain_word(len(letters))))
            for m in messages
        ]
        defused = self._stand_ins(chosen, others=self._defused)
        own = self.tokenizer.special_texts_in(self._render_stand_ins(plain, options, defused))
        if made != own:
            index, got = next((i, m) for i, (m, o) in enumerate(zip_longest(made, own)) if m != o)
            raise TokenizerError(
                "this chat template transforms the client's strings (contents, names, ids or "
                "arguments), and the transformed strings hold special-token text: the "
                f"conversation renders {len(made)} special tokens "
                f"where the template alone renders {len(own)}, the first that differs being "
                f"{got!r} (number {index + 1}); so they cannot be kept as plain text"
            )

    def _forged_in(self, value: Any) -> str | None:
        """The first special token's text in `value` (JSON-like), as a template may write it:
        in any of its strings, or in its JSON text (`tojson` writes non-ASCII as it is)."""
        for text in (json.dumps(value, ensure_ascii=False, default=str), *_strings(value)):
            forged = self.tokenizer.find_special(text)
            if forged is not None:
                return forged
        return None

    def encode_user_prompt(self, text: str) -> list[int]:
        return self.encode_dialog([Message("user", text)])

    def _check_tools_rendered(
        self, messages: Sequence[Message], options: _Options, rendered: str
    ) -> None:
        """Refuse tools, or an assistant's earlier tool calls, that the template leaves out of
        its text (many templates have no place for them): the model would never see the
        functions it is offered, or would answer as if the calls had not been made. Left out
        means the text stays the same when their function names change (a render without them
        could fail in a template written for tools)."""
        probe = _renamed_tools(options.tools or ())
        if probe and rendered == self._render_messages(messages, replace(options, tools=probe)):
            raise TokenizerError(
                f"{self.source} does not render tools, so the model would never see them; "
                "use a model whose chat template takes tools",
                argument="tools",
            )
        if any(m.tool_calls for m in messages):
            renamed = [
                replace(m, tool_calls=tuple(replace(c, name=c.name + "_") for c in m.tool_calls))
                for m in messages
            ]
            if rendered == self._render_messages(renamed, options):
                raise TokenizerError(
                    f"{self.source} does not render an assistant message's tool_calls, so the "
                    "model would not see the calls it made; use a model whose chat template "
                    "takes them"
                )

    def _encode_segments(self, segments: list[Segment]) -> list[int]:
        """Special tokens only from template text; each run of plain text encoded in one go."""
        ids: list[int] = []
        plain: list[str] = []
        for text, is_client in segments:
            if is_client:
                plain.append(text)
                continue
            for part in self.tokenizer.split_special(text):
                if isinstance(part, str):
                    plain.append(part)
                else:
                    ids += self.tokenizer.encode("".join(plain), at_start=not ids)
                    plain.clear()
                    ids.append(part)
        ids += self.tokenizer.encode("".join(plain), at_start=not ids)
        return ids


def _continued_end(rendered: str) -> int:
    """Where a render for continue_final_message ends, as transformers cuts it: before the tag
    after the last message's content, and before that content's trailing whitespace too when
    the template strips it (it then strips the tag's space)."""
    count = rendered.count(_CONTINUE)
    if count == 0:
        raise TokenizerError(
            "continue_final_message: the chat template leaves the end of the last message out "
            "of its text, so it cannot be continued",
            argument="continue_final_message",
        )
    if count > 1:
        raise TokenizerError(
            "continue_final_message: the end of the last message is not one place in the "
            "template's text (the template repeats it, or a message holds U+F0002, the "
            "private-use character that marks it)",
            argument="continue_final_message",
        )
    at = rendered.index(_CONTINUE)
    return at if rendered.startswith(_CONTINUE_TAG, at) else len(rendered[:at].rstrip())


def _plain_word(index: int) -> str:
    """The `index`th of distinct, non-empty words of plain letters ("y", "yx", "yy", "yxx", …,
    the binary digits of index + 1): a few letters each, so that a conversation's render with
    them is as long as its messages are many, not their square."""
    return format(index + 1, "b").replace("0", "x").replace("1", "y")


def _cut(segments: list[Segment], end: int) -> list[Segment]:
    """The segments' first `end` characters."""
    out = []
    for text, is_client in segments:
        if end <= 0:
            break
        out.append((text[:end], is_client))
        end -= len(text)
    return out


def _renamed_tools(tools: Tools) -> list[dict[str, Any]] | None:
    """The tools with another name for each function (a probe of whether a template writes
    them), or None when none has a name to change."""
    renamed, changed = [], False
    for tool in tools:
        function = tool.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            tool, changed = {**tool, "function": {**function, "name": function["name"] + "_"}}, True
        renamed.append(dict(tool))
    return renamed if changed else None


# A message's fields besides its role and content that hold the client's text.
_CLIENT_FIELDS = ("name", "tool_call_id", "reasoning_content")


def _client_strings(messages: Sequence[Message], tools: Tools | None) -> Iterator[tuple[str, str]]:
    """Every string the client sent but the roles, with where it is (for an error message)."""
    for index, message in enumerate(messages):
        yield f"chat message {index}", message.content
        for field in _CLIENT_FIELDS:
            value = getattr(message, field)
            if value is not None:
                yield f"chat message {index}: {field}", value
        for call in message.tool_calls:
            for text in _strings([call.name, call.id, call.decoded_arguments]):
                yield f"chat message {index}: tool call {call.name!r}", text
    for text in _strings(list(tools or ())):
        yield "tools", text


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a JSON-like value: keys and values, at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _every_string(text: str) -> bool:
    return True


def _no_string(text: str) -> bool:
    return False


class _StandIns:
    """Stand-ins for client strings in one render, and the text each sentinel stands for."""

    def __init__(
        self,
        chosen: Callable[[str], bool],
        searched: re.Pattern[str] | None,
        may_spell_special: Callable[[str], bool],
        others: Callable[[str], str] = _unchanged,
    ) -> None:
        """`chosen`: which strings stand in; `searched`: the texts the template looks for in
        strings, kept as they are; `others`: what the strings not chosen are written as."""
        self.chosen = chosen
        self.others = others
        self.may_spell_special = may_spell_special
        self.searched = searched
        self.texts: list[str] = []
        self._given: dict[str, str] = {}  # each string's stand-in

    def text(self, text: str) -> str:
        """`text` as the template is to see it: equal strings as equal stand-ins, since a
        template may compare them (Mistral's writes the tools before the user message that
        equals the last one)."""
        if not self.chosen(text):
            return self.others(text)
        given = self._given.get(text)
        if given is not None:
            return given
        first = len(self.texts)
        stand_in = self._stand_in(text, self.searched)
        if self.searched is not None and self.may_spell_special(stand_in):
            # The searched texts kept may spell a special token: one sentinel for it all.
            del self.texts[first:]
            stand_in = self._stand_in(text, None)
        self._given[text] = stand_in
        return stand_in

    def _stand_in(self, text: str, searched: re.Pattern[str] | None) -> str:
        pieces = searched.split(text) if searched else [text]
        # split() alternates: client text, a searched text, client text, ...
        return "".join(p if i % 2 else self._sentinel(p) for i, p in enumerate(pieces))

    def _sentinel(self, text: str) -> str:
        """A sentinel for `text`, in its leading and trailing whitespace; blank text as it is
        (a sentinel would be text where a template tests for some: Qwen3's `{% if content %}`)."""
        core = text.strip()
        if not core:
            return text
        self.texts.append(core)
        leading = text[: len(text) - len(text.lstrip())]
        trailing = text[len(text.rstrip()) :]
        return f"{leading}{_OPEN}{len(self.texts) - 1}{_CLOSE}{trailing}"

    def value(self, value: Any) -> Any:
        """A JSON-like value with its strings as the template is to see them; a key only when
        it may spell a special token (templates look keys up by name: "function", "type")."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                self.text(key) if isinstance(key, str) and self.may_spell_special(key) else key: (
                    self.value(item)
                )
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        return value


def _matched(with_stand_ins: str, texts: Sequence[str], rendered: str) -> list[Segment] | None:
    """`rendered` cut into template text and client text where the render with stand-ins has
    its sentinels, each matched to the text the template wrote for it; None unless that gives
    `rendered` exactly."""
    segments: list[Segment] = []
    at = 0
    # split() alternates: template text, a sentinel's number, template text, ...
    for index, piece in enumerate(_SENTINEL.split(with_stand_ins)):
        if index % 2 and int(piece) >= len(texts):
            return None  # a sentinel the template wrote itself
        forms = _written_forms(texts[int(piece)]) if index % 2 else (piece,)
        written = next((form for form in forms if rendered.startswith(form, at)), None)
        if written is None:
            return None
        segments.append((written, index % 2 == 1))
        at += len(written)
    return segments if at == len(rendered) else None


def _written_forms(text: str) -> tuple[str, str]:
    """How a template writes a client string: JSON-escaped within `tojson`'s output (as
    transformers' tojson, non-ASCII as it is), or as it is. The escaped form is tried first:
    where both fit, the longer is taken as client text, the safe side."""
    return json.dumps(text, ensure_ascii=False)[1:-1], text


def _as_dict(
    message: Message,
    text: Callable[[str], str] = _unchanged,
    value: Callable[[Any], Any] = _unchanged,
) -> dict[str, Any]:
    """A message as transformers hands it to a template, its strings passed through `text`
    and its calls' arguments through `value`: `name`, `tool_calls`, `tool_call_id` and
    `reasoning_content` (also as `reasoning`) only when the message has them (templates test
    `message.name is defined`).
    A call's arguments are the decoded object, as templates expect (`arguments | tojson`)."""
    item: dict[str, Any] = {"role": message.role, "content": text(message.content)}
    if message.name is not None:
        item["name"] = text(message.name)
    if message.tool_calls:
        item["tool_calls"] = [
            {
                "id": None if call.id is None else text(call.id),
                "type": "function",
                "function": {"name": text(call.name), "arguments": value(call.decoded_arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        item["tool_call_id"] = text(message.tool_call_id)
    if message.reasoning_content is not None:
        # under both of vLLM's names, as vLLM hands an assistant's thinking to a template
        item["reasoning"] = item["reasoning_content"] = text(message.reasoning_content)
    return item
