"""sv_tokenizer: byte-level BPE for Llama 3 (tiktoken tokenizer.model or HF tokenizer.json) and
SmolLM2 (tokenizer.json), with incremental decoding and the models' chat formats.

Needs only `regex`; jinja2 (the `chat-template` extra) only to render a folder's chat template.
"""

from .chat import ChatFormat, ChatMLFormat, ChatTokenizer, Llama3ChatFormat
from .chat_choice import choose_chat_format
from .chat_template import TemplateChatFormat, TemplateTokenizer
from .errors import TokenizerError
from .messages import Message, ToolCall, Tools
from .sentencepiece_bpe import LeadingSpace
from .stream import StreamDecoder
from .tokenizer import Tokenizer, check_utf8

__all__ = [
    "ChatFormat",
    "ChatMLFormat",
    "ChatTokenizer",
    "LeadingSpace",
    "Llama3ChatFormat",
    "Message",
    "StreamDecoder",
    "TemplateChatFormat",
    "TemplateTokenizer",
    "Tokenizer",
    "TokenizerError",
    "ToolCall",
    "Tools",
    "check_utf8",
    "choose_chat_format",
]
