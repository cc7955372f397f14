"""The one exception type of sv-engine."""


class EngineError(Exception):
    """Bad engine input or configuration: the message names what was wrong and what was expected."""
