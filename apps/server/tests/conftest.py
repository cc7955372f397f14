"""Fixtures: real servers on 127.0.0.1 (uvicorn in a thread) of the default model (the
`default_model` fixture of the repository root's conftest.py)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))  # server_test_support, for the test modules


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


@pytest.fixture(scope="session")
def make_server(default_model: Path) -> Any:
    """A factory for extra servers with their own options (stop them when done)."""
    return lambda **options: RunningServer(default_model, **options)


@pytest.fixture(scope="session")
def server(default_model: Path) -> Iterator[RunningServer]:
    """The shared server: the default model on the CPU, the default 256 MiB pool."""
    running = RunningServer(default_model)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def oracle_engine(default_model: Path) -> Any:
    """A second, in-process engine of the same model: what the server must reproduce."""
    from sv_engine import Engine

    return Engine.from_model_dir(default_model, device="cpu")
