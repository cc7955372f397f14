"""The one exception type of sv-trace."""


class TraceError(Exception):
    """A trace file that cannot be read or written (the message names the file and line)."""
