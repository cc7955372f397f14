"""Chat formats: a conversation -> the token ids an instruct model was trained on.

Message contents are user text: they are encoded with `allow_special=False`, so a message that
contains the text "<|eot_id|>" cannot end its turn early or forge another role. Only the
format itself emits special tokens.

Every format encodes each stretch of text that lies between two special tokens in one go:
tokenizing the whole rendered string (as HF's apply_chat_template does) cuts the text at the
special tokens first, so the ids are identical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from .errors import TokenizerError
from .messages import Message, Tools, check_tools


class ChatTokenizer(Protocol):
    """What the Llama 3 and ChatML formats need of a tokenizer (`Tokenizer` is one): its
    special tokens' ids, plain-text encoding, and a name for error messages."""

    @property
    def source(self) -> str: ...

    @property
    def special_tokens(self) -> Mapping[str, int]: ...

    def encode(
        self, text: str, *, allow_special: bool = False, at_start: bool = True
    ) -> list[int]: ...


class ChatFormat(Protocol):
    def encode_dialog(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Tools | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The conversation's ids. `add_generation_prompt` (default: true, unless
        `continue_final_message`): end in the assistant's header, for a new answer.
        `continue_final_message`: the last message is the assistant's and is left open (no
        end-of-turn), for the model to go on writing it (vLLM's and transformers' options of
        these names; both true is an error). `tools`: the functions the model may call, written
        as the format writes them. `chat_template_kwargs`: extra variables for a model
        folder's own jinja template (transformers' `apply_chat_template(**kwargs)`); those it
        never reads, and every one given to a built-in format, are dropped, as vLLM does."""
        ...

    def encode_user_prompt(self, text: str) -> list[int]:
        """One user message followed by the assistant's header: a prompt ready to generate from."""
        ...


def generation_prompt(
    messages: Sequence[Message], add_generation_prompt: bool | None, continue_final_message: bool
) -> bool:
    """Whether to end in the assistant's header, from vLLM's pair of options: a new answer
    (the default) or the last message continued, never both."""
    if not continue_final_message:
        return True if add_generation_prompt is None else add_generation_prompt
    if add_generation_prompt:
        raise TokenizerError(
            "add_generation_prompt and continue_final_message cannot both be true: the first "
            "starts a new assistant message, the second continues the last one",
            argument="continue_final_message",
        )
    role = messages[-1].role if messages else None
    if role != "assistant":
        raise TokenizerError(
            "continue_final_message: the last message must be the assistant's (the text to "
            f"continue), got role {role!r}",
            argument="continue_final_message",
        )
    return False


def check_template_kwargs(value: object) -> Mapping[str, Any]:
    """`chat_template_kwargs` as given: a mapping of variable names (None: none)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise TokenizerError(
            f"chat_template_kwargs must map variable names to values, got {value!r}",
            argument="chat_template_kwargs",
        )
    return value


def _special_id(tokenizer: ChatTokenizer, name: str, format_name: str) -> int:
    if name not in tokenizer.special_tokens:
        raise TokenizerError(
            f"{tokenizer.source}: the {format_name} chat format needs the special token {name}"
        )
    return tokenizer.special_tokens[name]


def _check_role(message: Message, index: int, roles: Sequence[str]) -> None:
    if message.role not in roles:
        raise TokenizerError(
            f"chat message {index}: role {message.role!r} is not one of {', '.join(roles)}"
        )


class Llama3ChatFormat:
    """Llama 3 Instruct, as Meta's reference ChatFormat encodes it:

        <|begin_of_text|>
        <|start_header_id|>ROLE<|end_header_id|>\\n\\nCONTENT<|eot_id|>      (each message)
        <|start_header_id|>assistant<|end_header_id|>\\n\\n                   (generation prompt)

    Contents are stripped of surrounding whitespace (Meta's `.strip()`, the HF template's
    `| trim`). Role "tool" is written as Llama 3.1's "ipython". No default system prompt is
    added: HF's Llama 3.1/3.2 templates add a "Cutting Knowledge Date" system header, and a
    folder that ships such a template gets it through TemplateChatFormat.
    """

    NAME = "Llama 3"  # in the note that a folder without a template gets this format

    ROLES = ("system", "user", "assistant", "ipython", "tool")

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self.begin_of_text = _special_id(tokenizer, "<|begin_of_text|>", "Llama 3")
        self.start_header = _special_id(tokenizer, "<|start_header_id|>", "Llama 3")
        self.end_header = _special_id(tokenizer, "<|end_header_id|>", "Llama 3")
        self.end_of_turn = _special_id(tokenizer, "<|eot_id|>", "Llama 3")

    def _header(self, role: str) -> list[int]:
        return [self.start_header, *self.tokenizer.encode(role), self.end_header]

    def encode_message(
        self, message: Message, index: int = 0, *, open_end: bool = False
    ) -> list[int]:
        """The message's content as it is (`encode_dialog` trims it first). `open_end`:
        without its end of turn and trailing whitespace, to be continued (the HF template's
        text cut where transformers cuts it for continue_final_message)."""
        _check_role(message, index, self.ROLES)
        role = "ipython" if message.role == "tool" else message.role
        body = "\n\n" + message.content
        if open_end:
            return [*self._header(role), *self.tokenizer.encode(body.rstrip())]
        return [*self._header(role), *self.tokenizer.encode(body), self.end_of_turn]

    def encode_dialog(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Tools | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Tools and tool calls in Llama 3.x's JSON tool-call format (see tool_format.py)."""
        from .tool_format import TOOL_RESULT_ROLES, with_llama3_tools

        generation = generation_prompt(messages, add_generation_prompt, continue_final_message)
        check_template_kwargs(chat_template_kwargs)  # no variables: each is dropped
        check_tools(tools)
        # Trimmed before the tools are written in: the first user message then ends with the
        # definitions' "\n\n" when its own text is empty, as in Meta's template. A tool's
        # result is written as JSON, untrimmed, as Meta's template writes it.
        messages = [
            m if m.role in TOOL_RESULT_ROLES else replace(m, content=m.content.strip())
            for m in messages
        ]
        if tools or any(m.tool_calls or m.role in TOOL_RESULT_ROLES for m in messages):
            messages = with_llama3_tools(messages, tools)
        ids = [self.begin_of_text]
        for index, message in enumerate(messages):
            open_end = continue_final_message and index == len(messages) - 1
            ids += self.encode_message(message, index, open_end=open_end)
        if generation:
            ids += self._header("assistant") + self.tokenizer.encode("\n\n")
        return ids

    def encode_user_prompt(self, text: str) -> list[int]:
        return self.encode_dialog([Message("user", text)])


SMOLLM2_DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
)


class ChatMLFormat:
    """ChatML, as SmolLM2-Instruct's template writes it:

        <|im_start|>ROLE\\nCONTENT<|im_end|>\\n                 (each message)
        <|im_start|>assistant\\n                                (generation prompt)

    When the conversation does not start with a system message, SmolLM2's default system
    prompt comes first (as its template does; pass `default_system_prompt=None` for none).
    Contents are not stripped. No BOS token.
    """

    NAME = "ChatML"

    ROLES = ("system", "user", "assistant", "tool")

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        default_system_prompt: str | None = SMOLLM2_DEFAULT_SYSTEM_PROMPT,
    ) -> None:
        self.tokenizer = tokenizer
        self.default_system_prompt = default_system_prompt
        self.im_start = _special_id(tokenizer, "<|im_start|>", "ChatML")
        self.im_end = _special_id(tokenizer, "<|im_end|>", "ChatML")

    def _message(self, role: str, content: str, *, open_end: bool = False) -> list[int]:
        """`open_end`: without its end of turn, to be continued (SmolLM2's template writes a
        content as it is, so transformers' continue_final_message keeps all of it)."""
        text = [self.im_start, *self.tokenizer.encode(f"{role}\n{content}")]
        return text if open_end else [*text, self.im_end, *self.tokenizer.encode("\n")]

    def encode_dialog(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Tools | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        generation = generation_prompt(messages, add_generation_prompt, continue_final_message)
        check_template_kwargs(chat_template_kwargs)  # no variables: each is dropped
        if tools or any(m.tool_calls for m in messages):
            raise TokenizerError(
                f"{self.tokenizer.source}: the built-in ChatML format has no tool calls; a "
                "model folder whose chat_template renders tools gets them",
                argument="tools" if tools else "messages",
            )
        ids: list[int] = []
        if messages and messages[0].role != "system" and self.default_system_prompt is not None:
            ids += self._message("system", self.default_system_prompt)
        for index, message in enumerate(messages):
            _check_role(message, index, self.ROLES)
            open_end = continue_final_message and index == len(messages) - 1
            ids += self._message(message.role, message.content, open_end=open_end)
        if generation:
            ids += [self.im_start, *self.tokenizer.encode("assistant\n")]
        return ids

    def encode_user_prompt(self, text: str) -> list[int]:
        return self.encode_dialog([Message("user", text)])
