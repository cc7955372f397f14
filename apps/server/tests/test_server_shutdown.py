"""Stopping the server: `sv serve` as a process under SIGINT and SIGTERM (streams end with an
error event and `[DONE]`, whole answers get 503, every page is freed, exit code 0), and the
drain that lets requests in flight finish first."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

LONG = {"max_tokens": 200, "ignore_eos": True}  # runs for a minute on the CPU unless ended


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_sv_serve(model: Path, port: int, *options: str) -> subprocess.Popen[str]:
    command = "import sys; from sv_cli.main import main; sys.exit(main())"
    return subprocess.Popen(
        [sys.executable, "-c", command, "serve", "--port", str(port), "--device", "cpu",
         "--kv-cache-mib", "32", "--model", str(model), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def _wait_healthy(process: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stdout.read()  # type: ignore[union-attr]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "sv serve did not come up"
        time.sleep(0.2)


def _wait_shutting_down(url: str) -> None:
    """Until the server has taken its first signal: it closes its listening socket then."""
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
        except httpx.ConnectError:
            return
        assert time.monotonic() < deadline, "sv serve still accepts connections after SIGINT"
        time.sleep(0.05)


def _running(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("sv_requests_running "):
            return float(line.split()[1])
    raise AssertionError("no sv_requests_running in /metrics")


def _events(lines: Iterator[str]) -> Iterator[str]:
    return (line.removeprefix("data: ") for line in lines if line)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sv_serve_ends_requests_cleanly_on_a_signal(default_model: Path, sig: int) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start_sv_serve(default_model, port)
    try:
        _wait_healthy(process, url)
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert [m["id"] for m in models] == [default_model.name]
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 12,
                "temperature": 0,
            },
            timeout=60,
        ).json()
        assert "Paris" in reply["choices"][0]["message"]["content"]

        whole: list[httpx.Response] = []
        waiter = threading.Thread(
            target=lambda: whole.append(
                httpx.post(f"{url}/v1/completions", json={"prompt": "1, 2,"} | LONG, timeout=60)
            )
        )
        body = {"prompt": "Count: 1, 2, 3,", "stream": True} | LONG
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as stream:
            events = _events(stream.iter_lines())
            assert "choices" in json.loads(next(events))  # streaming
            waiter.start()
            deadline = time.monotonic() + 30
            while _running(url) < 2:  # the whole answer is being generated too
                assert time.monotonic() < deadline, "the second request never ran"
                time.sleep(0.05)
            process.send_signal(sig)
            signalled = time.monotonic()
            rest = list(events)
        waiter.join(30)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert time.monotonic() - signalled < 15
    assert rest[-1] == "[DONE]", rest[-3:]
    error = json.loads(rest[-2])["error"]
    assert error["code"] == "shutting_down" and error["type"] == "server_error"
    assert whole and whole[0].status_code == 503
    assert whole[0].json()["error"]["code"] == "shutting_down"
    assert process.returncode == 0, out
    pages = re.search(r"(\d+) of (\d+) KV pages free", out)
    assert pages and pages[1] == pages[2], out
    # 32 MiB hold fewer tokens than the model's context: said at the start
    start = re.search(r"\(context (\d+) tokens, (\d+) KV pages, llama3_json tool calls\)", out)
    assert start and int(start[2]) * 16 < int(start[1]), out
    assert f"the KV cache holds {int(start[2]) * 16:,} tokens in all, fewer than the context" in out


@pytest.mark.slow
def test_a_second_ctrl_c_ends_the_drain(default_model: Path) -> None:
    """As uvicorn says when it stops ("CTRL+C to force quit"): a second SIGINT does not wait
    out --drain-seconds; the streams still end with the error event, and nothing is left to be
    cancelled with a traceback at exit."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # (a context the 32 MiB cache holds whole: no note at the start)
    options = ("--drain-seconds", "600", "--max-model-len", "512")
    process = _start_sv_serve(default_model, port, *options)
    body = {"prompt": "Count: 1, 2, 3,", "stream": True} | LONG
    try:
        _wait_healthy(process, url)
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as stream:
            events = _events(stream.iter_lines())
            assert "choices" in json.loads(next(events))
            process.send_signal(signal.SIGINT)  # the drain: the stream goes on
            _wait_shutting_down(url)  # else two quick SIGINTs can reach Python's handler as one
            assert "choices" in json.loads(next(events))
            process.send_signal(signal.SIGINT)
            rest = list(events)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert rest[-1] == "[DONE]", rest[-3:]
    assert json.loads(rest[-2])["error"]["code"] == "shutting_down", rest[-3:]
    assert len(rest) < LONG["max_tokens"]
    assert process.returncode == 0, out
    assert "Traceback" not in out and "KV cache holds" not in out, out
    pages = re.search(r"(\d+) of (\d+) KV pages free", out)
    assert pages and pages[1] == pages[2], out


def test_a_drain_lets_requests_in_flight_finish(make_server: Any) -> None:
    server = make_server(drain_s=60)
    stopper = threading.Thread(target=server.stop)
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 12, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as stream:
            events = _events(stream.iter_lines())
            next(events)
            stopper.start()  # the shutdown starts with the stream under way
            rest = list(events)
        stopper.join(60)
        assert not stopper.is_alive()
    finally:
        server.stop()  # (again: a no-op once stopped)
    assert rest[-1] == "[DONE]"
    assert not any("error" in json.loads(e) for e in rest[:-1])
    assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "length"
    with pytest.raises(httpx.ConnectError):  # the listening socket is closed
        httpx.get(f"{server.url}/health", timeout=5)
    engine = server.app.state.server.loop.engine
    assert engine.stats.free_pages == engine.stats.pool_pages


def test_a_body_still_arriving_at_shutdown_gets_a_503(make_server: Any) -> None:
    server = make_server()
    stopper = threading.Thread(target=server.stop)
    port = int(server.url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
            client.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                b'{"prompt": "Hel'  # and the rest never comes
            )
            deadline = time.monotonic() + 30
            while server.requests_in_progress() == 0:  # the handler is waiting for the body
                assert time.monotonic() < deadline, "the request never reached the app"
                time.sleep(0.02)
            stopper.start()
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
        stopper.join(60)
    finally:
        server.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), answer
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "shutting_down"


def test_shutdown_waits_out_a_long_engine_step(make_server: Any, monkeypatch: Any) -> None:
    """On a CPU one step of a long prompt can take minutes. A shutdown that gave up on the
    engine thread after a fixed time cut the streams (no error event, no [DONE]) and left the
    step's pages held; it waits for the step instead (a second Ctrl-C would not)."""
    from sv_server.engine_loop import EngineLoop

    # Any bound on the wait is too short for some step: these make that quick to see.
    monkeypatch.setattr(EngineLoop.stop, "__defaults__", (0.2,))
    monkeypatch.setattr("sv_server.serving.GRACEFUL_SHUTDOWN_S", 0.5)
    server = make_server()
    engine = server.app.state.server.loop.engine
    step, in_step, release = engine.step, threading.Event(), threading.Event()

    def long_step() -> Any:
        in_step.set()
        release.wait(60)
        return step()

    body = {"prompt": "Count: 1, 2, 3,", "stream": True} | LONG
    stopper = threading.Thread(target=server.stop)
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as stream:
            events = _events(stream.iter_lines())
            next(events)
            engine.step = long_step  # the engine thread's next step is a long one
            assert in_step.wait(60)
            stopper.start()
            time.sleep(2.0)  # well past the bounds above: the step is still running
            release.set()
            rest = list(events)
        stopper.join(60)
    finally:
        release.set()
        server.stop()
    assert rest[-1] == "[DONE]", rest[-3:]
    assert json.loads(rest[-2])["error"]["code"] == "shutting_down", rest[-3:]
    assert engine.stats.free_pages == engine.stats.pool_pages


def _serving(process: subprocess.Popen[str], port: int) -> str:
    """The URL of the `sv serve` that `process` runs on `port`, once it answers /health."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stderr.read()  # type: ignore[union-attr]
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return url
        assert time.monotonic() < deadline, "sv serve did not come up"
        time.sleep(0.2)


def test_sv_serve_refuses_a_closed_stdout_while_it_logs_access_there(
    default_model: Path,
) -> None:
    """`sv serve >&-`: every request's access line went to the closed stdout and printed a
    "Logging error" traceback to stderr, request after request. Refused at once in one line
    (before the model loads), unless --log-level keeps the access log off; then it serves and
    writes no such error."""
    command = "import sys; from sv_cli.main import main; sys.exit(main())"
    argv = [sys.executable, "-c", command, "serve", "--device", "cpu", "--kv-cache-mib", "32",
            "--model", str(default_model)]  # fmt: skip
    done = subprocess.run(
        [*argv, "--port", str(_free_port())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "standard output is closed" in done.stderr
    port = _free_port()
    process = subprocess.Popen(
        [*argv, "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.close(1),
    )
    try:
        url = _serving(process, port)
        body = {"model": default_model.resolve().name, "prompt": "Hi", "max_tokens": 2}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert "Logging error" not in stderr and "Traceback" not in stderr, stderr


def test_a_reader_of_the_access_log_that_goes_away_ends_the_log_not_the_server(
    default_model: Path,
) -> None:
    """`sv serve | head -1`: once the pipe's reader was gone, every request's access line
    printed a "Logging error" traceback to stderr. The log now ends with one warning; the
    server answers on, and stops cleanly (no BrokenPipeError at exit)."""
    port = _free_port()
    command = "import sys; from sv_cli.main import main; sys.exit(main())"
    process = subprocess.Popen(
        [sys.executable, "-c", command, "serve", "--device", "cpu", "--kv-cache-mib", "32",
         "--model", str(default_model), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        url = _serving(process, port)
        assert "GET /health" in process.stdout.readline()  # type: ignore[union-attr]
        process.stdout.close()  # type: ignore[union-attr]  # (as `head -1` exits)
        body = {"model": default_model.resolve().name, "prompt": "Hi", "max_tokens": 2}
        for _ in range(3):
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "Logging error" not in stderr and "Traceback" not in stderr, stderr
    assert "BrokenPipeError" not in stderr, stderr
    assert stderr.count("the access log stops here") == 1, stderr
