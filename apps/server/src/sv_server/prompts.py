"""Prompt preparation: a generation request's body, on a tokenizer thread, turned into what
the engine takes: each prompt's token ids (a text encoded, a conversation in the model's chat
format, truncated if asked), checked against the context and the KV pool, and each prompt's
sampling parameters with the output budget that fits.

Refusals are 400s naming the field at fault (404 for another model's name), raised before
anything reaches the engine. A raw text too long for the context is refused before it is
tokenized (`_refuse_text_that_cannot_fit`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sv_engine import EngineError, SamplingParams
from sv_scheduler import max_new_tokens_that_fit
from sv_tokenizer import ChatFormat, Message, StreamDecoder, TokenizerError, Tools

from sv_server.body import decode_json
from sv_server.chat_messages import ChatOptions
from sv_server.errors import ServerError, bad_request
from sv_server.logprobs import ScoredTokens
from sv_server.reasoning import ReasoningParser
from sv_server.request_parsing import DEFAULT_COMPLETION_MAX_TOKENS, GenerationRequest
from sv_server.state import ServerState

# parse_completion_request or parse_chat_request (request_parsing.py): JSON -> a checked request
Parser = Callable[[Any], GenerationRequest]


def prepare(
    state: ServerState, raw: bytes, parse: Parser
) -> tuple[GenerationRequest, list[list[int]], list[list[int]]]:
    """The CPU-heavy part of a request, for a tokenizer thread: the body as a checked
    request, the token ids of each of its prompts (a chat has one), truncated if asked, and of
    each the tail a reasoning parser reads (`_answer_turn`; a completion's: all of it, unread)."""
    body = decode_json(raw)
    req = parse(body)
    check_model(state, req.model)
    keep = _kept_prompt_tokens(state, req)
    if req.messages is not None:  # chat: the model's chat format
        tools = req.tools.tools if req.tools is not None else None
        ids = encode_chat(state, req.messages, req.chat_options, tools)
        turn = _answer_turn(state, req.messages, req.chat_options, tools, ids)
        # (the turn is a tail of the prompt: truncation keeps the end of both)
        return req, [_last(ids, keep)], [_last(turn, keep)]
    prompts = req.prompts or []
    encoded = [_prompt_ids(state, p, _which(i, len(prompts)), keep) for i, p in enumerate(prompts)]
    return req, encoded, encoded


def _kept_prompt_tokens(state: ServerState, req: GenerationRequest) -> int | None:
    """How many of each prompt's last tokens the request keeps: vLLM's truncate_prompt_tokens
    (-1: the context); None: all (a prompt longer than the context is refused later)."""
    keep = req.truncate_prompt_tokens
    if keep is None:
        return None
    if keep > state.max_model_len:
        raise bad_request(
            f"'truncate_prompt_tokens' is {keep} but the context is {state.max_model_len} tokens",
            "truncate_prompt_tokens",
        )
    return state.max_model_len if keep == -1 else keep


def _answer_turn(
    state: ServerState,
    messages: list[Message],
    options: ChatOptions | None,
    tools: Tools | None,
    ids: list[int],
) -> list[int]:
    """The tail of a chat prompt that is the answer's own turn: the generation prompt, and
    the message it continues. A reasoning parser reads the think tags there only: those of
    earlier turns (an assistant's thinking kept in the history, before a tool's result; a
    user who quotes `</think>`) say nothing of this answer. It is what the prompt adds to the
    render of the history alone; the whole prompt where that render is not a prefix of it."""
    options = options or ChatOptions()
    history = messages[:-1] if options.continue_final_message else messages
    if state.reasoning is None or not history:
        return ids
    try:
        before = _chat_format(state, options).encode_dialog(
            history,
            add_generation_prompt=False,
            tools=tools,
            chat_template_kwargs=options.chat_template_kwargs,
        )
    except TokenizerError:  # a template that refuses the history alone (no answer to give)
        return ids
    return ids[len(before) :] if ids[: len(before)] == before else ids


def encode_chat(
    state: ServerState,
    messages: list[Message],
    options: ChatOptions | None,
    tools: Tools | None = None,
) -> list[int]:
    """A conversation's ids in the model's chat format; its refusals are 400s naming the
    field at fault."""
    options = options or ChatOptions()
    try:
        return _chat_format(state, options).encode_dialog(
            messages,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            tools=tools,
            chat_template_kwargs=options.chat_template_kwargs,
        )
    except TokenizerError as e:
        raise bad_request(client_message(state, e), param=e.argument) from e


def _chat_format(state: ServerState, options: ChatOptions) -> ChatFormat:
    """The model's chat format, or the request's own template where the server trusts it."""
    if options.chat_template is None:
        return state.tokenizer.chat_format
    if not state.trust_request_chat_template:
        raise bad_request(
            "'chat_template' is refused: this server renders only its own chat template (start "
            "it with --trust-request-chat-template to take a request's)",
            param="chat_template",
        )
    return state.tokenizer.template_chat_format(
        options.chat_template, "the request's chat_template"
    )


def _last(ids: list[int], keep: int | None) -> list[int]:
    """The last `keep` ids (vLLM's left truncation: the end of a prompt is what the answer
    continues); all of them when None."""
    return ids if keep is None else ids[-keep:]


def _which(index: int, count: int) -> str:
    """How a message names a prompt: 'the prompt', or 'prompt[i]' in a list of several."""
    return "the prompt" if count == 1 else f"prompt[{index}]"


def _prompt_ids(
    state: ServerState, prompt: str | list[int], which: str, keep: int | None = None
) -> list[int]:
    """A completions prompt's ids, its last `keep` if given (a text too long for the context
    is refused before it is tokenized, unless it is to be truncated). A text's BOS stays
    first, within `keep`, as vLLM's truncating tokenizer call keeps it."""
    if isinstance(prompt, str):  # raw text; BOS only if the tokenizer adds one
        bos = state.tokenizer.bos_id
        bos_ids = [bos] if _server_bos(state, prompt) and bos is not None else []
        if keep is None:
            _refuse_text_that_cannot_fit(state, prompt, len(bos_ids), which)
            return bos_ids + state.tokenizer.encode(prompt)
        text_ids = state.tokenizer.encode(prompt)
        kept = max(keep - len(bos_ids), 0)
        return bos_ids + (text_ids[-kept:] if kept else [])
    bad = next((t for t in prompt if not 0 <= t < state.vocab_size), None)
    if bad is not None:
        raise bad_request(
            f"{which}: token id {bad} is outside the vocabulary (0..{state.vocab_size - 1})",
            "prompt",
        )
    return _last(prompt, keep)


def _refuse_text_that_cannot_fit(
    state: ServerState, text: str, extra_tokens: int, which: str
) -> None:
    """A cheap, exact refusal before tokenizing: each token stands for at most
    `longest_token_bytes` bytes of the text, so a text of B bytes has at least
    ceil(B / longest) tokens. (Only for raw text: a chat template may change the contents.)"""
    size = len(text.encode("utf-8"))
    at_least = extra_tokens - (-size // state.longest_token_bytes)
    if at_least >= state.max_model_len:
        raise bad_request(
            f"{which} has at least {at_least} tokens ({size} bytes, at most "
            f"{state.longest_token_bytes} bytes per token) but the context is "
            f"{state.max_model_len} tokens, leaving no room for an output token",
            param="prompt",
            code="context_length_exceeded",
        )


def _max_tokens(state: ServerState, req: GenerationRequest, prompt_tokens: int, which: str) -> int:
    room = state.max_model_len - prompt_tokens
    if room < 1:
        raise bad_request(
            f"{which} has {prompt_tokens} tokens but the context is {state.max_model_len} "
            "tokens, leaving no room for an output token",
            param=_prompt_field(req),
            code="context_length_exceeded",
        )
    config = state.scheduler_config
    fit = max_new_tokens_that_fit(prompt_tokens, config)
    if fit < 1:  # the prompt alone is more than the KV pool could ever hold
        raise bad_request(
            f"{which} has {prompt_tokens} tokens but the KV cache holds "
            f"{config.num_pages * config.page_size} tokens in all; start the server with a "
            "larger --kv-cache-mib",
            param=_prompt_field(req),
            code="context_length_exceeded",
        )
    if req.echo_only:
        return 1  # (the one token the engine generates, and the answer drops)
    if req.max_tokens is None:
        # Without max_tokens: up to the context, as far as the KV pool could ever hold (a
        # budget over the pool would be refused, though the client asked for no number).
        default = DEFAULT_COMPLETION_MAX_TOKENS if req.kind == "completion" else room
        return min(default, room, fit)
    budget = "max_output_tokens" if req.kind == "responses" else "max_tokens"
    if req.max_tokens > room:
        raise bad_request(
            f"{budget} is {req.max_tokens} but {which} has {prompt_tokens} tokens and the "
            f"context is {state.max_model_len}: at most {room} new tokens fit",
            param=budget,
            code="context_length_exceeded",
        )
    if req.max_tokens > fit:
        raise bad_request(
            f"{budget} is {req.max_tokens} but after {which}'s {prompt_tokens} tokens the KV "
            f"cache ({config.num_pages} pages of {config.page_size} tokens) holds at most {fit} "
            "new tokens; ask for fewer, or start the server with a larger --kv-cache-mib",
            param=budget,
            code="context_length_exceeded",
        )
    return req.max_tokens


def _prompt_field(req: GenerationRequest) -> str:
    return {"completion": "prompt", "chat": "messages", "responses": "input"}[req.kind]


def sampling_params(
    state: ServerState,
    req: GenerationRequest,
    prompts: list[list[int]],
    turns: list[list[int]],
    thinking: ReasoningParser | None,
) -> list[SamplingParams]:
    """Each prompt's sampling parameters (`prompts`: their ids, from `prepare`): the request's,
    with its output budget (`max_tokens`, or its default, checked against the context and the
    KV pool) and, under a reasoning parser (`thinking`), where the output constraint starts
    (`turns`: the tails `prepare` returned). The logit controls' token ids are checked first."""
    _check_token_ids(state, req)
    try:
        params = [
            SamplingParams(
                max_new_tokens=max_new,
                temperature=req.temperature,
                top_k=req.top_k,  # the engine clamps it to the vocabulary
                top_p=req.top_p,
                seed=req.seed,
                ignore_eos=req.ignore_eos,
                stop_token_ids=req.stop_token_ids,
                n=req.n,
                logprobs=req.logprobs,
                prompt_logprobs=_prompt_scores(req),
                allowed_token_ids=req.allowed_token_ids,
                bad_words=req.bad_words,
                logit_bias=req.logit_bias,
                min_tokens=_min_tokens(req, 0 if req.echo_only else max_new),
                repetition_penalty=req.repetition_penalty,
                frequency_penalty=req.frequency_penalty,
                presence_penalty=req.presence_penalty,
                min_p=req.min_p,
                skip_special_tokens=req.skip_special_tokens,
                grammar=req.grammar,
                grammar_after_token=after,
                grammar_wait_opener=opener,
            )
            for i, (ids, turn) in enumerate(zip(prompts, turns, strict=True))
            for max_new in [_max_tokens(state, req, len(ids), _which(i, len(prompts)))]
            for after, opener in [_grammar_wait(thinking, req, turn)]
        ]
        if req.echo_only:
            params = [_one_dropped_token(p) for p in params]
    except EngineError as e:  # request_parsing.py checked every field already: a safety net
        raise bad_request(str(e)) from e
    return params


def _prompt_scores(req: GenerationRequest) -> int | None:
    """The alternatives per prompt token the engine scores: for echo's logprobs and for
    vLLM's prompt_logprobs, the more of the two (each answer shows its own K of them)."""
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    return max(asked, default=None)


def _one_dropped_token(params: SamplingParams) -> SamplingParams:
    """An echo without generation's: one token, which the answer drops, so nothing about it
    matters but that it always ends the request with "length" (no stop token, no grammar,
    no log-probabilities of its own), as the answer says."""
    return replace(
        params,
        ignore_eos=True,
        stop_token_ids=frozenset(),
        logprobs=None,
        grammar=None,
        grammar_after_token=None,
        grammar_wait_opener=None,
    )


def _grammar_wait(
    thinking: ReasoningParser | None, req: GenerationRequest, turn_ids: list[int]
) -> tuple[int | None, int | None]:
    """Where a chat answer's output constraint starts under a reasoning parser: after the
    thinking (see reasoning.py; `turn_ids`: the prompt's `_answer_turn`); (None, None): from
    the first token."""
    if thinking is None or req.grammar is None:
        return None, None
    return thinking.grammar_wait(turn_ids)


def _check_token_ids(state: ServerState, req: GenerationRequest) -> None:
    """The token ids of the logit controls are in the vocabulary (request_parsing.py checked the
    rest of them): else a 400 naming the field."""
    for name, ids in (
        ("allowed_token_ids", req.allowed_token_ids or ()),
        ("logit_bias", req.logit_bias),
    ):
        bad = next((t for t in ids if t >= state.vocab_size), None)
        if bad is not None:
            raise bad_request(
                f"'{name}': token id {bad} is outside the vocabulary (0..{state.vocab_size - 1})",
                name,
            )


def _min_tokens(req: GenerationRequest, max_new: int) -> int:
    if req.min_tokens > max_new:
        raise bad_request(
            f"'min_tokens' is {req.min_tokens} but at most {max_new} tokens are generated "
            "(max_tokens)",
            "min_tokens",
        )
    return req.min_tokens


def echo_text(state: ServerState, req: GenerationRequest, index: int, ids: list[int]) -> str:
    """With `echo`, the text of prompt `index` (of `ids`) as the answer repeats it: a text as
    sent, or what is left of it after truncation (without the BOS the server put first);
    token ids as they decode (an id of the model's past the tokenizer's, a padding row, shows
    no text, as a generated one)."""
    if not req.echo or req.prompts is None:
        return ""
    prompt = req.prompts[index]
    if isinstance(prompt, str) and req.truncate_prompt_tokens is None:
        return prompt
    tokenizer = state.tokenizer
    shown = ids[_server_bos(state, prompt) :]
    return tokenizer.decode([t for t in shown if tokenizer.shown_bytes(t)])


def _server_bos(state: ServerState, prompt: str | list[int]) -> int:
    """1 when the server put BOS before prompt `prompt` (a text, for a tokenizer that adds
    one), else 0: the ids' first that is no part of the echoed text."""
    return int(isinstance(prompt, str) and state.add_bos and state.tokenizer.bos_id is not None)


def echo_lengths(
    state: ServerState, req: GenerationRequest, index: int, ids: list[int], echo: str
) -> list[int]:
    """With echo and logprobs, the characters of `echo` (`echo_text`'s) each prompt token
    stands for (the text offsets of its tokens): none for the BOS the server put before a text
    (the echo is the text as sent), and the rest as decoding them gives them. A text the tokenizer
    normalized (Qwen's NFC: "e\u0301", 2 characters as sent, is "é" in its tokens) decodes
    to another length than the echo's: the last tokens take the difference, so that the
    answer's offsets, and the stream's logprobs, start where the echo ends."""
    if not req.echo or req.logprobs is None or req.prompts is None:
        return []
    bos = _server_bos(state, req.prompts[index])
    decoder = StreamDecoder(state.tokenizer)
    shown = state.tokenizer.shown_bytes
    decoded = [len(decoder.push(t)) if shown(t) else 0 for t in ids[bos:]]
    if decoded:
        decoded[-1] += len(decoder.flush())
    # (a character that never completes counted where it starts, as in the answer's text)
    scored = ScoredTokens(state.tokenizer)
    for token_id, chars in zip(ids[bos:], decoded, strict=True):
        scored.append((token_id, None, chars))
    lengths = [0] * bos + [chars for _, _, chars in scored.take()]
    extra = len(echo) - sum(lengths)
    for at in reversed(range(len(lengths))):
        if not extra:
            break
        change = max(extra, -lengths[at])  # (all of a surplus; a shortfall as far as it goes)
        lengths[at] += change
        extra -= change
    return lengths


def client_message(state: ServerState, error: TokenizerError) -> str:
    """The tokenizer's message without the model folder's path (it names the file, e.g.
    tokenizer.json): where the model lives on the server is nothing a client needs."""
    folder = os.path.dirname(state.tokenizer.source)
    return str(error).replace(folder + os.sep, "") if folder else str(error)


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise ServerError(
            f"the model '{model}' does not exist; this server serves '{state.model_name}'",
            status=404,
            param="model",
            code="model_not_found",
        )
