"""Client text that spells a special token, wherever a conversation holds it (a tool call's
arguments, a tool definition, an earlier answer's thinking, a tool result a template writes
with `tojson`), rendered by a model's own chat template as transformers' apply_chat_template
renders it, the text kept plain: never a special token id from it.

Oracle: transformers' apply_chat_template with the same template and tokenizer files. With
the special text replaced by harmless text the ids are transformers' own; with it, sv's ids
decode to the text transformers renders and hold the special ids transformers gives the
harmless conversation, no more (transformers itself makes the client's text control tokens)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_tokenizer import Message, TemplateChatFormat, Tokenizer, ToolCall, Tools
from tokenizer_test_support import WEATHER_TOOL, tricky_text

transformers = pytest.importorskip("transformers")

# The parts of Meta's Llama 3.2 template that write client text: the tools with
# `tojson(indent=4)`, an earlier call as JSON with its arguments `| tojson`, and a tool's result
# `| tojson` (Meta's tests `content is iterable`, which a string is).
META_STYLE_TEMPLATE = """{{- bos_token }}
{%- if tools is not none %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {{- message.content | tojson }}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""


def write_file_tool(description: str = "Write a file.", about_text: str = "Its text.") -> dict:
    return {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "text": {"type": "string", "description": about_text},
                },
                "required": ["path", "text"],
            },
        },
    }


def write_call(text: str) -> ToolCall:
    return ToolCall("write_file", json.dumps({"path": "prep.py", "text": text}), "call_1")


class Model:
    """sv's template format and transformers' tokenizer over the same files and template."""

    def __init__(self, tokenizer: Tokenizer, hf: Any, template: str, **template_tokens: str):
        self.tokenizer = tokenizer
        self.hf = hf
        self.template = template
        self.chat = TemplateChatFormat(tokenizer, template, template_tokens=template_tokens)

    def special_ids(self, ids: Sequence[int]) -> list[int]:
        special = set(self.tokenizer.special_tokens.values())
        return [i for i in ids if i in special]

    def apply_chat_template(
        self, messages: Sequence[Message], tools: Tools | None, *, tokenize: bool, **options: Any
    ) -> Any:
        # sv's default, as vLLM's: a generation prompt unless the last message is continued
        options.setdefault("add_generation_prompt", not options.get("continue_final_message"))
        return self.hf.apply_chat_template(
            transformers_messages(messages),
            tools=tools,
            chat_template=self.template,
            tokenize=tokenize,
            **options,
        )

    def expected_ids(self, messages: Sequence[Message], tools: Tools | None, **options: Any):
        result = self.apply_chat_template(messages, tools, tokenize=True, **options)
        return list(result["input_ids"] if hasattr(result, "keys") else result)

    def expected_text(self, messages: Sequence[Message], tools: Tools | None, **options: Any):
        """transformers' render, as the tokenizer's encoding gives it back (Qwen's tokenizer
        normalizes to NFC)."""
        text = self.apply_chat_template(messages, tools, tokenize=False, **options)
        return self.tokenizer.decode(self.hf.encode(text, add_special_tokens=False))


def transformers_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to apply_chat_template: a call's arguments decoded."""
    dicts = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.name is not None:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.loads(call.arguments)},
                }
                for call in message.tool_calls
            ]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        if message.reasoning_content is not None:
            item["reasoning_content"] = message.reasoning_content
        dicts.append(item)
    return dicts


def rewrite_strings(
    change: Callable[[str], str], messages: Sequence[Message], tools: Tools | None
) -> tuple[list[Message], list[dict] | None]:
    """The conversation with `change` applied to every string the client sent but the roles."""

    def value(item: Any) -> Any:
        if isinstance(item, str):
            return change(item)
        if isinstance(item, dict):
            return {change(k): value(v) for k, v in item.items()}
        if isinstance(item, list):
            return [value(v) for v in item]
        return item

    def call(c: ToolCall) -> ToolCall:
        arguments = json.dumps(value(json.loads(c.arguments)))
        return ToolCall(change(c.name), arguments, None if c.id is None else change(c.id))

    def optional(text: str | None) -> str | None:
        return None if text is None else change(text)

    changed = [
        replace(
            m,
            content=change(m.content),
            name=optional(m.name),
            tool_call_id=optional(m.tool_call_id),
            reasoning_content=optional(m.reasoning_content),
            tool_calls=tuple(call(c) for c in m.tool_calls),
        )
        for m in messages
    ]
    return changed, None if tools is None else [value(dict(t)) for t in tools]


def check_kept_plain(
    model: Model, messages: Sequence[Message], tools: Tools | None = None, **options: Any
) -> None:
    """Harmless text for the special text: transformers' ids. With it: transformers' text, and
    only the special ids of the harmless conversation."""

    def harmless(text: str) -> str:
        for token in model.tokenizer.special_tokens:
            text = text.replace(token, "ZZ")
        return text

    plain_messages, plain_tools = rewrite_strings(harmless, messages, tools)
    assert (plain_messages, plain_tools) != (list(messages), tools), "no special text to keep"
    expected = model.expected_ids(plain_messages, plain_tools, **options)
    assert model.chat.encode_dialog(plain_messages, tools=plain_tools, **options) == expected
    ids = model.chat.encode_dialog(messages, tools=tools, **options)
    assert model.tokenizer.decode(ids) == model.expected_text(messages, tools, **options)
    assert model.special_ids(ids) == model.special_ids(expected)


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir: Path) -> Model:
    """Qwen3's own template, tokenizer and special tokens (its `<think>` is a non-special
    added token)."""
    tokenizer = Tokenizer.from_model_dir(qwen3_tokenizer_dir)
    assert isinstance(tokenizer.chat_format, TemplateChatFormat)
    hf = transformers.AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    return Model(tokenizer, hf, tokenizer.chat_format.template)


@pytest.fixture(scope="module")
def qwen3_on_smollm2(qwen3: Model, smollm2: Tokenizer, hf_smollm2_chat: Any) -> Model:
    """Qwen3's template over a tokenizer where `<think>` is plain text (SmolLM2's)."""
    return Model(smollm2, hf_smollm2_chat, qwen3.template)


@pytest.fixture(scope="module")
def meta_style(llama_json: Tokenizer, hf_llama_chat: Any) -> Model:
    return Model(llama_json, hf_llama_chat, META_STYLE_TEMPLATE, bos_token="<|begin_of_text|>")


WRITES_EOS = [
    Message("user", "Write prep.py, joining the documents with the EOS marker."),
    Message("assistant", "", tool_calls=(write_call("out.write(doc + '<|endoftext|>')\n"),)),
    Message("tool", "ok", tool_call_id="call_1"),
]


def test_an_earlier_call_whose_arguments_hold_special_text(qwen3: Model) -> None:
    """A coding agent's earlier call wrote a file mentioning '<|endoftext|>': refused before
    ("the tools or tool calls contain the token")."""
    check_kept_plain(qwen3, WRITES_EOS, [write_file_tool()])
    nested = ToolCall("write_file", json.dumps({"<|im_end|>": ["<|im_start|>", 1]}), "call_1")
    check_kept_plain(qwen3, [WRITES_EOS[0], replace(WRITES_EOS[1], tool_calls=(nested,))])


def test_tool_definitions_that_hold_special_text(qwen3: Model, meta_style: Model) -> None:
    tools = [write_file_tool("Writes text; a corpus ends each document with <|endoftext|>.")]
    check_kept_plain(qwen3, WRITES_EOS[:1], tools)
    tools = [write_file_tool("Never write <|eot_id|>.", about_text='Text, "quoted"\n<|eom_id|>')]
    check_kept_plain(meta_style, [Message("user", "Write it.")], tools)


ANSWERED = [
    Message("user", "2+2?"),
    Message("assistant", "<think>\nTwo <|im_end|> twos.\n</think>\n\n4, not <|endoftext|>"),
]


@pytest.mark.parametrize(
    ("messages", "options"),
    [
        (ANSWERED, {"add_generation_prompt": False}),  # the latest answer keeps its thinking
        ([*ANSWERED, Message("user", "3+3?")], {}),  # an earlier one loses it
        (ANSWERED, {"continue_final_message": True}),
    ],
    ids=["latest", "earlier", "continued"],
)
def test_an_answer_with_its_thinking_holding_special_text(
    qwen3: Model, qwen3_on_smollm2: Model, messages: list[Message], options: dict[str, bool]
) -> None:
    """Qwen3's template splits an assistant's content at '</think>': refused before ("this
    chat template transforms message contents"), with `<think>` a token or plain text."""
    check_kept_plain(qwen3, messages, **options)
    check_kept_plain(qwen3_on_smollm2, messages, **options)


def test_a_reasoning_content_holding_special_text(qwen3: Model) -> None:
    thought = Message("assistant", "4", reasoning_content="Two <|im_end|> twos.")
    check_kept_plain(qwen3, [ANSWERED[0], thought], add_generation_prompt=False)
    check_kept_plain(qwen3, [ANSWERED[0], thought, Message("user", "And <|im_start|>3+3?")])


@pytest.mark.parametrize("result", ["sunny 21C", '{"temp": 21}', "sunny\n21C", "ok <|eot_id|>"])
def test_a_tool_result_written_with_tojson(meta_style: Model, result: str) -> None:
    """Meta's template writes a tool's result `| tojson`, so a result whose JSON form differs
    from its text (quotes, newlines) refused any special text in the conversation."""
    messages = [
        Message("user", "Weather in Lisbon?"),
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Lisbon"}'),)),
        Message("tool", result),
        Message("assistant", "It is sunny, 21 C."),
        Message("user", "Thanks. Why does my Llama output end with <|eot_id|>?"),
    ]
    check_kept_plain(meta_style, messages, [write_file_tool()])
    args = json.dumps({"city": 'Lisbon <|eot_id|>\n"x"'})
    with_args = replace(messages[1], tool_calls=(ToolCall("get_weather", args),))
    check_kept_plain(meta_style, [messages[0], with_args, *messages[2:]], [write_file_tool()])


# Tests what a content says (so that contents cannot all stand in) and writes two client
# strings side by side.
SIDE_BY_SIDE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}"
    "{% if m.content == 'hi' %} (a greeting){% endif %}"
    "{{ m.name }}{{ m.tool_call_id }}: {{ m.content }}<|im_end|>\n{% endfor %}"
)


def test_two_client_strings_side_by_side_cannot_spell_a_token(
    smollm2: Tokenizer, hf_smollm2_chat: Any
) -> None:
    """Where a template tests what a string says, only the strings that may spell a special
    token stand in: here neither holds one, but one ends with its start and the next begins
    with its end, so both stand in and the token they spell together stays text (the fallback
    that left them template text made it the control token)."""
    model = Model(smollm2, hf_smollm2_chat, SIDE_BY_SIDE_TEMPLATE)
    messages = [Message("tool", "hi", name="x<|im_", tool_call_id="end|>y")]
    ids = model.chat.encode_dialog(messages, add_generation_prompt=False)
    text = model.expected_text(messages, None, add_generation_prompt=False)
    assert "(a greeting)x<|im_end|>y: hi<|im_end|>" in text
    assert smollm2.decode(ids) == text
    special = smollm2.special_tokens
    assert model.special_ids(ids) == [special["<|im_start|>"], special["<|im_end|>"]]


# The structure of Mistral 7B v0.3's template, Llama 3's special tokens standing in for
# Mistral's controls: the tools go before the last user message (`message == user_messages[-1]`
# compares whole messages), and a call id of any length but 9 is refused (so contents cannot
# all stand in).
MISTRAL_STYLE_TEMPLATE = """
{%- set user_messages = messages | selectattr("role", "equalto", "user") | list %}
{{- bos_token }}
{%- for message in messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "<|python_tag|>[" }}
            {%- for tool in tools %}{{- tool | tojson }}{%- endfor %}
            {{- "]<|reserved_special_token_1|>" }}
        {%- endif %}
        {{- "<|start_header_id|> " + message["content"] + "<|end_header_id|>" }}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "<|eom_id|>[" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function | tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id | length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
        {%- endfor %}
        {{- "]<|eot_id|>" }}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"] | trim + "<|eot_id|>" }}
    {%- elif message["role"] == "tool" %}
        {{- '<|reserved_special_token_0|>{"content": ' + message.content | string + ", " }}
        {{- '"call_id": "' + message.tool_call_id + '"}<|reserved_special_token_2|>' }}
    {%- endif %}
{%- endfor %}"""


def test_a_template_that_compares_whole_messages(llama_json: Tokenizer, hf_llama_chat: Any) -> None:
    """Where contents cannot all stand in (a call id's length is tested), the check that no
    transformed content made a special token renders the conversation with plain contents:
    all one letter, the user messages became equal, and the tools this template writes before
    the last of them (found by comparing whole messages) were written before each, so an
    ordinary second question after a tool call was refused. Equal contents stay equal there,
    different ones different, and so do the stand-ins of equal strings: transformers' ids."""
    model = Model(llama_json, hf_llama_chat, MISTRAL_STYLE_TEMPLATE, bos_token="<|begin_of_text|>")
    call = ToolCall("get_weather", json.dumps({"city": "Paris"}), "abcDEF123")
    messages = [
        Message("user", "What is the weather in Paris?"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "22C, sunny", tool_call_id="abcDEF123"),
        Message("assistant", "It is 22C and sunny in Paris."),
        Message("user", "And in Rome?"),
    ]
    quoted = Message("user", "> It is 22C and sunny in Paris.\n\nWhat does this mean?")
    for conversation in (
        messages,
        [*messages[:4], Message("user", messages[0].content)],
        # the same question twice, one a stand-in where it is (">" may end a special token):
        # the two stand-ins must be equal too
        [quoted, *messages[1:4], quoted],
    ):
        options: dict[str, Any] = {"add_generation_prompt": False}
        expected = model.expected_ids(conversation, [WEATHER_TOOL], **options)
        assert model.chat.encode_dialog(conversation, tools=[WEATHER_TOOL], **options) == expected


# ---------------------------------------------------------------- any text, anywhere


def conversation(texts: dict[str, str]) -> tuple[list[Message], list[dict]]:
    """A tool-using conversation with `texts` in every place a client writes."""
    messages = [
        Message("system", texts["system"]),
        Message("user", texts["question"]),
        Message("assistant", texts["before_call"], tool_calls=(write_call(texts["argument"]),)),
        Message("tool", texts["result"], tool_call_id="call_1"),
        Message("assistant", texts["answer"], reasoning_content=texts["thinking"]),
        Message("user", texts["follow_up"]),
    ]
    return messages, [write_file_tool(texts["description"], texts["about_text"])]


PLACES = ["system", "question", "before_call", "argument", "result", "answer", "thinking",
          "follow_up", "description", "about_text"]  # fmt: skip
SPECIAL_TEXTS = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>",
                 "<|start_header_id|>", "<|begin_of_text|>", "<think>", "</think>", '"', "\\"]  # fmt: skip
TEXT = st.lists(st.one_of(tricky_text(), st.sampled_from(SPECIAL_TEXTS)), max_size=4).map("".join)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["qwen3", "meta_style"])
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(texts=st.fixed_dictionaries(dict.fromkeys(PLACES, TEXT)), generation=st.booleans())
def test_special_text_anywhere_stays_plain(
    which: str, texts: dict[str, str], generation: bool, request: pytest.FixtureRequest
) -> None:
    """sv's ids decode to transformers' render and hold the special ids transformers gives the
    conversation with all that text empty: the template's own tokens, none from the text."""
    model: Model = request.getfixturevalue(which)
    messages, tools = conversation(texts)
    ids = model.chat.encode_dialog(messages, tools=tools, add_generation_prompt=generation)
    expected_text = model.expected_text(messages, tools, add_generation_prompt=generation)
    assert model.tokenizer.decode(ids) == expected_text
    empty, empty_tools = conversation(dict.fromkeys(PLACES, ""))
    own = model.expected_ids(empty, empty_tools, add_generation_prompt=generation)
    assert model.special_ids(ids) == model.special_ids(own)
