"""Helpers shared by the server's test modules (conftest.py puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

import httpx


def openai_error(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """The OpenAI error body of a refusal (with `status`, if given), checked for its shape."""
    if status is not None:
        assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error  # type: ignore[no-any-return]
