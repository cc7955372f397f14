"""Checks of one field of a request body, each raising a 400 that names the field and shows
the value given, cut short (a body may be megabytes)."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

from sv_server.errors import bad_request

_SHOWN = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 2, 4, 4
_SHOWN.maxstring = _SHOWN.maxlong = _SHOWN.maxother = 40


def shown_value(value: Any) -> str:
    """A value as an error message shows it: cut short (a body may be megabytes)."""
    return _SHOWN.repr(value)


def is_int(value: Any) -> bool:
    """An integer, and not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float, and not a bool."""
    return (isinstance(value, int | float) and not isinstance(value, bool)) and math.isfinite(value)


def checked_field(
    body: Mapping[str, Any],
    key: str,
    check: Callable[[Any], bool],
    what: str,
    within: str | None = None,
) -> Any:
    """`body[key]`, None when absent or null; a 400 saying it must be `what` when `check`
    refuses it. `within`: the request field `body` is nested in (`stream_options`), which the
    400 names as its param, the message naming `within.key`."""
    value = body.get(key)
    if value is not None and not check(value):
        name, param = (key, key) if within is None else (f"{within}.{key}", within)
        raise bad_request(f"'{name}' must be {what}, got {shown_value(value)}", param=param)
    return value


def optional_int(body: Mapping[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    """An integer field in [lo, hi] (no upper bound when hi is None), or None."""
    value = checked_field(body, key, is_int, "an integer")
    if value is not None and (value < lo or (hi is not None and value > hi)):
        bounds = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_request(f"'{key}' must be {bounds}, got {shown_value(value)}", param=key)
    return value  # type: ignore[no-any-return]


def optional_str(body: Mapping[str, Any], key: str) -> str | None:
    """A string field, or None."""
    return checked_field(body, key, lambda v: isinstance(v, str), "a string")  # type: ignore[no-any-return]


def optional_bool(body: Mapping[str, Any], key: str, within: str | None = None) -> bool | None:
    """A true/false field, or None (`within`: as `checked_field`'s)."""
    return checked_field(body, key, lambda v: isinstance(v, bool), "true or false", within)  # type: ignore[no-any-return]


def bool_field(
    body: Mapping[str, Any], key: str, default: bool = False, within: str | None = None
) -> bool:
    """A true/false field; `default` when absent or null (`within`: as `checked_field`'s)."""
    value = optional_bool(body, key, within)
    return default if value is None else value
