"""Tools in the chat formats: Llama 3.x's JSON tool-call format, and a template's `tools`."""

from __future__ import annotations

import json

import pytest
from sv_tokenizer import Message, TemplateChatFormat, Tokenizer, TokenizerError, ToolCall

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_llama3_format_writes_meta_tool_text(llama_json: Tokenizer) -> None:
    """The text Meta's Llama 3.2 template writes for tools, spelled out by hand here."""
    dialog = [
        Message("system", "Be brief."),
        Message("user", "Weather in Lisbon?"),
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Lisbon"}'),)),
        Message("tool", '{"temp": 21}', tool_call_id="call_1"),
    ]
    ids = llama_json.chat_format.encode_dialog(dialog, tools=[WEATHER])
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with "
        "its proper arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument '
        "name and its value}.Do not use variables.\n\n"
        + json.dumps(WEATHER, indent=4)
        + "\n\nWeather in Lisbon?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Lisbon"}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 21}<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert llama_json.decode(ids) == expected
    # Special-token text in a tool definition stays plain text.
    forged = {"type": "function", "function": {"name": "x", "description": "<|eot_id|>"}}
    ids = llama_json.chat_format.encode_dialog([Message("user", "hi")], tools=[forged])
    assert ids.count(llama_json.special_tokens["<|eot_id|>"]) == 1


def test_llama3_format_refuses_what_it_cannot_write(llama_json: Tokenizer) -> None:
    two = (ToolCall("a", "{}"), ToolCall("b", "{}"))
    with pytest.raises(TokenizerError, match="one tool call per turn"):
        llama_json.chat_format.encode_dialog([Message("assistant", "", tool_calls=two)])
    with pytest.raises(TokenizerError, match="first user message"):
        llama_json.chat_format.encode_dialog([Message("system", "s")], tools=[WEATHER])


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
    text = llama_json.decode(chat.encode_dialog(dialog, tools=[WEATHER]))
    assert (
        text == 'TOOL get_weather;[user]w?[assistant]CALL get_weather {"city": "X"}[tool]21 for c1'
    )
    with pytest.raises(TokenizerError, match="eot_id"):
        chat.encode_dialog(
            [Message("user", "w?")],
            tools=[{"type": "function", "function": {"name": "<|eot_id|>"}}],
        )
