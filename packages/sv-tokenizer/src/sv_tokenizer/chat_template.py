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

Keeping user text out of the control tokens: the rendered string mixes the template's own
special tokens with message contents, and encoding it with special tokens allowed would let a
message containing "<|eot_id|>" close its turn. So each content is rendered as a placeholder
(a private-use sentinel, wrapped in the content's leading/trailing whitespace so that a
template's `| trim` behaves as on the real text), and only the template's own text is searched
for special tokens. The placeholder render is checked against a render of the real
conversation: if they differ (a template that inspects or transforms contents beyond
trimming), the plain render is used only when no content contains special-token text, else
the conversation is refused with a TokenizerError rather than encoded unsafely.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import zip_longest
from typing import Any, Protocol

from .chat import ChatTokenizer, check_template_kwargs, generation_prompt
from .errors import TokenizerError
from .messages import Message, Tools

_OPEN = "\U000f0000"  # Supplementary Private Use Area-A: never in real text, untouched by
_CLOSE = "\U000f0001"  # upper/lower/trim/escaping filters
_SENTINEL = re.compile(f"{_OPEN}([0-9]+){_CLOSE}")
# transformers' continue_final_message tag, as a private-use character: the space after it is
# dropped by a template that strips the content's end, which then loses its trailing whitespace.
_CONTINUE = "\U000f0002"
_CONTINUE_TAG = _CONTINUE + " "

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


@dataclass(frozen=True)
class CompiledTemplate:
    render: RenderFunction
    variables: frozenset[str]  # the names the template reads from its caller
    functions: frozenset[str]  # the environment's own names (range, namespace, raise_exception…)


class TemplateTokenizer(ChatTokenizer, Protocol):
    """What a template format needs of a tokenizer beyond `ChatTokenizer`: the BOS token's
    text for `bos_token`, and finding and cutting at special-token text."""

    @property
    def bos_id(self) -> int | None: ...

    def token_bytes(self, id: int) -> bytes: ...

    def find_special(self, text: str) -> str | None: ...

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
        variables = jinja2.meta.find_undeclared_variables(environment.parse(template))
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

    return CompiledTemplate(render, frozenset(variables), frozenset(environment.globals))


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
        return self._render_dicts([_as_dict(m, m.content) for m in messages], options)

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
        # Everything but the contents is rendered as template text, where special-token text
        # counts: tools, tool calls (as the decoded objects the template writes, so that a
        # JSON escape such as \u003c cannot hide a token), template variables, and each
        # message's role, name, call id and earlier thinking.
        calls = [(c.name, c.decoded_arguments, c.id) for m in messages for c in m.tool_calls]
        forged = self._forged_in([list(tools or ()), calls])
        if forged is not None:
            raise TokenizerError(f"the tools or tool calls contain the token {forged}")
        for key, value in options.variables.items():
            forged = self._forged_in(value)
            if forged is not None:
                raise TokenizerError(
                    f"chat_template_kwargs {key!r} contains the token {forged}",
                    argument="chat_template_kwargs",
                )
        for index, message in enumerate(messages):
            for field in _MESSAGE_FIELDS:
                value = getattr(message, field)
                forged = None if value is None else self.tokenizer.find_special(value)
                if forged is not None:
                    raise TokenizerError(
                        f"chat message {index}: {field} {value!r} contains the token {forged}"
                    )
        rendered = self._render_messages(messages, options)
        self._check_tools_rendered(messages, options, rendered)
        end = _continued_end(rendered) if continue_final_message else len(rendered)
        segments = self._segments(messages, options, rendered)
        if segments is not None:
            return self._encode_segments(_cut(segments, end))
        # The template changes contents beyond trimming: the plain render is only safe when no
        # content holds special-token text, and when the transformed contents hold none either
        # (a template that upper- or lower-cases them could make "<|EOT_ID|>" a control token):
        # the render must hold the special tokens of the same render with every content a plain
        # letter (not empty: a template may refuse an empty message).
        for index, message in enumerate(messages):
            forged = self.tokenizer.find_special(message.content)
            if forged is not None:
                raise TokenizerError(
                    f"chat message {index} contains the special token text {forged!r} and this chat "
                    "template transforms message contents, so it cannot be kept as plain text"
                )
        without_contents = self._render_messages(
            [replace(m, content="x") for m in messages], options
        )
        made = self._special_tokens_in(rendered)
        own = self._special_tokens_in(without_contents)
        if made != own:
            index, got = next((i, m) for i, (m, o) in enumerate(zip_longest(made, own)) if m != o)
            raise TokenizerError(
                "this chat template transforms message contents, and the transformed contents "
                f"hold special-token text: the conversation renders {len(made)} special tokens "
                f"where the template alone renders {len(own)}, the first that differs being "
                f"{got!r} (number {index + 1}); so they cannot be kept as plain text"
            )
        return self.tokenizer.encode(rendered[:end], allow_special=True)

    def _forged_in(self, value: Any) -> str | None:
        """The first special token's text in `value` (JSON-like), as a template may write it:
        in any of its strings, or in its JSON text (`tojson` writes non-ASCII as it is)."""
        for text in (json.dumps(value, ensure_ascii=False, default=str), *_strings(value)):
            forged = self.tokenizer.find_special(text)
            if forged is not None:
                return forged
        return None

    def _special_tokens_in(self, text: str) -> list[str]:
        """The special tokens' texts occurring in `text`, in order."""
        found = []
        while (token := self.tokenizer.find_special(text)) is not None:
            found.append(token)
            text = text[text.index(token) + len(token) :]
        return found

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

    def _segments(
        self, messages: Sequence[Message], options: _Options, rendered: str
    ) -> list[tuple[str, bool]] | None:
        """The render cut into (text, is_message_content) pieces, or None if that cannot be trusted."""
        everything = [
            self.template,
            *(m.content for m in messages),
            *(getattr(m, f) or "" for m in messages for f in _MESSAGE_FIELDS),
            *_strings([list(options.tools or ()), dict(options.variables)]),
            *(
                t
                for m in messages
                for c in m.tool_calls
                for t in _strings([c.name, c.id, c.decoded_arguments])
            ),
        ]
        if any(_OPEN in text or _CLOSE in text for text in everything):
            return None
        placeholders = []
        cores = []
        for index, message in enumerate(messages):
            content = message.content
            core = content.strip()
            cores.append(core)
            if not core:
                # Nothing to keep apart: the content as it is, where a placeholder would be
                # text the template tests (Qwen3's `{% if content %}`) and so render otherwise.
                placeholders.append(_as_dict(message, content))
                continue
            leading = content[: len(content) - len(content.lstrip())]
            trailing = content[len(content.rstrip()) :]
            placeholders.append(_as_dict(message, f"{leading}{_OPEN}{index}{_CLOSE}{trailing}"))
        with_placeholders = self._render_dicts(placeholders, options)
        pieces = _SENTINEL.split(with_placeholders)
        # split() alternates: template text, message index, template text, ...
        segments = [
            (piece, False) if i % 2 == 0 else (cores[int(piece)], True)
            for i, piece in enumerate(pieces)
        ]
        if "".join(text for text, _ in segments) != rendered:
            return None
        return segments

    def _encode_segments(self, segments: list[tuple[str, bool]]) -> list[int]:
        """Special tokens only from template text; each run of plain text encoded in one go."""
        ids: list[int] = []
        plain: list[str] = []
        for text, is_content in segments:
            if is_content:
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


def _cut(segments: list[tuple[str, bool]], end: int) -> list[tuple[str, bool]]:
    """The segments' first `end` characters."""
    out = []
    for text, is_content in segments:
        if end <= 0:
            break
        out.append((text[:end], is_content))
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


# A message's fields other than its content that templates write as template text.
_MESSAGE_FIELDS = ("role", "name", "tool_call_id", "reasoning_content")


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


def _as_dict(message: Message, content: str) -> dict[str, Any]:
    """A message as transformers hands it to a template: `name`, `tool_calls`,
    `tool_call_id` and `reasoning_content` (also as `reasoning`) only when the message has
    them (templates test `message.name is defined`).
    A call's arguments are the decoded object, as templates expect (`arguments | tojson`)."""
    item: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        item["name"] = message.name
    if message.tool_calls:
        item["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.decoded_arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        item["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        # under both of vLLM's names, as vLLM hands an assistant's thinking to a template
        item["reasoning"] = item["reasoning_content"] = message.reasoning_content
    return item
