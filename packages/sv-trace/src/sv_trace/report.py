"""`sv trace report FILE -o report.html`: one self-contained page of a step trace.

Everything the page needs is inside it: the trace's figures as one JSON object, and the CSS
and JavaScript of web/ inlined (nothing is fetched when it is viewed, so it works offline and
as an attachment). The page draws a timeline of requests (queued, admitted, prefill chunks,
decode, finished or cancelled), the page pool at any step (and its counts over steps), the
batch size and tokens of every step, and each request's tokens, whose alternatives and
probabilities show on hover. The `--stats` figures of the run head the page.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from sv_trace.errors import TraceError
from sv_trace.schema import read_trace


def render_report(trace_path: str | Path, note: Callable[[str], None] | None = None) -> str:
    """The report page of the trace file at `trace_path` (raises TraceError if unreadable);
    `note` hears of what was read past (read_trace)."""
    records = read_trace(trace_path, note)
    data = report_data(records)
    # A file name's bytes that are not UTF-8 (kept by Python as lone surrogates) shown as \xNN
    data["source"] = os.fsencode(Path(trace_path).name).decode("utf-8", "backslashreplace")
    title = f"sv trace: {data['source']}"
    return _page(title, ("common.css", "report.css"), data, ("pool.js", "report.js"))


def report_data(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the page draws, gathered per request and per step from the trace's records."""
    header = records[0]
    requests: dict[int, dict[str, Any]] = {}
    steps: list[dict[str, Any]] = []
    pools: list[dict[str, Any]] = []
    end: dict[str, Any] | None = None
    next_step = 0  # the step a request queued now can first be planned into

    def request(rid: int) -> dict[str, Any]:
        entry = requests.get(rid)
        if entry is None:  # a request queued before the trace started
            entry = requests[rid] = _new_request(rid, next_step, None)
        return entry

    for record in records[1:]:
        kind = record["type"]
        if kind == "request":
            requests[record["request"]] = _new_request(record["request"], next_step, record)
        elif kind == "cancel":
            r = request(record["request"])
            r["end_step"], r["finish"] = next_step, record.get("reason", "cancelled")
        elif kind == "step":
            index = len(steps)
            step = record["step"]
            next_step = step + 1
            if not index:  # a trace started on a busy engine: who ran already, admitted before
                for table in record["pool"]["tables"]:
                    found = request(table["request"])
                    if found["prompt_tokens"] is None:  # (no request line: queued before)
                        found["running_from"] = step
            for a in record["admitted"]:
                request(a["request"])["admitted"].append(step)
            for c in record["prefills"]:
                request(c["request"])["prefill"].append([step, c["start"], c["end"]])
            for d in record["decodes"]:
                request(d["request"])["decode"].append(step)
            for rid in record["preempted"]:
                request(rid)["preempted"].append(step)
            wait = record["wait"]
            if wait is not None:
                request(wait["request"])["waits"].append([step, wait["reason"], wait["counted"]])
            for s in record["sampled"]:
                if s["dropped"]:
                    continue
                # A grammar's mask leaves some of a row's top 5 at -Infinity, which JSON (and
                # the page's JSON.parse) has no way to write: they had no chance, so no entry.
                top = [
                    [t["text"], t["logprob"]] for t in s.get("top", []) if t["logprob"] > -math.inf
                ]
                request(s["request"])["tokens"].append(
                    [s["token"], s["text"], s.get("logprob"), top, step]
                )
            for f in record["finished"]:
                r = request(f["request"])
                r["end_step"], r["finish"] = step, f["reason"]
            pool = record["pool"]
            timing = record["timing"]
            steps.append(
                {
                    "step": step,
                    "index": index,
                    "at_ms": record["at_ms"],
                    "tokens": record["num_tokens"],
                    "prefills": len(record["prefills"]),
                    "decodes": len(record["decodes"]),
                    "waiting": len(record["waiting"]),
                    "free": pool["free"],
                    "cached": pool["cached"],
                    "assigned": pool["assigned"],
                    "host_ms": timing["host_ms"],
                    "device_ms": timing["device_ms"],
                    "wait": None if wait is None else wait["reason"],
                }
            )
            pools.append({k: pool[k] for k in ("num_pages", "tables", "cached_pages")})
        elif kind == "end":
            end = record
    # Ids are integers (the engine's) or strings: a trace holding both sorts them apart.
    in_order = sorted(requests.values(), key=lambda r: (isinstance(r["id"], str), r["id"]))
    for r in in_order:
        # The overlapped loop plans a request into the step after the one it stopped in (its
        # token there is dropped): that row is no part of the request's timeline.
        if r["end_step"] is not None:
            r["decode"] = [s for s in r["decode"] if s <= r["end_step"]]
            r["prefill"] = [c for c in r["prefill"] if c[0] <= r["end_step"]]
    return {
        "header": header,
        "stats": None if end is None else end["stats"],
        "requests": in_order,
        "steps": steps,
        "pools": pools,
        "end_pool": None if end is None else end["pool"],
    }


def _new_request(rid: int, step: int, record: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": rid,
        "queued_step": step,
        "prompt_tokens": None if record is None else len(record["prompt_ids"]),
        "prompt_text": "" if record is None else record["prompt_text"],
        "max_new_tokens": None if record is None else record["max_new_tokens"],
        "admitted": [],
        "running_from": None,  # the first step, for a request running when the trace started
        "prefill": [],
        "decode": [],
        "preempted": [],
        "waits": [],
        "tokens": [],
        "end_step": None,
        "finish": None,
    }


def _asset(name: str) -> str:
    return resources.files("sv_trace").joinpath("web", name).read_text(encoding="utf-8")


def _script_json(data: dict[str, Any]) -> str:
    """JSON safe inside a <script> element: with every '<' escaped (it can only be inside a
    string), no text from the trace can close the element or open a comment in it. A number
    JSON cannot write (a -Infinity log-probability, or an infinity in a field the report
    copies without drawing) is null there."""
    return json.dumps(_finite(data), separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _finite(value: Any) -> Any:
    """`value` with every non-finite float, at any depth, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _page(
    title: str,
    styles: tuple[str, ...],
    data: dict[str, Any] | None,
    scripts: tuple[str, ...],
    body_file: str = "report.html",
) -> str:
    css = "\n".join(_asset(name) for name in styles)
    js = "\n".join(_asset(name) for name in scripts)
    payload = ""
    if data is not None:
        payload = f'<script id="trace-data" type="application/json">{_script_json(data)}</script>'

    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{html.escape(title)}</title><style>{css}</style></head>"
        f"<body>{_asset(body_file)}{payload}<script>{js}</script></body></html>\n"
    )


def page(title: str, styles: tuple[str, ...], scripts: tuple[str, ...], body_file: str) -> str:
    """A page of web/ assets with no trace data (the server's dashboard)."""
    return _page(title, styles, None, scripts, body_file)


def write_report(
    trace_path: str | Path, out_path: str | Path, note: Callable[[str], None] | None = None
) -> None:
    # Read first: a trace that cannot be read is its own error, not the comparison's OSError.
    data = render_report(trace_path, note).encode("utf-8")  # before the file is opened
    if Path(out_path).exists() and Path(out_path).samefile(trace_path):
        raise TraceError(
            f"the report {str(out_path)!r} would overwrite the trace it is drawn from; "
            "give another path"
        )
    try:
        Path(out_path).write_bytes(data)
    except OSError as e:
        raise TraceError(f"cannot write the report {str(out_path)!r}: {e.strerror}") from None
