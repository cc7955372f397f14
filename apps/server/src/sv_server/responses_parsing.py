"""OpenAI's Responses API (POST /v1/responses) in: a body checked into the same
`GenerationRequest` a chat completion makes (messages, tools, grammar, sampling), so that both
run one generation path; only the answer's shapes differ (responses_bodies.py).

    input         a string (one user message) or a list of items: messages (roles user,
                  system, developer, assistant; text parts only), function_call and
                  function_call_output items (an assistant's tool call and its result), and
                  reasoning items of an earlier turn (the next assistant turn's
                  reasoning_content, as chat takes it)
    instructions  a system message before the input
    tools         flat function tools {"type": "function", "name", "parameters", ...}
    text.format   text, json_object or json_schema: the grammar of chat's response_format
    include       ["message.output_text.logprobs"], with top_logprobs: chat's logprobs
    the sampling fields chat takes (max_output_tokens is chat's max_tokens)

This server keeps nothing between requests: `previous_response_id`, `conversation`,
`background` and stored `prompt` templates are refused (the client sends the whole
conversation in `input`); `store` is accepted (it is OpenAI's default) and answered as false.
A field the server cannot honour is refused with a 400 naming it, as chat refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sv_engine import MAX_LOGPROBS, EngineError
from sv_engine.grammar import Grammar
from sv_tokenizer import Message, ToolCall

from sv_server.body import JsonTextError, json_value
from sv_server.errors import bad_request
from sv_server.fields import checked_field, optional_bool, optional_int, optional_str, shown_value
from sv_server.request_parsing import GenerationRequest, parse_sampling
from sv_server.tool_parsers import ToolCallParser
from sv_server.tools import parse_tools

# Chat's sampling fields that mean the same here, vLLM's extras included (vLLM takes them on
# /v1/responses too): handed to the chat parser's own checks as they are.
_SAMPLING_FIELDS = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "stream",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "bad_words",
        "allowed_token_ids",
        "skip_special_tokens",
        "structured_outputs",  # beside text.format, as vLLM's Responses request takes it
    }
)
_OWN_FIELDS = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "text",
        "stream_options",
        "top_logprobs",
        "store",
        "metadata",
        "truncation",
        "include",
        "service_tier",
        "reasoning",
        "background",
        "max_tool_calls",
        # how long a prompt's cache is kept: the prefix cache here keeps pages while the pool
        # has room, whatever is asked, so either value is accepted (and echoed)
        "prompt_cache_retention",
    }
)
# What needs a server that keeps responses: refused with one reason, whatever the value.
_STATEFUL_FIELDS = ("previous_response_id", "conversation", "prompt")
_STATELESS = (
    "this server stores no responses, conversations or prompts: send the whole "
    "conversation in 'input' (and 'instructions')"
)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Asked by clients that keep no state on the server (Codex CLI): a reasoning item's thinking to
# send back next turn. Nothing here is encrypted: reasoning items carry it as `reasoning_text`
# content, so there is nothing more to include and the entry is accepted as met.
_ENCRYPTED_REASONING = "reasoning.encrypted_content"
_INCLUDABLE = (LOGPROBS_INCLUDE, _ENCRYPTED_REASONING)
MAX_METADATA = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
# Image, file and audio parts: this server's models read text only.
_MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio"})


def parse_responses_request(
    body: Any, tool_call_parser: ToolCallParser = "llama3_json"
) -> GenerationRequest:
    """A /v1/responses body, checked, as the chat request it amounts to (tool calls in
    `tool_call_parser`'s format)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_fields(body)
    instructions = optional_str(body, "instructions")
    messages = [Message("system", instructions)] if instructions is not None else []
    messages += _input(body.get("input"))
    if not messages:
        raise bad_request("'input' must hold at least one item", param="input")
    max_output = optional_int(body, "max_output_tokens", 1)
    sampling = {key: value for key, value in body.items() if key in _SAMPLING_FIELDS}
    req = parse_sampling(sampling, "responses", None, messages, max_output)
    functions, choice = _tools(body.get("tools")), _tool_choice(body.get("tool_choice"))
    if not functions:  # (OpenAI's clients send `tools: []` for none, which chat refuses)
        functions = None
        choice = None if choice == "auto" else choice
    tools = parse_tools(
        {
            "tools": functions,
            "tool_choice": choice,
            "parallel_tool_calls": body.get("parallel_tool_calls"),
        },
        tool_call_parser,
    )
    text_format, grammar = _text_format(body.get("text"))
    given = "text.format"
    if req.grammar is not None:  # structured_outputs'
        if grammar is not None:
            raise bad_request(
                "give one output constraint, not 'text.format' and 'structured_outputs'",
                param="structured_outputs",
            )
        grammar, given = req.grammar, "structured_outputs"
    call_grammar = tools.grammar() if tools is not None else None
    if call_grammar is not None and grammar is not None:
        raise bad_request(
            f"a required or named tool call is already constrained: drop '{given}'",
            param="tool_choice",
        )
    settings = {
        "instructions": instructions,
        "max_output_tokens": max_output,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "text": {"format": text_format},
        "metadata": body.get("metadata"),
        "user": body.get("user"),
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "prompt_cache_retention": body.get("prompt_cache_retention"),
        "truncation": body.get("truncation") or "disabled",
    }
    logprobs = _logprobs(body)
    settings["top_logprobs"] = logprobs
    return replace(
        req, tools=tools, grammar=grammar or call_grammar, logprobs=logprobs, settings=settings
    )


def _check_fields(body: Mapping[str, Any]) -> None:
    for key, value in body.items():
        if key in _STATEFUL_FIELDS:
            if value is not None:  # (null asks for nothing stored)
                raise bad_request(f"'{key}' is not supported: {_STATELESS}", param=key)
            continue
        if key not in _SAMPLING_FIELDS and key not in _OWN_FIELDS:
            raise bad_request(f"unknown field {shown_value(key)}", param=key)
    # Accepted for what they say, or refused for a value that asks for more than there is.
    optional_bool(body, "store")  # answered false
    _off(body, "background", (False,), "runs every request in the foreground, streamed or not")
    _off(body, "service_tier", ("auto", "default"), "has one service tier")
    # "auto" drops the conversation's first items when it overflows the context; this server
    # never drops input, so under either an overflow is a 400 naming 'input' ("disabled"'s
    # answer), and a conversation that fits is answered the same.
    _off(body, "truncation", ("disabled", "auto"), "takes 'disabled' or 'auto'")
    _off(body, "max_tool_calls", (), "has no built-in tools to bound")
    _off(body, "prompt_cache_retention", ("in-memory", "24h"), "takes 'in-memory' or '24h'")
    reasoning = checked_field(body, "reasoning", lambda v: isinstance(v, dict), "an object")
    if reasoning and any(value is not None for value in reasoning.values()):
        # As chat's reasoning_effort: the models here take no effort or summary setting.
        raise bad_request(
            f"'reasoning' is not supported by this server (got {shown_value(reasoning)}): its "
            "models take no reasoning effort or summary; leave it out",
            param="reasoning",
        )
    options = checked_field(body, "stream_options", lambda v: isinstance(v, dict), "an object")
    if options:
        if body.get("stream") is not True:
            raise bad_request(
                "'stream_options' is only allowed with 'stream': true", "stream_options"
            )
        # OpenAI pads its events with `obfuscation` unless this is false: these carry none.
        if set(options) - {"include_obfuscation"} or options["include_obfuscation"] not in (
            None,
            False,
        ):
            raise bad_request(
                "'stream_options' takes only 'include_obfuscation': false here (these events "
                f"carry no obfuscation padding), got {shown_value(options)}",
                "stream_options",
            )
    _metadata(body.get("metadata"))


def _logprobs(body: Mapping[str, Any]) -> int | None:
    """How many alternatives per output token, as chat's `top_logprobs` (None: no
    log-probabilities): they come with `include: ["message.output_text.logprobs"]`, OpenAI's
    way to ask for them (the other entry taken, `_ENCRYPTED_REASONING`, asks for nothing)."""
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list) or any(item not in _INCLUDABLE for item in include)
    ):
        raise bad_request(
            f"'include' takes only {LOGPROBS_INCLUDE!r} and {_ENCRYPTED_REASONING!r} here "
            f"(nothing else is kept to include), got {shown_value(include)}",
            param="include",
        )
    include = [item for item in include or () if item != _ENCRYPTED_REASONING]
    top = optional_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if not include:
        if top:
            raise bad_request(
                f"'top_logprobs' needs 'include': [{LOGPROBS_INCLUDE!r}]", param="top_logprobs"
            )
        return None
    return top or 0


def _off(body: Mapping[str, Any], key: str, accepted: tuple[Any, ...], why: str) -> None:
    value = body.get(key)
    if value is not None and not any(value == a and type(value) is type(a) for a in accepted):
        raise bad_request(
            f"'{key}' is not supported by this server (got {shown_value(value)}): it {why}", key
        )


def _metadata(value: Any) -> None:
    """OpenAI's metadata: up to 16 string pairs, echoed in the answer (nothing is stored)."""
    if value is None:
        return
    if not (
        isinstance(value, dict)
        and len(value) <= MAX_METADATA
        and all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= MAX_METADATA_KEY
            and len(v) <= MAX_METADATA_VALUE
            for k, v in value.items()
        )
    ):
        raise bad_request(
            f"'metadata' must be an object of at most {MAX_METADATA} string values (keys of at "
            f"most {MAX_METADATA_KEY} characters, values of at most {MAX_METADATA_VALUE}), got "
            f"{shown_value(value)}",
            param="metadata",
        )


# --- input ----------------------------------------------------------------------------------

# Fields an item of a response's `output` carries when the client sends it back as input
# (`input += response.output`): they say nothing of the conversation, so they are accepted.
_OUTPUT_ITEM_FIELDS = frozenset({"id", "status"})
_ITEM_FIELDS = {
    # (`phase`: OpenAI's label of an assistant message, which clients are told to send back)
    "message": {"type", "role", "content", "phase"},
    "function_call": {"type", "call_id", "name", "arguments"},
    "function_call_output": {"type", "call_id", "output"},
}
_ROLES = ("user", "system", "developer", "assistant")


def _input(value: Any) -> list[Message]:
    """`input` as chat messages: a string is one user message; a list's items in order, an
    assistant's consecutive function calls (and the text before them) one assistant turn."""
    if isinstance(value, str):
        return [Message("user", value)]
    if not isinstance(value, list):
        raise bad_request(
            f"'input' must be a string or a list of items, got {shown_value(value)}", param="input"
        )
    messages: list[Message] = []
    thinking: str | None = None  # a reasoning item's, for the assistant turn that follows it
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object, got {shown_value(item)}", param="input")
        kind = item.get("type") or "message"  # (the SDK's messages write "type": null)
        if kind == "reasoning":
            thinking = _reasoning_text(item, where)
            continue
        if kind not in _ITEM_FIELDS:
            raise bad_request(
                f"{where} is of type {shown_value(kind)}, which this server does not take: items "
                "are messages, function_call, function_call_output and reasoning",
                param="input",
            )
        # (a null field says nothing: the openai client's `item.model_dump()` of an output
        # item writes every optional field, most of them null)
        unknown = {k for k in item if item[k] is not None} - _ITEM_FIELDS[kind]
        unknown -= _OUTPUT_ITEM_FIELDS
        if unknown:
            raise bad_request(f"unknown field {shown_value(f'{where}.{min(unknown)}')}", "input")
        if kind == "message":
            message = _message(item, where)
            if message.role == "assistant" and thinking is not None:
                message = replace(message, reasoning_content=thinking)
            messages.append(message)
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and thinking is None:
                messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))  # its turn
            else:
                messages.append(
                    Message("assistant", "", tool_calls=(call,), reasoning_content=thinking)
                )
        else:
            call_id = _string(item, "call_id", where)
            output = _text(item.get("output"), f"{where}.output", ("input_text", "output_text"))
            messages.append(Message("tool", output, tool_call_id=call_id))
        thinking = None  # it belongs to the item just after it only
    return messages


def _reasoning_text(item: Mapping[str, Any], where: str) -> str | None:
    """A reasoning item's thinking (its `reasoning_text` parts, as this server writes them),
    which becomes the next assistant turn's reasoning_content, as chat takes it: a template
    that shows the latest thinking (Qwen3's) then renders the same prompt either way. Its
    summary and encrypted content are not the thinking and are ignored; None without text."""
    content = item.get("content")
    if content is None:
        return None
    # (its parts are pieces of one thought)
    return _text(content, f"{where}.content", ("reasoning_text",), separator="") or None


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(
            f"{where}.{key} must be a string, got {shown_value(value)}", param="input"
        )
    return value


def _message(item: Mapping[str, Any], where: str) -> Message:
    role = item.get("role")
    if role not in _ROLES:
        raise bad_request(
            f"{where}.role must be one of {', '.join(_ROLES)}, got {shown_value(role)}", "input"
        )
    # An assistant's text is what a response gave (output_text, or a refusal's text); the
    # others' is input_text.
    parts = ("output_text", "refusal") if role == "assistant" else ("input_text",)
    content = _text(item.get("content"), f"{where}.content", parts)
    return Message("system" if role == "developer" else role, content)


def _text(value: Any, where: str, parts: tuple[str, ...], separator: str = "\n") -> str:
    """A content's text: a string, or a list of text parts of the types `parts` (their
    annotations and logprobs, which a response's own output_text carries, are ignored),
    joined by `separator`: a message's with newlines, as chat's parts and vLLM's."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(
            f"{where} must be a string or a list of content parts, got {shown_value(value)}",
            "input",
        )
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _MEDIA_PARTS:
            raise bad_request(
                f"{where}[{i}] is an {kind} part: this server's models read text only", "input"
            )
        key = "refusal" if kind == "refusal" else "text"  # (a refusal part's text is its own)
        if kind not in parts or not isinstance(part.get(key), str):
            raise bad_request(
                f"{where}[{i}].type must be {' or '.join(map(repr, parts))} with a 'text' "
                f"string (a refusal's 'refusal'), got {shown_value(part)}",
                "input",
            )
        unknown = {k for k in part if part[k] is not None} - {
            "type",
            key,
            "annotations",
            "logprobs",
        }
        if unknown:
            raise bad_request(
                f"unknown field {shown_value(f'{where}[{i}].{min(unknown)}')}", "input"
            )
        texts.append(part[key])
    return separator.join(texts)


def _function_call(item: Mapping[str, Any], where: str) -> ToolCall:
    name = _string(item, "name", where)
    arguments = _string(item, "arguments", where)
    try:
        parsed = json_value(arguments)
    except JsonTextError as e:
        raise bad_request(
            f"{where}.arguments must be a JSON object's text; this text {e}", "input"
        ) from None
    if not isinstance(parsed, dict):
        raise bad_request(
            f"{where}.arguments must be a JSON object's text, got {shown_value(arguments)}", "input"
        )
    return ToolCall(name, arguments, _string(item, "call_id", where))


# --- tools and text format ------------------------------------------------------------------

_FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})


def _tools(value: Any) -> list[Any] | None:
    """Responses' flat function tools in chat's shape (`{"type": "function", "function":
    {...}}`), for chat's checks; a built-in tool (web search, file search, ...) is refused."""
    if value is None or not isinstance(value, list):
        return value  # (chat's check refuses a non-list)
    tools = []
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise bad_request(
                f"tools[{index}] is of type {shown_value(kind)}: this server runs no built-in tools; "
                "only {'type': 'function', 'name', 'parameters', ...} tools are supported",
                param="tools",
            )
        unknown = set(tool) - _FUNCTION_FIELDS - {"type"}
        if unknown:
            raise bad_request(f"unknown field 'tools[{index}].{min(unknown)}'", param="tools")
        tools.append(
            {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        )
    return tools


def _tool_choice(value: Any) -> Any:
    """Responses' `{"type": "function", "name": N}` in chat's shape; strings as they are."""
    if isinstance(value, dict):
        if value.get("type") != "function" or set(value) != {"type", "name"}:
            raise bad_request(
                "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', "
                f"'name': one of the tools}}, got {shown_value(value)}",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": value["name"]}}
    return value


def _text_format(value: Any) -> tuple[dict[str, Any], Grammar | None]:
    """`text`: ({"format": ...} as the answer repeats it, its grammar); the same grammars as
    chat's response_format."""
    if value is None:
        return {"type": "text"}, None
    if not isinstance(value, dict) or set(value) - {"format", "verbosity"}:
        raise bad_request(
            f"'text' must be an object with a 'format', got {shown_value(value)}", "text"
        )
    if value.get("verbosity") is not None:
        raise bad_request("'text.verbosity' is not supported by this server", "text")
    spec = value.get("format")
    if spec is None:
        return {"type": "text"}, None
    kind = spec.get("type") if isinstance(spec, dict) else None
    allowed = {
        "text": {"type"},
        "json_object": {"type"},
        "json_schema": {"type", "name", "schema", "strict", "description"},
    }
    if kind not in allowed:
        raise bad_request(
            "'text.format.type' must be 'text', 'json_object' or 'json_schema', got "
            f"{shown_value(kind)}",
            "text",
        )
    unknown = set(spec) - allowed[kind]
    if unknown:
        raise bad_request(f"unknown field 'text.format.{min(unknown)}'", "text")
    if kind == "text":
        return dict(spec), None
    if kind == "json_object":
        return dict(spec), Grammar.json_object()
    if not isinstance(spec.get("name"), str) or not isinstance(spec.get("schema"), dict):
        raise bad_request(
            "'text.format' of type json_schema needs a 'name' (a string) and a 'schema' (an "
            "object)",
            "text",
        )
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad_request("'text.format.strict' must be true or false", "text")
    try:
        grammar = Grammar.json_schema(spec["schema"])
        grammar.compile()
    except EngineError as e:
        raise bad_request(f"'text.format.schema': {e}", "text") from None
    return dict(spec), grammar
