"""Which chat format a tokenizer gets: the model folder's own template when it has one, else the
format its special tokens name (Llama 3's headers or ChatML's turns), else none."""

from __future__ import annotations

from collections.abc import Mapping

from .chat import ChatFormat, ChatMLFormat, Llama3ChatFormat
from .chat_template import TemplateChatFormat, TemplateTokenizer


def choose_chat_format(
    tokenizer: TemplateTokenizer,
    chat_template: str | None = None,
    *,
    template_tokens: Mapping[str, str] | None = None,
    source: str | None = None,
) -> ChatFormat | None:
    """The chat format for `tokenizer`. `chat_template` (from tokenizer_config.json or
    chat_template.jinja, named by `source`) wins, rendered with `template_tokens`
    (`bos_token`, `eos_token`, …)."""
    if chat_template is not None:
        return TemplateChatFormat(
            tokenizer, chat_template, template_tokens=template_tokens, source=source
        )
    if "<|start_header_id|>" in tokenizer.special_tokens:
        return Llama3ChatFormat(tokenizer)
    if "<|im_start|>" in tokenizer.special_tokens:
        return ChatMLFormat(tokenizer)
    return None
