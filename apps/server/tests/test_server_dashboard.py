"""/dashboard without a browser: its key check (bearer header or session cookie), and its
frames against /metrics."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_test_support import openai_error

KEY = "dashboard-test-key"


@pytest.fixture(scope="module")
def keyed(make_server: Any) -> Iterator[Any]:
    running = make_server(api_key=KEY, kv_cache_mib=8)
    yield running
    running.stop()


def frames(url: str, n: int, until: Any = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The first `n` frames of /dashboard/events (or fewer, once `until(frame)` holds)."""
    out: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{url}/dashboard/events", timeout=30, **kwargs) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if len(out) == n or (until is not None and until(out[-1])):
                    break
    return out


def test_the_page_is_open_and_holds_no_data(keyed: Any) -> None:
    page = httpx.get(f"{keyed.url}/dashboard", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "sv dashboard" in page.text and KEY not in page.text
    assert httpx.get(f"{keyed.url}/dashboard/session", timeout=10).json() == {
        "key_required": True,
        "authorized": False,
    }


def test_events_need_the_key(keyed: Any) -> None:
    before = keyed.metrics()['sv_requests_rejected_total{reason="unauthorized"}']
    refused = httpx.get(f"{keyed.url}/dashboard/events", timeout=10)
    assert openai_error(refused, 401)["code"] == "invalid_api_key"  # every refusal's shape
    wrong = httpx.post(
        f"{keyed.url}/dashboard/session", headers={"Authorization": "Bearer nope"}, timeout=10
    )
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    forged = httpx.get(f"{keyed.url}/dashboard/events", cookies={"sv_dashboard": KEY}, timeout=10)
    assert forged.status_code == 401
    after = keyed.metrics()['sv_requests_rejected_total{reason="unauthorized"}']
    assert after == before + 3


def test_the_key_buys_a_cookie_that_is_not_the_key(keyed: Any) -> None:
    login = httpx.post(
        f"{keyed.url}/dashboard/session", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )
    assert login.status_code == 200 and login.json() == {"authorized": True}
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    value = login.cookies["sv_dashboard"]
    assert KEY not in value and len(value) == 64
    cookies = {"sv_dashboard": value}
    session = httpx.get(f"{keyed.url}/dashboard/session", cookies=cookies, timeout=10)
    assert session.json()["authorized"] is True
    assert frames(keyed.url, 1, cookies=cookies)[0]["model"] == keyed.model_name
    # scripts may send the key itself
    assert frames(keyed.url, 1, headers={"Authorization": f"Bearer {KEY}"})


def test_frames_show_a_running_request_and_agree_with_metrics(keyed: Any) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    done = threading.Event()

    def complete() -> None:
        httpx.post(
            f"{keyed.url}/v1/completions",
            json={"model": keyed.model_name, "prompt": "Once upon a time", "max_tokens": 40},
            headers=auth,
            timeout=120,
        )
        done.set()

    thread = threading.Thread(target=complete)
    thread.start()
    busy = frames(keyed.url, 200, until=lambda f: f["view"] and f["view"]["running"], headers=auth)
    view = busy[-1]["view"]
    assert view["running"], "no frame showed the request running"
    running = view["running"][0]
    table = next(t for t in view["pool"]["tables"] if t["request"] == running["request"])
    assert running["pages"] == len(table["pages"]) >= 1
    assert running["prompt_tokens"] > 0 and running["max_new_tokens"] == 40
    thread.join(120)
    assert done.is_set()
    metrics = keyed.wait_idle()
    frame = frames(keyed.url, 1, headers=auth)[0]
    pool = frame["view"]["pool"]
    assert pool["assigned"] == metrics["sv_kv_cache_pages_used"] == 0
    assert pool["free"] + pool["cached"] == metrics["sv_kv_cache_pages_free"]
    assert pool["cached"] == metrics["sv_kv_cache_pages_cached"]
    assert pool["num_pages"] == metrics["sv_kv_cache_pages_capacity"]
    assert frame["generation_tokens"] == metrics["sv_generation_tokens_total"]
    assert frame["steps"] == metrics["sv_engine_steps_total"]
    ttft = (
        metrics["sv_time_to_first_token_seconds_sum"]
        / metrics["sv_time_to_first_token_seconds_count"]
    )
    assert frame["ttft_ms"] == pytest.approx(ttft * 1e3)
    assert frame["view"]["running"] == [] and frame["view"]["queue"] == []


def test_tokens_per_second_counts_the_tokens_between_frames(keyed: Any) -> None:
    """Each frame's tokens/s covers the time since the frame before: summed over the frames,
    rate x interval is the tokens the metrics counted between the first frame and the last."""
    auth = {"Authorization": f"Bearer {KEY}"}
    base = frames(keyed.url, 1, headers=auth)[0]["generation_tokens"]
    thread = threading.Thread(
        target=httpx.post,
        args=(f"{keyed.url}/v1/completions",),
        kwargs={
            "json": {"model": keyed.model_name, "prompt": "Count to ten:", "max_tokens": 24,
                     "ignore_eos": True},
            "headers": auth,
            "timeout": 120,
        },
    )  # fmt: skip
    thread.start()
    got = frames(keyed.url, 400, until=lambda f: f["generation_tokens"] >= base + 24, headers=auth)
    thread.join(120)
    generated = got[-1]["generation_tokens"] - got[0]["generation_tokens"]
    assert generated > 0
    counted = sum(
        f["tokens_per_s"] * (f["at_s"] - before["at_s"]) for before, f in itertools.pairwise(got)
    )
    assert counted == pytest.approx(generated, rel=1e-6)


def test_without_a_key_everything_is_open(server: Any) -> None:
    assert httpx.get(f"{server.url}/dashboard/session", timeout=10).json() == {
        "key_required": False,
        "authorized": True,
    }
    assert frames(server.url, 1)[0]["view"] is not None
