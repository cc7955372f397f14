"""Hermes tool calls (`--tool-call-parser hermes`, the default for Qwen's tokenizer): what Qwen3's
own chat template writes for an assistant's calls, rendered by transformers (the oracle), must
read back as the same calls and content; a streamed answer, cut anywhere, must add up to what
the whole answer gives; the grammar of a required call must take the template's text and
nothing off the schema; and end to end, a small random model with Qwen3's tokenizer, template
and vocabulary answers required calls through the official `openai` client, whole and streamed,
on chat and on /v1/responses."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_server.errors import ServerError
from sv_server.tool_parsers import default_parser, parse_answer
from sv_server.tools import ToolCallStream, apply_to_response, parse_tools
from sv_tokenizer import Tokenizer

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
SAY = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 6}},
    "required": ["text"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
    {"type": "function", "function": {"name": "say", "parameters": SAY}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAMES = list(SCHEMAS)
QUESTION = {"role": "user", "content": "Add 2 and 3, and say hi."}

# Arguments with text that looks like the format itself: tags, quotes, newlines, non-ASCII.
_TEXT = st.lists(
    st.sampled_from([*'ab "\\\n{}é\u2028', "<tool_call>", "</tool_call>"]), max_size=8
).map("".join)
_ARGUMENTS = st.dictionaries(
    st.text("xyz", min_size=1, max_size=3),
    _TEXT | st.integers(-5, 5) | st.lists(st.booleans(), max_size=2) | st.none(),
    max_size=3,
)
_CALLS = st.lists(st.tuples(st.sampled_from(NAMES), _ARGUMENTS), min_size=1, max_size=3)
_CONTENT = st.just("") | st.text(st.sampled_from(list("ab <>/\n")), min_size=1, max_size=10)


@pytest.fixture(scope="module")
def qwen_template(qwen3_tokenizer_dir: Path) -> Any:
    """Render messages as Qwen3's template does, through transformers."""
    from transformers import PreTrainedTokenizerFast

    template = json.loads((qwen3_tokenizer_dir / "tokenizer_config.json").read_text())[
        "chat_template"
    ]
    hf = PreTrainedTokenizerFast(tokenizer_file=str(qwen3_tokenizer_dir / "tokenizer.json"))

    def render(messages: list[dict[str, Any]]) -> str:
        text = hf.apply_chat_template(messages, tokenize=False, chat_template=template)
        assert isinstance(text, str)
        return text

    return render


def assistant_text(render: Any, content: str, calls: list[tuple[str, Any]]) -> str:
    """What the template writes as an assistant turn with `content` and `calls` (placed before
    a later question, so no thinking is added): the text a model trained on it answers."""
    tool_calls = [
        {"type": "function", "function": {"name": name, "arguments": arguments}}
        for name, arguments in calls
    ]
    turn = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    text = render([QUESTION, turn, {"role": "user", "content": "Thanks."}])
    start = text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    return text[start : text.index("<|im_end|>", start)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=_CONTENT, calls=_CALLS)
def test_hermes_reads_what_qwen3s_template_writes(
    qwen_template: Any, content: str, calls: list[tuple[str, Any]]
) -> None:
    text = assistant_text(qwen_template, content, calls)
    answer = parse_answer("hermes", text, NAMES)
    assert answer is not None, text
    assert [(c.name, json.loads(c.arguments)) for c in answer.calls] == calls
    assert len({c.id for c in answer.calls}) == len(calls)
    # the content is the text before the first call, as written (the template adds "\n")
    assert answer.content == (content + "\n" if content.strip() else None)


def test_hermes_answers_that_are_not_calls() -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    answer = parse_answer("hermes", "  \n" + call + "\n" + call.replace("1", "7") + "\n", NAMES)
    assert answer is not None and answer.content is None
    assert [json.loads(c.arguments)["a"] for c in answer.calls] == [1, 7]
    # the closing tag of the last call may be missing (a stop string took it)
    unclosed = parse_answer("hermes", call.removesuffix("\n</tool_call>"), NAMES)
    assert unclosed is not None and len(unclosed.calls) == 1
    for text in [
        "No call here.",
        call + " and then some words",  # text after the calls: all content, none dropped
        call + "\nmore " + call,  # text between calls
        call.replace("add", "subtract"),  # a function not offered
        call.replace('"a": 1', '"a": 1,'),  # not JSON
        call.replace("</tool_call>", "") + call,  # the first call's tag missing: not last
        '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"a": NaN}}\n</tool_call>',
        "<tool_call>\n" + "[" * 2000 + "]" * 2000 + "\n</tool_call>",
        "<tool_call>",
    ]:
        assert parse_answer("hermes", text, NAMES) is None, text
    # a llama3_json server does not read hermes calls, nor a hermes server Llama's JSON
    assert parse_answer("llama3_json", call, NAMES) is None
    assert parse_answer("hermes", '{"name": "add", "parameters": {"a": 1, "b": 2}}', NAMES) is None


def test_parallel_tool_calls_false_takes_the_first_call() -> None:
    call = '<tool_call>\n{"name": "say", "arguments": {"text": "%s"}}\n</tool_call>'
    text = "Two calls.\n" + call % "one" + "\n" + call % "two"
    single = parse_tools({"tools": TOOLS, "parallel_tool_calls": False}, "hermes")
    several = parse_tools({"tools": TOOLS}, "hermes")
    assert single is not None and several is not None
    first, both = single.parse(text), several.parse(text)
    assert first is not None and both is not None
    assert [json.loads(c.arguments) for c in first.calls] == [{"text": "one"}]
    assert [json.loads(c.arguments) for c in both.calls] == [{"text": "one"}, {"text": "two"}]
    assert first.content == both.content == "Two calls.\n"
    none = parse_tools({"tools": TOOLS, "tool_choice": "none"}, "hermes")
    assert none is not None and none.parse(text) is None


_PIECES = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "\n",
        " ",
        "Hi",
        "<",
        "<tool",
        '{"name": "add", "arguments": {"a": 1, "b": 2}}',
        '{"name": "say", "arguments": {"text": "</tool_call>"}}',
        "{",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(_PIECES, max_size=8),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    parser=st.sampled_from(["hermes", "llama3_json"]),
)
def test_a_streamed_answer_adds_up_to_the_whole_one(
    pieces: list[str], cuts: list[int], parser: Any
) -> None:
    """Streamed in any pieces, the content deltas and the calls are the whole answer's."""
    text = "".join(pieces)
    tools = parse_tools({"tools": TOOLS}, parser)
    assert tools is not None
    body: dict[str, Any] = {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}
    apply_to_response(body, tools)
    whole = body["choices"][0]
    stream = ToolCallStream(tools)
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    deltas = []
    for start, end in itertools.pairwise(bounds):
        deltas += stream.push(text[start:end])
    deltas += stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    assert content == (whole["message"]["content"] or "")
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        for part in delta.get("tool_calls", []):
            call = calls.setdefault(part["index"], {"name": "", "arguments": ""})
            call["name"] += part["function"].get("name", "")
            call["arguments"] += part["function"]["arguments"]
    expected = whole["message"].get("tool_calls", [])
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in expected
    ]
    assert stream.called == (whole["finish_reason"] == "tool_calls")
    # content goes out as soon as it is known not to be a call: only a possible tag is held
    if parser == "hermes" and "<" not in text and text.strip():
        assert "".join(d.get("content", "") for d in deltas[: len(bounds) - 1]) == text


@pytest.fixture(scope="module")
def accepts(qwen3_tokenizer_dir: Path) -> Any:
    """Whether a request's tool-call grammar takes a text whole (over Qwen3's vocabulary)."""
    from sv_engine.grammar import Grammars

    tokenizer = Tokenizer.from_model_dir(qwen3_tokenizer_dir)
    grammars = Grammars(tokenizer, 151936, frozenset({151645}))

    def check(tools: Any, text: str) -> bool:
        matcher = grammars.matcher(tools.grammar()).matcher
        ids = tokenizer.encode(text)
        return matcher.validate_tokens(ids) == len(ids) and bool(
            matcher.consume_tokens(ids) and matcher.is_accepting()
        )

    return check


def test_prose_that_names_the_tag_is_not_held() -> None:
    """Held text goes out once the first tag is known to start no call."""
    tools = parse_tools({"tools": TOOLS}, "hermes")
    assert tools is not None
    stream = ToolCallStream(tools)
    assert stream.push("Wrap calls in ") == [{"content": "Wrap calls in "}]
    assert stream.push("<tool_call>") == [] and stream.push(" ") == []
    assert stream.push("tags, then") == [{"content": "<tool_call> tags, then"}]
    assert stream.push(" <tool_call>{") == [{"content": " <tool_call>{"}]
    assert stream.finish() == [] and not stream.called


def test_the_required_call_grammar_takes_the_templates_calls(
    qwen_template: Any, accepts: Any
) -> None:
    one = [("add", {"a": 2, "b": 3})]
    two = [*one, ("say", {"text": "hi"})]
    required = parse_tools({"tools": TOOLS, "tool_choice": "required"}, "hermes")
    single = parse_tools(
        {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}, "hermes"
    )
    named = parse_tools(
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "say"}}},
        "hermes",
    )
    assert required is not None and single is not None and named is not None
    assert accepts(required, assistant_text(qwen_template, "", one))
    assert accepts(required, assistant_text(qwen_template, "", two))
    assert accepts(single, assistant_text(qwen_template, "", one))
    assert not accepts(single, assistant_text(qwen_template, "", two))
    assert not accepts(named, assistant_text(qwen_template, "", one))
    assert accepts(named, assistant_text(qwen_template, "", [("say", {"text": "hi"})]))
    # a named choice is one call of it, as vLLM's
    assert not accepts(named, assistant_text(qwen_template, "", [("say", {"text": "hi"})] * 2))
    # off the parameters' schema: a string too long, a missing argument
    assert not accepts(required, assistant_text(qwen_template, "", [("say", {"text": "x" * 7})]))
    assert not accepts(required, assistant_text(qwen_template, "", [("add", {"a": 2})]))


def _required(parser: Any, *parameters: dict[str, Any]) -> Any:
    functions = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": p}}
        for i, p in enumerate(parameters)
    ]
    return parse_tools({"tools": functions, "tool_choice": "required"}, parser)


def _call_text(parser: str, arguments: str) -> str:
    if parser == "hermes":
        return '<tool_call>\n{"name": "f0", "arguments": ' + arguments + "}\n</tool_call>"
    return '{"name":"f0","parameters":' + arguments + "}"


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_a_required_call_always_parses(accepts: Any, parser: str) -> None:
    """Arguments are an object even when the schema does not say so (5 or null would be no
    call), and a schema's $defs still resolve (pydantic writes them)."""
    untyped = _required(parser, {"properties": {"p": {"type": "integer"}}})
    compact = parser == "llama3_json"
    assert accepts(untyped, _call_text(parser, '{"p":1}' if compact else '{"p": 1}'))
    for arguments in ["5", "null", '"x"', "[1]"]:
        text = _call_text(parser, arguments)
        assert not accepts(untyped, text) and parse_answer(parser, text, ["f0"]) is None
    refs = {
        "type": "object",
        "$defs": {"P": {"type": "integer"}},
        "properties": {"p": {"$ref": "#/$defs/P"}},
        "required": ["p"],
    }
    with_refs = _required(parser, refs, refs)  # (the same definition twice is one)
    assert accepts(with_refs, _call_text(parser, '{"p":3}' if compact else '{"p": 3}'))
    assert not accepts(with_refs, _call_text(parser, '{"p":"x"}' if compact else '{"p": "x"}'))
    clash = {**refs, "$defs": {"P": {"type": "string"}}}
    with pytest.raises(ServerError, match="two functions define \\$defs 'P' differently"):
        _required(parser, refs, clash).grammar()
    with pytest.raises(ServerError, match="f0's \\$defs must be an object"):
        _required(parser, {**refs, "$defs": [1]}).grammar()


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_a_call_schemas_root_refs_point_into_its_own_parameters(accepts: Any, parser: str) -> None:
    """A `$ref` to the parameters' root ("#", "#/properties/...") means the parameter schema,
    not the call object the grammar wraps it in: a recursive schema recurses into arguments,
    never into another {"name", "arguments"} object, and a pointer into it compiles."""
    compact = parser == "llama3_json"
    tree = {"type": "object", "properties": {"c": {"$ref": "#"}}, "additionalProperties": False}
    for required in (_required(parser, tree), _required(parser, tree, {"type": "object"})):
        nested = '{"c":{"c":{}}}' if compact else '{"c": {"c": {}}}'
        assert accepts(required, _call_text(parser, nested))
        key = "parameters" if compact else "arguments"
        wrapped = '{"c":{"name":"f0","' + key + '":{}}}'
        if not compact:
            wrapped = '{"c": {"name": "f0", "' + key + '": {}}}'
        assert not accepts(required, _call_text(parser, wrapped))
    pointer = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}},
        "required": ["a", "b"],
    }
    pair = '{"a":1,"b":2}' if compact else '{"a": 1, "b": 2}'
    assert accepts(_required(parser, pointer), _call_text(parser, pair))
    assert not accepts(_required(parser, pointer), _call_text(parser, pair.replace("2", '"x"')))


def test_a_responses_message_before_calls_has_its_texts_logprobs() -> None:
    """A message's entries go with the text that completes their token's own text (a token
    of no text, the first part of a split character, with the next; a skipped special token
    with the text before it): before calls, the message's text, and so its entries, end
    before the calls' tokens."""
    from sv_engine import TokenLogprob
    from sv_server.logprobs import ScoredTokens

    # (token id, its own characters): "Sur", é's first byte, "é.\n", "<tool_call>"
    tokens = [(1, 3), (2, 0), (3, 3), (4, 11)]
    shown = {1: b"Sur", 2: b"\xc3", 3: b"\xa9.\n", 4: b"<tool_call>", 5: b"<|im_end|>"}

    class Shown:  # the tokenizer: the tokens' bytes (byte-level: no <0xXX> tokens)
        byte_fallback_ids: frozenset[int] = frozenset()

        def shown_bytes(self, token_id: int) -> bytes:
            return shown[token_id]

    def message(scored: list[tuple[int, int]] = tokens) -> Any:
        taken = ScoredTokens(Shown())  # type: ignore[arg-type]
        taken.extend((t, TokenLogprob(t, -1.0, ()), chars) for t, chars in scored)
        return lambda shown=None: [t for t, _, _ in taken.take(shown)]

    assert message()(len("Suré.\n")) == [1, 2, 3]
    assert message()(3) == [1] and message()(0) == []
    streamed = message()
    assert [streamed(n) for n in (2, 3, 4, 6)] == [[], [1], [], [2, 3]]
    assert streamed() == [4]
    assert message([(1, 3), (5, 0), (3, 3)])(3) == [1, 5]  # (no piece of a character)


def test_the_parser_comes_from_the_tokenizer(qwen3_tokenizer_dir: Path) -> None:
    from sv_tokenizer.cli import installed_llama_tokenizer_dir

    assert default_parser(Tokenizer.from_model_dir(qwen3_tokenizer_dir)) == "hermes"
    llama = installed_llama_tokenizer_dir()
    if llama is not None:
        assert default_parser(Tokenizer.from_model_dir(llama)) == "llama3_json"


# --- end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_server(tiny_qwen3_dir: Path) -> Iterator[Any]:
    from server_test_support import RunningServer

    server = RunningServer(tiny_qwen3_dir, kv_cache_mib=64)
    yield server
    server.stop()


def _checked_calls(calls: list[Any]) -> list[tuple[str, Any]]:
    """Each call's name and decoded arguments, checked against its function's schema."""
    out = []
    for call in calls:
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        out.append((call.function.name, arguments))
    return out


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_end_to_end(qwen_server: Any, parallel: bool) -> None:
    client = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="none", max_retries=0)
    request: dict[str, Any] = {
        "model": qwen_server.model_name,
        "messages": [QUESTION],
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": parallel,
        "max_tokens": 120,
        "temperature": 1.0,
        "seed": 3,
        # (the random model, left alone, keeps writing digits and strings: end the calls)
        "logit_bias": {"151658": 8, "151645": 6},
    }
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls
    calls = _checked_calls(choice.message.tool_calls)
    if not parallel:
        assert len(calls) == 1
    streamed: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for part in chunk.choices[0].delta.tool_calls or []:
            entry = streamed.setdefault(part.index, {"name": "", "arguments": ""})
            entry["name"] += (part.function and part.function.name) or ""
            entry["arguments"] += (part.function and part.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(streamed.items())] == calls
    # the second round: the calls and their results go back through Qwen3's template
    answered = client.chat.completions.create(
        model=qwen_server.model_name,
        messages=[
            QUESTION,
            choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
            *[
                {"role": "tool", "tool_call_id": call.id, "content": "5"}
                for call in choice.message.tool_calls
            ],
        ],
        tools=TOOLS,
        max_tokens=4,
        temperature=0,
    )
    assert answered.choices[0].finish_reason == "length"  # rendered and answered
    # /v1/responses: the same answer as function_call items
    response = client.responses.create(
        model=qwen_server.model_name,
        input=[QUESTION],  # type: ignore[list-item]
        tools=[
            {"type": "function", "name": name, "parameters": schema, "strict": False}
            for name, schema in SCHEMAS.items()
        ],
        tool_choice="required",
        parallel_tool_calls=parallel,
        max_output_tokens=120,
        temperature=1.0,
        extra_body={"seed": 3, "logit_bias": request["logit_bias"]},
    )
    items = [item for item in response.output if item.type == "function_call"]
    assert [(i.name, json.loads(i.arguments)) for i in items] == calls


def test_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from sv_server.cli import parse_args

    assert parse_args(["--tool-call-parser", "hermes"]).tool_call_parser == "hermes"
    assert parse_args([]).tool_call_parser is None  # chosen from the tokenizer at start-up
    with pytest.raises(SystemExit):
        parse_args(["--tool-call-parser", "xml"])
    err = capsys.readouterr().err
    assert "--tool-call-parser" in err and "llama3_json" in err and "hermes" in err, err
