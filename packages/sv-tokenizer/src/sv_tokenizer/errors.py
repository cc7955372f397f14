"""The one exception type of sv-tokenizer."""


class TokenizerError(Exception):
    """Any bad input met while loading or using a tokenizer.

    The message names the file and the line, JSON field or entry that was wrong (or the token
    id / chat message at fault), so a user can fix the input without reading a traceback.
    `argument`: for a chat format's `encode_dialog`, which of its inputs was at fault
    ("messages", "tools", "chat_template_kwargs", or "chat_template" when a template the
    request brought cannot compile or its own code fails; the model's own template failing on
    a conversation is "messages"), so that a server can name the request's field.
    """

    def __init__(self, message: str, *, argument: str = "messages") -> None:
        super().__init__(message)
        self.argument = argument
