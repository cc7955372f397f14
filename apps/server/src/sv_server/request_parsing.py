"""Request parsing: a /v1/completions or /v1/chat/completions body, decoded (body.py), checked
field by field into the `GenerationRequest` the handlers take. The conversation and its
template options are chat_messages.py's; /tokenize and /detokenize, tokenize_parsing.py's.

Only what the engine can honour is accepted. A field the engine has no use for is refused with
a 400 naming it, unless it is set to the value that means "off" (e.g. `presence_penalty: 0`,
`logprobs: null`): a client never gets silently different behaviour from what it asked for.
The answers' bodies are response_bodies.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sv_engine import MAX_LOGPROBS
from sv_engine.grammar import Grammar
from sv_engine.params import MAX_BAD_WORDS, MAX_REPETITION_PENALTY
from sv_tokenizer import Message

from sv_server.chat_messages import (
    CHAT_OPTION_FIELDS,
    ChatOptions,
    parse_chat_options,
    parse_message,
)
from sv_server.errors import bad_request
from sv_server.fields import (
    bool_field,
    checked_field,
    is_int,
    is_number,
    optional_int,
    optional_str,
    shown_value,
)
from sv_server.request_ids import body_request_id
from sv_server.structured import STRUCTURED_FIELDS, parse_grammar
from sv_server.tool_parsers import ToolCallParser
from sv_server.tools import TOOL_FIELDS, ToolRequest, parse_tools

# OpenAI takes 4; vLLM has no limit, and clients written for it send more (lm-eval's code tasks
# send 9). The matcher's cost per token grows with the count: 64 keeps it small.
MAX_STOP_STRINGS = 64
MAX_PROMPTS = 256  # prompts in one /v1/completions request: each is an engine request
MAX_N = 128  # choices per prompt, as OpenAI; prompts x n is at most MAX_PROMPTS
MAX_STOP_TOKEN_IDS = 256  # vLLM's extra stop ids: a set test per token, but bounded
MAX_TEMPERATURE = 2.0  # as OpenAI
MAX_PENALTY = 2.0  # presence/frequency_penalty in [-2, 2], as OpenAI
MAX_BIAS = 100.0  # logit_bias values in [-100, 100], as OpenAI
MAX_LOGIT_BIAS = 1024  # entries: each one an index on the device per step, but bounded
SEED_RANGE = (-(2**63), 2**63 - 1)  # 64-bit, as vLLM and OpenAI take them
DEFAULT_COMPLETION_MAX_TOKENS = 16  # as OpenAI's /v1/completions

# Which endpoint a request came to: its answer's shapes follow (response_bodies.py; the
# Responses API's, responses_bodies.py). A "responses" request is a chat in all but its shapes.
Kind = Literal["completion", "chat", "responses"]


@dataclass(frozen=True)
class GenerationRequest:
    """One request for /v1/completions, /v1/chat/completions or /v1/responses, checked.

    prompts: completions: each prompt's raw text or token ids (not chat-formatted), `n`
             choices each; chat: None.
    messages: chat (and responses): the conversation; completions: None.
    max_tokens: None = the default (16 for completions, the rest of the context for chat); 0:
              completions with echo, the prompt alone (see `echo_only`).
    logprobs: None: off; K: each output token's log-probability and its top K alternatives
              (chat's `logprobs: true` + `top_logprobs`, completions' integer `logprobs`).
    prompt_logprobs: vLLM's: None: off; K: each prompt token's log-probability, rank and top
              K alternatives, beside the answer (not streamed).
    echo: completions: the prompt comes first in the text (and its tokens in the logprobs).
    continuous_usage: streamed, every chunk carries its choice's usage so far (vLLM's).
    truncate_prompt_tokens: None: off; N: each prompt keeps only its last N tokens (vLLM's
              left truncation); -1: the last max_model_len (the server's limit, applied there).
    """

    kind: Kind
    model: str | None
    prompts: list[str | list[int]] | None
    messages: list[Message] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: frozenset[int]
    include_stop_str_in_output: bool
    stream: bool
    include_usage: bool
    ignore_eos: bool
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats
    truncate_prompt_tokens: int | None = None  # vLLM's
    allowed_token_ids: frozenset[int] | None = None  # vLLM's; ids not yet checked
    bad_words: tuple[str, ...] = ()  # vLLM's; the engine tokenizes them
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # vLLM's
    request_id: str | None = None  # vLLM's: the answer's id, unless X-Request-Id gives one
    echo: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's
    min_p: float = 0.0  # vLLM's
    min_tokens: int = 0  # vLLM's
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # ids not yet checked
    skip_special_tokens: bool = True  # vLLM's
    n: int = 1
    grammar: Grammar | None = None  # response_format / guided_*: see structured.py
    tools: ToolRequest | None = None  # chat: tools and tool_choice, see tools.py
    chat_options: ChatOptions | None = None  # chat: how the template renders the messages
    # responses: the request's settings its answer repeats (instructions, tools, text, ...)
    settings: Mapping[str, Any] | None = None

    @property
    def continues_text(self) -> bool:
        """Whether the answer goes on with text the prompt ends in (a completion's prompt, a
        chat's continued final message) rather than start a message: a SentencePiece
        tokenizer then keeps its first token's leading space, as decoding both together does."""
        options = self.chat_options
        return self.kind == "completion" or (options is not None and options.continue_final_message)

    @property
    def echo_only(self) -> bool:
        """Completions' `echo` with `max_tokens: 0`: the prompt (scored, with logprobs) and no
        new token. As vLLM does, the engine generates one, which the answer leaves out."""
        return self.max_tokens == 0


# Fields a request may carry only with their "off" value: the engine does not implement them.
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
    # OpenAI's chat fields for what this server has not: nothing is stored for later
    # retrieval (and OpenAI takes `metadata` only to store), there is one service tier, and
    # the model neither reasons nor speaks.
    "store": (None, False),
    "metadata": (None,),
    "service_tier": (None, "auto", "default"),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
    # OpenAI's deprecated forerunners of tools and tool_choice: older clients send them null.
    "functions": (None,),
    "function_call": (None,),
}
# OpenAI's tags for the operator, as `user` (which they replace): nothing to honour, accepted.
_TAG_FIELDS = ("user", "safety_identifier", "prompt_cache_key")
_SAMPLING_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "n",
        "stream",
        "stream_options",
        "ignore_eos",
        "stop_token_ids",  # vLLM's
        "include_stop_str_in_output",  # vLLM's
        "logprobs",
        "prompt_logprobs",  # vLLM's
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "repetition_penalty",  # vLLM's
        "min_p",  # vLLM's
        "min_tokens",  # vLLM's
        "skip_special_tokens",  # vLLM's
        "truncate_prompt_tokens",  # vLLM's
        "allowed_token_ids",  # vLLM's
        "bad_words",  # vLLM's
        "user",  # an end-user tag for the operator: nothing to honour, accepted and unused
        *STRUCTURED_FIELDS,
    }
)
_COMPLETION_FIELDS = _SAMPLING_FIELDS | {"prompt", "echo", "request_id"}
_CHAT_FIELDS = (
    _SAMPLING_FIELDS
    | {"request_id"}  # vLLM's: names the answer (request_ids.py)
    | {"messages", "max_completion_tokens", "top_logprobs", "safety_identifier", "prompt_cache_key"}
    | TOOL_FIELDS
    | CHAT_OPTION_FIELDS
)
_NOT_FOR_CHAT = frozenset({"best_of", "suffix"})
_NOT_FOR_COMPLETIONS = frozenset(_OFF_VALUES) - _NOT_FOR_CHAT


def _is_off(value: Any, off_values: tuple[Any, ...]) -> bool:
    # 0 means off for a penalty, but True is not 1 here: compare bool-ness too.
    return value is None or any(
        value == v and isinstance(value, bool) == isinstance(v, bool) for v in off_values
    )


def _check_fields(body: Mapping[str, Any], kind: Kind) -> None:
    allowed = _COMPLETION_FIELDS if kind == "completion" else _CHAT_FIELDS
    excluded = _NOT_FOR_COMPLETIONS if kind == "completion" else _NOT_FOR_CHAT
    for key, value in body.items():
        if key in allowed:
            continue
        if key not in _OFF_VALUES or key in excluded:
            raise bad_request(f"unknown field {shown_value(key)}", param=key)
        if not _is_off(value, _OFF_VALUES[key]):
            raise bad_request(
                f"'{key}' is not supported by this server (got {shown_value(value)})", param=key
            )


def _stops(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request(
            f"'stop' must be a string or a list of strings, got {shown_value(stop)}", "stop"
        )
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' takes at most {MAX_STOP_STRINGS} strings", "stop")
    if any(not s for s in stops):
        raise bad_request("'stop' strings must not be empty", "stop")
    return tuple(dict.fromkeys(stops))


def _stop_token_ids(body: Mapping[str, Any]) -> frozenset[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return frozenset()
    if not isinstance(ids, list) or not all(is_int(t) and t >= 0 for t in ids):
        raise bad_request(
            f"'stop_token_ids' must be a list of token ids, got {shown_value(ids)}",
            "stop_token_ids",
        )
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise bad_request(
            f"'stop_token_ids' takes at most {MAX_STOP_TOKEN_IDS} ids", "stop_token_ids"
        )
    return frozenset(ids)


def _logprobs(body: Mapping[str, Any], kind: Kind) -> int | None:
    """How many alternatives per output token (None: no log-probabilities). Chat asks with
    `logprobs: true` and `top_logprobs: K`; completions with `logprobs: K` (false: off)."""
    if kind == "chat":
        on = bool_field(body, "logprobs")
        top = optional_int(body, "top_logprobs", 0, MAX_LOGPROBS)
        if top and not on:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return (top or 0) if on else None
    if body.get("logprobs") is False:
        return None
    return optional_int(body, "logprobs", 0, MAX_LOGPROBS)


def _prompt_logprobs(body: Mapping[str, Any], stream: bool) -> int | None:
    """vLLM's: how many alternatives per prompt token (None: no prompt log-probabilities).
    -1, vLLM's whole vocabulary, is past this server's 20 (as past vLLM's default
    --max-logprobs 20); and streamed chunks have no place for them, as vLLM's have none."""
    value = checked_field(body, "prompt_logprobs", is_int, "an integer")
    if value is None:
        return None
    if value == -1:
        raise bad_request(
            f"'prompt_logprobs' -1 (the whole vocabulary) is not available: this server gives "
            f"at most {MAX_LOGPROBS} alternatives per token, as vLLM's default --max-logprobs",
            "prompt_logprobs",
        )
    if not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(
            f"'prompt_logprobs' must be between 0 and {MAX_LOGPROBS}, got {shown_value(value)}",
            "prompt_logprobs",
        )
    if stream:
        raise bad_request(
            "'prompt_logprobs' are not available with 'stream': true (as in vLLM: a streamed "
            "answer has no place for them); ask without streaming",
            "prompt_logprobs",
        )
    return value  # type: ignore[no-any-return]


def _number_in(body: Mapping[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    value = checked_field(body, key, is_number, "a number")
    if value is None:
        return default
    if not lo <= value <= hi:
        raise bad_request(f"'{key}' must be between {lo} and {hi}, got {value}", key)
    return float(value)


def _logit_bias(body: Mapping[str, Any]) -> dict[int, float]:
    """OpenAI's {token id (a string): bias}; the ids are checked against the vocabulary later."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise bad_request(f"'logit_bias' must be an object, got {shown_value(bias)}", "logit_bias")
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
    out = {}
    for key, value in bias.items():
        # Past 18 digits no id is in a vocabulary (and past 4,300 int() refuses the text).
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18):
            raise bad_request(
                f"'logit_bias' keys must be token ids, got {shown_value(key)}", "logit_bias"
            )
        if not (is_number(value) and -MAX_BIAS <= value <= MAX_BIAS):
            raise bad_request(
                f"'logit_bias' values must be numbers in [-{MAX_BIAS:g}, {MAX_BIAS:g}], "
                f"got {shown_value(value)} for token {key}",
                "logit_bias",
            )
        out[int(key)] = float(value)
    return out


def _allowed_token_ids(body: Mapping[str, Any]) -> frozenset[int] | None:
    """vLLM's: the only token ids to generate (null: any); checked against the vocabulary
    later. Empty is refused, as vLLM refuses it: nothing could be generated."""
    ids = body.get("allowed_token_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(is_int(t) and t >= 0 for t in ids):
        raise bad_request(
            f"'allowed_token_ids' must be a non-empty list of token ids, got {shown_value(ids)}",
            "allowed_token_ids",
        )
    return frozenset(ids)


def _bad_words(body: Mapping[str, Any]) -> tuple[str, ...]:
    """vLLM's: words never to generate (null: none), at most MAX_BAD_WORDS, none blank (it
    would encode to no tokens, which vLLM refuses too)."""
    words = body.get("bad_words")
    if words is None:
        return ()
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise bad_request(
            f"'bad_words' must be a list of strings, got {shown_value(words)}", "bad_words"
        )
    if len(words) > MAX_BAD_WORDS:
        raise bad_request(f"'bad_words' takes at most {MAX_BAD_WORDS} words", "bad_words")
    if any(not w.strip() for w in words):
        raise bad_request("'bad_words' strings must not be empty or blank", "bad_words")
    return tuple(words)


def _truncate_prompt_tokens(body: Mapping[str, Any]) -> int | None:
    """vLLM's: keep the last N prompt tokens, N >= 1, or -1 for the context (0 is refused, as
    vLLM refuses it: an empty prompt has nothing to continue)."""
    value = checked_field(body, "truncate_prompt_tokens", is_int, "an integer")
    if value is not None and value < 1 and value != -1:
        raise bad_request(
            f"'truncate_prompt_tokens' must be at least 1, or -1 (the context), got {value}",
            "truncate_prompt_tokens",
        )
    return value  # type: ignore[no-any-return]


def _repetition_penalty(body: Mapping[str, Any]) -> float:
    value = checked_field(body, "repetition_penalty", is_number, "a number")
    if value is None:
        return 1.0
    if not 1 / MAX_REPETITION_PENALTY <= value <= MAX_REPETITION_PENALTY:
        raise bad_request(
            f"'repetition_penalty' must be in [1e-30, 1e30] (> 0; 1 = off), got {value}",
            "repetition_penalty",
        )
    return float(value)


def parse_sampling(
    body: Mapping[str, Any],
    kind: Kind,
    prompts: list[str | list[int]] | None,
    messages: list[Message] | None,
    max_tokens: int | None,
) -> GenerationRequest:
    model = optional_str(body, "model")
    for tag in _TAG_FIELDS:
        optional_str(body, tag)
    n = optional_int(body, "n", 1, MAX_N) or 1
    if prompts is not None and len(prompts) * n > MAX_PROMPTS:
        raise bad_request(
            f"{len(prompts)} prompts x n={n} choices is {len(prompts) * n} generations; at "
            f"most {MAX_PROMPTS} fit in one request",
            param="n",
        )
    temperature = checked_field(body, "temperature", is_number, "a number")
    if temperature is not None and not 0 <= temperature <= MAX_TEMPERATURE:
        raise bad_request(
            f"'temperature' must be between 0 and {MAX_TEMPERATURE}, got {temperature}",
            "temperature",
        )
    top_p = checked_field(body, "top_p", is_number, "a number")
    if top_p is not None and not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    top_k = optional_int(body, "top_k", -1)  # -1 (as vLLM) or 0: off
    seed = optional_int(body, "seed", *SEED_RANGE)
    stream = bool_field(body, "stream")
    options = checked_field(body, "stream_options", lambda v: isinstance(v, dict), "an object")
    include_usage = continuous_usage = False
    if options is not None:
        if not stream:
            raise bad_request(
                "'stream_options' is only allowed with 'stream': true", "stream_options"
            )
        unknown = set(options) - {"include_usage", "include_obfuscation", "continuous_usage_stats"}
        if unknown:
            raise bad_request(
                f"unknown field 'stream_options.{sorted(unknown)[0]}'", "stream_options"
            )
        include_usage = bool_field(options, "include_usage", within="stream_options")
        continuous_usage = bool_field(options, "continuous_usage_stats", within="stream_options")
        # OpenAI pads its chunks with random `obfuscation` text unless this is false; these
        # chunks carry none, so false (or null) is what this server does.
        if bool_field(options, "include_obfuscation", within="stream_options"):
            raise bad_request(
                "'stream_options.include_obfuscation' is not supported by this server "
                "(its chunks carry no obfuscation padding): leave it out or set it false",
                "stream_options",
            )
    stop_token_ids = _stop_token_ids(body)
    include_stop = bool_field(body, "include_stop_str_in_output")
    if include_stop and stop_token_ids:
        raise bad_request(
            "'include_stop_str_in_output' applies to stop strings only here: a stop token's "
            "text is never shown, so it cannot be given with 'stop_token_ids'",
            "include_stop_str_in_output",
        )
    return GenerationRequest(
        kind=kind,
        model=model,
        prompts=prompts,
        messages=messages,
        max_tokens=max_tokens,
        temperature=float(temperature) if temperature is not None else 1.0,
        top_p=float(top_p) if top_p is not None else 1.0,
        top_k=max(top_k or 0, 0),
        seed=seed,
        stop=_stops(body),
        stop_token_ids=stop_token_ids,
        include_stop_str_in_output=include_stop,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        ignore_eos=bool_field(body, "ignore_eos"),
        n=n,
        logprobs=_logprobs(body, kind),
        prompt_logprobs=_prompt_logprobs(body, stream),
        request_id=body_request_id(body.get("request_id")),
        echo=bool_field(body, "echo"),
        presence_penalty=_number_in(body, "presence_penalty", -MAX_PENALTY, MAX_PENALTY, 0.0),
        frequency_penalty=_number_in(body, "frequency_penalty", -MAX_PENALTY, MAX_PENALTY, 0.0),
        repetition_penalty=_repetition_penalty(body),
        min_p=_number_in(body, "min_p", 0.0, 1.0, 0.0),
        min_tokens=optional_int(body, "min_tokens", 0) or 0,
        logit_bias=_logit_bias(body),
        skip_special_tokens=bool_field(body, "skip_special_tokens", default=True),
        truncate_prompt_tokens=_truncate_prompt_tokens(body),
        allowed_token_ids=_allowed_token_ids(body),
        bad_words=_bad_words(body),
        grammar=parse_grammar(body),
    )


# --- requests -------------------------------------------------------------------------------


def parse_completion_request(body: Any) -> GenerationRequest:
    """A /v1/completions body: `prompt` is a string, a list of token ids, or a list of either
    (OpenAI's batch form: one choice per prompt, at most MAX_PROMPTS)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_fields(body, "completion")
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("'prompt' is required", param="prompt")
    prompt = body["prompt"]
    batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str | list)
    items = prompt if batch else [prompt]
    if len(items) > MAX_PROMPTS:
        raise bad_request(
            f"'prompt' holds {len(items)} prompts; at most {MAX_PROMPTS} per request",
            param="prompt",
        )
    prompts = [_prompt(item, f"prompt[{i}]" if batch else "prompt") for i, item in enumerate(items)]
    req = parse_sampling(body, "completion", prompts, None, _completion_max_tokens(body))
    if body.get("best_of") is not None and req.n > 1:  # (its only value here is 1)
        raise bad_request(
            f"'best_of' must be at least 'n' ({req.n}), as OpenAI's: leave it out (this "
            "server returns every choice it generates, and ranks none)",
            param="best_of",
        )
    return req


def _completion_max_tokens(body: Mapping[str, Any]) -> int | None:
    """At least 1; or 0 with `echo` (vLLM's "echo without generation", which evaluation
    harnesses send to score a prompt: the answer is the prompt alone)."""
    value = checked_field(body, "max_tokens", is_int, "an integer")
    least = 0 if body.get("echo") is True else 1
    if value is not None and value < least:
        hint = "" if least == 0 else " (0 only with 'echo': true, to answer the prompt alone)"
        raise bad_request(f"'max_tokens' must be at least {least}{hint}, got {value}", "max_tokens")
    return value  # type: ignore[no-any-return]


def _prompt(item: Any, where: str) -> str | list[int]:
    if isinstance(item, str) and item:
        return item
    if isinstance(item, list) and item and all(is_int(t) for t in item):
        return list(item)
    raise bad_request(
        f"'{where}' must be a non-empty string or a non-empty list of token ids, "
        f"got {shown_value(item)}",
        param="prompt",
    )


def parse_chat_request(
    body: Any, tool_call_parser: ToolCallParser = "llama3_json"
) -> GenerationRequest:
    """A /v1/chat/completions body: `messages` is a list of {role, content, name?}; content is
    a string or a list of text parts ({"type": "text", "text": ...}). Tool calls are read (and
    a required one constrained) in `tool_call_parser`'s format."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_fields(body, "chat")
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    parsed = [parse_message(m, i) for i, m in enumerate(messages)]
    max_tokens = optional_int(body, "max_tokens", 1)
    max_completion = optional_int(body, "max_completion_tokens", 1)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise bad_request(
            "'max_tokens' and 'max_completion_tokens' disagree; give one", "max_completion_tokens"
        )
    req = parse_sampling(body, "chat", None, parsed, max_completion or max_tokens)
    tools = parse_tools(body, tool_call_parser)
    call_grammar = tools.grammar() if tools is not None else None
    if call_grammar is not None and req.grammar is not None:
        raise bad_request(
            "a required or named tool call is already constrained: drop the output constraint",
            param="tool_choice",
        )
    return replace(
        req,
        tools=tools,
        grammar=req.grammar or call_grammar,
        chat_options=parse_chat_options(body),
    )
