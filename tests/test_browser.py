"""The trace report and the live dashboard in a real browser (headless Chromium): their DOM,
a hover tooltip, no console errors, and the README's screenshots."""

from __future__ import annotations

import json
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

sys.path.insert(0, str(Path(__file__).parent))
from browser import console_errors, find_browser, open_browser, screenshot

KEY = "browser-test-key"
PROMPTS = ["Name a colour.", "Say hello.", "Name a fruit.", "Count to three.", "Hi."]


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    find_browser()
    browser = open_browser()
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """A real trace (the default model on the CPU, a pool small enough to make requests wait)
    and its report page."""
    from sv_cli.main import main
    from sv_trace import read_trace

    folder = tmp_path_factory.mktemp("report")
    trace, page = folder / "trace.jsonl", folder / "report.html"
    argv = ["generate", "--device", "cpu", "--kv-cache-mib", "8", "--trace", str(trace)]
    assert main([*argv, PROMPTS[0], "24", *PROMPTS[1:]]) == 0
    assert main(["trace", "report", str(trace), "-o", str(page)]) == 0
    return page, read_trace(trace)


def test_report_in_a_browser(
    driver: Any, report: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    page, records = report
    driver.get(page.as_uri())
    rows = driver.find_elements(By.CSS_SELECTOR, "#timeline .req-row")
    assert [r.get_attribute("data-request") for r in rows] == [str(i) for i in range(1, 6)]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#pool .page")) == records[0]["num_pages"]
    assert driver.find_elements(By.CSS_SELECTOR, "#pool .page.assigned, #pool .page.shared")
    stats = records[-1]["stats"]
    figures = driver.find_element(By.ID, "stats").text
    assert f"{stats['admission_waits']}\nadmission waits" in figures

    # Hover request 2's first token: the tooltip shows its alternatives from the trace.
    first = next(
        s for r in records if r["type"] == "step" for s in r["sampled"] if s["request"] == 2
    )
    token = driver.find_element(By.CSS_SELECTOR, '.tok[data-request="2"][data-index="0"]')
    ActionChains(driver).move_to_element(token).perform()
    tooltip = driver.find_element(By.ID, "tooltip")
    assert tooltip.is_displayed()
    lines = tooltip.text.splitlines()
    assert lines[0].startswith(json.dumps(first["text"], ensure_ascii=False))
    assert f"p={2.718281828459045 ** first['logprob']:.4f}" in lines[0]
    alternatives = tooltip.find_elements(By.CSS_SELECTOR, "tr.alt")
    assert len(alternatives) == 5
    best = first["top"][0]
    assert alternatives[0].text.startswith(f"1. {json.dumps(best['text'], ensure_ascii=False)}")
    assert f"{2.718281828459045 ** best['logprob']:.4f}" in alternatives[0].text
    ActionChains(driver).move_to_element(driver.find_element(By.TAG_NAME, "h1")).perform()
    assert not tooltip.is_displayed()

    # Moving the step slider redraws the pool at that step.
    steps = [r for r in records if r["type"] == "step"]
    driver.execute_script(
        "const s = document.getElementById('step-slider'); s.value = 0;"
        "s.dispatchEvent(new Event('input'));"
    )
    held = driver.find_elements(By.CSS_SELECTOR, "#pool .page.assigned, #pool .page.shared")
    assert len(held) == steps[0]["pool"]["assigned"]
    driver.execute_script("window.scrollTo(0, 0)")
    screenshot(driver, tmp_path, "trace-report.png")
    assert console_errors(driver) == []


def test_a_speculating_runs_report_has_every_token_and_the_draft_figures(
    driver: Any, tmp_path: Path
) -> None:
    """Accepted draft tokens are tokens of the request like any other: the page shows as many
    as the completion had, and the verified and accepted drafts beside the --stats figures."""
    from selenium.webdriver.common.by import By
    from sv_cli.main import main
    from sv_trace import read_trace

    trace, page = tmp_path / "spec.jsonl", tmp_path / "spec.html"
    prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. " * 2
    argv = ["generate", "--device", "cpu", "--speculate", "ngram", "--trace", str(trace)]
    assert main([*argv, prompt, "30"]) == 0
    assert main(["trace", "report", str(trace), "-o", str(page)]) == 0
    stats = read_trace(trace)[-1]["stats"]
    assert stats["accepted_tokens"] > 0, "no draft was accepted: nothing tested"
    driver.get(page.as_uri())
    assert len(driver.find_elements(By.CSS_SELECTOR, '.tok[data-request="1"]')) == 30
    figures = driver.find_element(By.ID, "stats").text
    assert f"{stats['drafted_tokens']} ({stats['accepted_tokens']}, " in figures
    assert console_errors(driver) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(trace: Path) -> tuple[str, subprocess.Popen[str]]:
    """`sv serve` on the CPU with an API key and --trace, as a user runs it."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sv_cli", "serve", "--device", "cpu", "--port", str(port),
         "--kv-cache-mib", "8", "--api-key", KEY, "--trace", str(trace), "--log-level", "warning"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url, process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _, err = process.communicate()
            pytest.fail(f"sv serve did not start: {err}")
        time.sleep(0.2)


def test_dashboard_in_a_browser(driver: Any, tmp_path: Path) -> None:
    """The live dashboard of a running `sv serve`: locked until the key is given, then the
    pool, the running requests and the figures; the server's --trace closed on SIGINT."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from sv_trace import read_trace

    trace = tmp_path / "serve.jsonl"
    url, process = start_server(trace)
    try:
        _watch_dashboard(driver, url, tmp_path, By, WebDriverWait)
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    records = read_trace(trace)
    assert records[0]["admission"] == "preemptive"  # sv serve's default
    assert sum(1 for r in records if r["type"] == "request") == 3
    end = records[-1]
    assert end["type"] == "end"
    assert end["stats"]["free_pages"] == end["stats"]["pool_pages"]


def _watch_dashboard(driver: Any, url: str, tmp_path: Path, By: Any, WebDriverWait: Any) -> None:
    driver.get(f"{url}/dashboard")
    wait = WebDriverWait(driver, 60, poll_frequency=0.1)
    form = driver.find_element(By.ID, "key-form")
    wait.until(lambda d: form.is_displayed())  # locked until the key is given
    assert not driver.find_element(By.ID, "live").is_displayed()
    driver.find_element(By.ID, "key-input").send_keys(KEY)
    form.submit()
    wait.until(lambda d: d.find_element(By.ID, "live").is_displayed())

    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    total = int(re.search(r"^sv_kv_cache_pages_capacity (\d+)", metrics, re.M).group(1))  # type: ignore[union-attr]
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "smollm2-135m-instruct", "max_tokens": 64, "ignore_eos": True}
    clients = [
        threading.Thread(
            target=httpx.post,
            args=(f"{url}/v1/completions",),
            kwargs={"json": {**body, "prompt": p}, "headers": auth, "timeout": 300},
        )
        for p in ("Once upon a time", "The weather today", "A list of rivers:")
    ]
    for client in clients:
        client.start()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#running tr.req-row")) >= 2)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#pool .page")) == total
    # One frame is one snapshot: read the pool's owners and the running rows together.
    owners, running = driver.execute_script(
        "const ids = (sel) => [...document.querySelectorAll(sel)].map((e) => e.dataset.request);"
        "return [ids('#pool .page.assigned, #pool .page.shared'), ids('#running tr.req-row')];"
    )
    assert owners and set(owners) <= set(running)
    time.sleep(1.2)  # two more frames: the tokens/s line has a few points
    screenshot(driver, tmp_path, "dashboard.png")
    assert float(driver.find_element(By.ID, "f-tps").text) >= 0
    for client in clients:
        client.join(300)
    assert console_errors(driver) == []
