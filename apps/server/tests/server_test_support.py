"""Helpers shared by the server's test modules (conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


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


# An assistant turn that called `get_weather` for Lisbon (OpenAI's message shape), for tests
# that send a conversation with an earlier tool call.
WEATHER_CALL: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
        }
    ],
}


class RunningServer:
    """A create_app() server on a free port of 127.0.0.1, run as `sv serve` runs it
    (`build_server`: uvicorn with sv's limits and shutdown; preemptive admission) in a thread.
    `options` go to Engine.from_model_dir, build_server or create_app, by name."""

    def __init__(self, model_dir: Path, **options: Any) -> None:
        from sv_engine import Engine
        from sv_server import create_app
        from sv_server.body import DEFAULT_READ_TIMEOUT_S
        from sv_server.cli import wants_bos
        from sv_server.serving import build_server

        engine_options = {
            k: options.pop(k)
            for k in ("kv_cache_mib", "max_model_len", "admission", "speculation", "chat_template")
            if k in options
        }
        engine_options.setdefault("admission", "preemptive")  # as `sv serve`
        server_options = {k: options.pop(k) for k in ("max_connections", "drain_s") if k in options}
        self.model_dir = model_dir
        engine = Engine.from_model_dir(model_dir, device="cpu", **engine_options)
        self.model_name = "smollm2-test"
        self.app = create_app(
            engine,
            model_name=self.model_name,
            add_bos=wants_bos(model_dir, engine.tokenizer),
            **options,
        )
        self._server = build_server(
            self.app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            read_timeout_s=options.get("read_timeout_s", DEFAULT_READ_TIMEOUT_S),
            **server_options,
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)

    def requests_in_progress(self) -> int:
        """Requests whose headers have arrived and that have not been answered yet."""
        return len(self._server.server_state.tasks)

    def metrics(self) -> dict[str, float]:
        """/metrics parsed by Prometheus' own parser: sample name (with labels) -> value."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values

    def after_hang_up(self, before: dict[str, float]) -> tuple[float, float]:
        """Once idle again after a client hung up: checks that no page is held and nothing
        runs, and returns the requests cancelled and the tokens generated since `before` (a
        `wait_idle()` result)."""
        after = self.wait_idle(timeout=10)
        assert after["sv_kv_cache_pages_used"] == 0 and after["sv_requests_running"] == 0
        cancelled = 'sv_requests_finished_total{finish_reason="cancelled"}'
        generated = after["sv_generation_tokens_total"] - before["sv_generation_tokens_total"]
        return after[cancelled] - before[cancelled], generated

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Poll /metrics until nothing waits or runs and no page is held; returns the metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (
                m["sv_requests_running"] == 0
                and m["sv_requests_waiting"] == 0
                and m["sv_kv_cache_pages_used"] == 0
            )
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)
