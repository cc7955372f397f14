"""Tools in the chat formats: Llama 3.x's JSON tool-call format, and a template's `tools`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sv_tokenizer import Message, TemplateChatFormat, Tokenizer, TokenizerError, ToolCall
from tokenizer_test_support import WEATHER_TOOL


def test_llama3_format_writes_meta_tool_text(llama_json: Tokenizer) -> None:
    """The text Meta's Llama 3.2 template writes for tools, spelled out by hand here: its
    `tojson` writes non-ASCII as it is, the call's arguments decoded and written again (a
    client's compact JSON gets the template's spacing), and a tool's result through `tojson`
    too (a string is "iterable" to Jinja): quoted."""
    weather = {
        **WEATHER_TOOL,
        "function": {**WEATHER_TOOL["function"], "description": "Météo d'une ville"},
    }
    dialog = [
        Message("system", "Be brief."),
        Message("user", "Weather in Lisbon?"),
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city":"Lisbon"}'),)),
        Message("tool", ' {"temp": 21}', tool_call_id="call_1"),
    ]
    ids = llama_json.chat_format.encode_dialog(dialog, tools=[weather])
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with "
        "its proper arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument '
        "name and its value}.Do not use variables.\n\n"
        + json.dumps(weather, indent=4).replace("\\u00e9", "é")
        + "\n\nWeather in Lisbon?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Lisbon"}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n" {\\"temp\\": 21}"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert llama_json.decode(ids) == expected
    # Special-token text in a tool definition stays plain text.
    forged = {"type": "function", "function": {"name": "x", "description": "<|eot_id|>"}}
    ids = llama_json.chat_format.encode_dialog([Message("user", "hi")], tools=[forged])
    assert ids.count(llama_json.special_tokens["<|eot_id|>"]) == 1


@pytest.mark.parametrize("text", ["", "  \n"])
def test_llama3_tools_before_an_empty_user_message_keep_their_blank_line(
    llama_json: Tokenizer, text: str
) -> None:
    """Meta's template writes each definition and then "\n\n", then the user's text
    trimmed: an empty text leaves the definitions' "\n\n" before the end of turn (it was
    trimmed away with the message)."""
    ids = llama_json.chat_format.encode_dialog([Message("user", text)], tools=[WEATHER_TOOL])
    assert llama_json.decode(ids).endswith(
        json.dumps(WEATHER_TOOL, indent=4) + "\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama3_format_refuses_what_it_cannot_write(llama_json: Tokenizer) -> None:
    two = (ToolCall("a", "{}"), ToolCall("b", "{}"))
    with pytest.raises(TokenizerError, match="one tool call per turn"):
        llama_json.chat_format.encode_dialog([Message("assistant", "", tool_calls=two)])
    with pytest.raises(TokenizerError, match="first user message"):
        llama_json.chat_format.encode_dialog([Message("system", "s")], tools=[WEATHER_TOOL])


@pytest.mark.parametrize("tools", [[None], ["get_weather"], "abc", {"type": "function"}])
def test_tools_that_are_not_a_list_of_objects_are_refused_by_name(
    llama_json: Tokenizer, qwen3_tokenizer_dir: Path, tools: Any
) -> None:
    """The Llama 3 format wrote each such entry (each letter of "abc") as a tool of its own,
    Qwen3's template failed with an AttributeError (`tool.get`): both refuse them now."""
    qwen = Tokenizer.from_model_dir(qwen3_tokenizer_dir)
    for chat_format in (llama_json.chat_format, qwen.chat_format):
        with pytest.raises(TokenizerError, match="tools must be a list of tool definitions") as e:
            chat_format.encode_dialog([Message("user", "Hi")], tools=tools)
        assert e.value.argument == "tools"


def test_template_gets_tools_and_tool_calls(llama_json: Tokenizer) -> None:
    template = (
        "{% for t in tools %}TOOL {{ t.function.name }};{% endfor %}"
        "{% for m in messages %}[{{ m.role }}]"
        "{% if m.tool_calls %}CALL {{ m.tool_calls[0].function.name }} "
        "{{ m.tool_calls[0].function.arguments | tojson }}{% else %}{{ m.content }}{% endif %}"
        "{% if m.tool_call_id is defined %} for {{ m.tool_call_id }}{% endif %}{% endfor %}"
    )
    chat = TemplateChatFormat(llama_json, template)
    dialog = [
        Message("user", "w?"),
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city":"X"}', "c1"),)),
        Message("tool", "21", tool_call_id="c1"),
    ]
    text = llama_json.decode(chat.encode_dialog(dialog, tools=[WEATHER_TOOL]))
    assert (
        text == 'TOOL get_weather;[user]w?[assistant]CALL get_weather {"city": "X"}[tool]21 for c1'
    )
    # A tool's text that spells a special token stays text.
    ids = chat.encode_dialog(
        [Message("user", "w?")],
        tools=[{"type": "function", "function": {"name": "<|eot_id|>"}}],
    )
    assert llama_json.decode(ids) == "TOOL <|eot_id|>;[user]w?"
    assert llama_json.special_tokens["<|eot_id|>"] not in ids


# SmolLM2-Instruct's own template (as its tokenizer_config.json ships it): no place for tools.
CHATML_WITHOUT_TOOLS = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_template_without_tools_refuses_them(llama_json: Tokenizer) -> None:
    """Tools, or earlier calls, that a template would leave out of the text are refused (the
    model would never see them), naming the argument; the same conversation without them is
    encoded as before."""
    chat = TemplateChatFormat(llama_json, CHATML_WITHOUT_TOOLS)
    question = [Message("user", "Weather in Lisbon?")]
    with pytest.raises(TokenizerError, match="does not render tools") as e:
        chat.encode_dialog(question, tools=[WEATHER_TOOL])
    assert e.value.argument == "tools"
    called = [
        *question,
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Lisbon"}'),)),
        Message("tool", '{"temp": 21}', tool_call_id="call_1"),
    ]
    with pytest.raises(TokenizerError, match="tool_calls") as e:
        chat.encode_dialog(called)
    assert e.value.argument == "messages"
    text = llama_json.decode(chat.encode_dialog(question))
    assert text == "<|im_start|>user\nWeather in Lisbon?<|im_end|>\n<|im_start|>assistant\n"


def test_template_that_writes_only_tool_names_is_accepted(llama_json: Tokenizer) -> None:
    """A template whose only trace of the tools is their names still shows them: accepted."""
    template = "{% for t in tools %}{{ t.function.name }};{% endfor %}" + CHATML_WITHOUT_TOOLS
    chat = TemplateChatFormat(llama_json, template)
    text = llama_json.decode(chat.encode_dialog([Message("user", "w?")], tools=[WEATHER_TOOL]))
    assert text.startswith("get_weather;<|im_start|>user")
