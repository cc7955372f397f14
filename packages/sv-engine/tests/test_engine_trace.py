"""--trace through the real engine (tiny random Llama, CPU, overlapped loop): the logprobs
against transformers, the waits against --stats, cancels, and the schema."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import transformers
from sv_engine import Engine, EngineError, SamplingParams
from sv_engine.grammar import Grammar
from sv_engine.tracing import start_trace, stop_trace
from sv_scheduler import SpeculationConfig
from sv_trace import read_trace, trace_schema
from sv_trace.report import report_data


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    # A small pool, so that requests wait for credits.
    return Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=0.07)


@pytest.fixture(scope="module")
def oracle(tiny_llama_dir: Path) -> transformers.LlamaForCausalLM:
    return transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def validate(records: list[dict[str, Any]]) -> None:
    validator = jsonschema.Draft202012Validator(trace_schema())
    for record in records:
        errors = list(validator.iter_errors(record))
        assert not errors, f"{record['type']} line: {errors[0].message}"


def traced(engine: Engine, path: Path, run: Any) -> list[dict[str, Any]]:
    start_trace(engine, path, model="tiny")
    try:
        run()
    finally:
        stop_trace(engine)
    assert engine.tracer is None and engine.runner.logits_observer is None
    return read_trace(path)


def test_logprobs_are_transformers_and_waits_are_the_stats(
    engine: Engine, oracle: transformers.LlamaForCausalLM, tmp_path: Path
) -> None:
    prompts = ["Write a haiku about the sea.", "What is 2 + 2?", "Name three colours."]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    before = engine.stats.admission_waits
    done: list[Any] = []
    records = traced(
        engine, tmp_path / "t.jsonl", lambda: done.extend(engine.generate(prompts, params))
    )
    validate(records)
    steps = [r for r in records if r["type"] == "step"]
    counted = [s["wait"] for s in steps if s["wait"] is not None and s["wait"]["counted"]]
    assert counted, f"the pool ({engine.stats.pool_pages} pages) must make a request wait"
    assert len(counted) == engine.stats.admission_waits - before
    assert {w["reason"] for w in counted} == {"credits"}
    assert records[-1]["stats"]["admission_waits"] == engine.stats.admission_waits
    num_pages = records[0]["num_pages"]
    for s in steps:
        pool = s["pool"]
        assert pool["free"] + pool["cached"] + pool["assigned"] == num_pages
        assert len({p for t in pool["tables"] for p in t["pages"]}) == pool["assigned"]

    for completion in done:
        rid = completion.request_id
        sampled = [
            x for s in steps for x in s["sampled"] if x["request"] == rid and not x["dropped"]
        ]
        assert [x["token"] for x in sampled] == completion.output_ids
        ids = completion.prompt_ids + completion.output_ids
        with torch.no_grad():
            logits = oracle(torch.tensor([ids])).logits[0].float()
        expected = torch.log_softmax(logits, dim=-1)[len(completion.prompt_ids) - 1 : -1]
        for row, x in zip(expected, sampled, strict=True):
            assert x["logprob"] == pytest.approx(row[x["token"]].item(), abs=2e-4)
            top = torch.topk(row, 6)
            assert [t["logprob"] for t in x["top"]] == pytest.approx(
                top.values[:5].tolist(), abs=2e-4
            )
            # ids where the oracle's neighbours are clearly apart (no near-tie to reorder)
            gaps = (top.values[:-1] - top.values[1:]).tolist()
            for i, t in enumerate(x["top"]):
                if gaps[i] > 1e-3 and (i == 0 or gaps[i - 1] > 1e-3):
                    assert t["token"] == top.indices[i].item()
            assert x["top"][0]["token"] == x["token"]  # greedy: the most likely one


def test_a_cancel_is_recorded_and_its_token_in_flight_dropped(
    engine: Engine, tmp_path: Path
) -> None:
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    cancelled: list[Any] = []

    def run() -> None:
        first = engine.add_request("Tell me a long story.", params)
        engine.add_request("Hi.", SamplingParams(max_new_tokens=6, ignore_eos=True))
        for _ in range(4):
            engine.step()
        event = engine.cancel(first)
        assert event is not None and event.completion is not None
        cancelled.append(event.completion)
        while engine.has_unfinished():
            engine.step()

    records = traced(engine, tmp_path / "c.jsonl", run)
    validate(records)
    completion = cancelled[0]
    kinds = [(r["type"], r.get("request")) for r in records]
    assert ("cancel", completion.request_id) in kinds
    steps = [r for r in records if r["type"] == "step"]
    mine = [x for s in steps for x in s["sampled"] if x["request"] == completion.request_id]
    kept = [x["token"] for x in mine if not x["dropped"]]
    assert kept == completion.output_ids
    # the overlapped loop had the next step in flight: its token for the request is dropped
    assert [x["dropped"] for x in mine][-1] is True
    freed = [f for s in steps for f in s["freed"] if f["request"] == completion.request_id]
    assert len(freed) == 1 and freed[0]["pages"]
    end = records[-1]["pool"]
    assert end["free"] + end["cached"] == records[0]["num_pages"]


def test_an_unwritable_trace_is_a_clear_error(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "no-such-folder" / "t.jsonl"
    with pytest.raises(EngineError, match=r"cannot write the trace file .*no-such-folder"):
        start_trace(engine, path, model="tiny")
    assert engine.tracer is None


def test_each_line_is_one_json_object(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    traced(engine, path, lambda: engine.generate(["Hi."], params))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["type"] for line in lines] == [
        "header", "request", "step", "step", "step", "end",
    ]  # fmt: skip


def test_a_verified_drafts_kept_tokens_are_each_sampled_with_their_logprobs(
    default_model: Path, tmp_path: Path
) -> None:
    """With speculation a verify step keeps several tokens of a request: each is in the trace,
    in order, with the log-probability transformers gives it at its position (the trace held
    only each step's first choice, so accepted draft tokens were missing)."""
    spec = Engine.from_model_dir(default_model, device="cpu", speculation=SpeculationConfig())
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    done: list[Any] = []
    prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. " * 2
    records = traced(
        spec, tmp_path / "s.jsonl", lambda: done.extend(spec.generate([prompt], params))
    )
    validate(records)
    assert records[-1]["stats"]["accepted_tokens"] > 0, "no draft was accepted: nothing tested"
    (completion,) = done
    sampled = [x for r in records if r["type"] == "step" for x in r["sampled"] if not x["dropped"]]
    assert [x["token"] for x in sampled] == completion.output_ids
    oracle = transformers.AutoModelForCausalLM.from_pretrained(default_model, dtype=torch.float32)
    ids = completion.prompt_ids + completion.output_ids
    with torch.no_grad():
        logits = oracle.eval()(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[len(completion.prompt_ids) - 1 : -1]
    for row, x in zip(expected, sampled, strict=True):
        assert x["logprob"] == pytest.approx(row[x["token"]].item(), abs=2e-4)


def test_a_constrained_requests_logprobs_are_the_engines_with_or_without_logprobs(
    engine: Engine, tmp_path: Path
) -> None:
    """The trace's log-probabilities are of the raw logits, as the engine's own are: a grammar's
    mask went into the logits in place unless some row asked for logprobs, so the trace of the
    same constrained request differed with that, and from the completion's."""
    grammar = Grammar.regex("[a-z]{3,8}")
    sampled: dict[int | None, list[tuple[int, float]]] = {}
    done: dict[int | None, Any] = {}
    for logprobs in (None, 0):
        params = SamplingParams(
            max_new_tokens=8, temperature=0.0, grammar=grammar, logprobs=logprobs
        )
        records = traced(
            engine,
            tmp_path / f"g{logprobs}.jsonl",
            lambda p=params, k=logprobs: done.update({k: engine.generate(["Say a word:"], p)[0]}),
        )
        sampled[logprobs] = [
            (x["token"], x["logprob"])
            for r in records
            if r["type"] == "step"
            for x in r["sampled"]
            if not x["dropped"]
        ]
    assert [t for t, _ in sampled[None]] == done[None].output_ids == done[0].output_ids
    engines = [t.logprob for t in done[0].logprobs]
    assert [lp for _, lp in sampled[0]] == pytest.approx(engines, abs=2e-4)
    assert [lp for _, lp in sampled[None]] == pytest.approx(engines, abs=2e-4)


def test_a_trace_started_on_a_busy_engine_does_not_admit_what_already_ran(
    engine: Engine, tmp_path: Path
) -> None:
    """A request running when the trace starts was admitted before it: the first step said it
    was admitted there, with every page it held newly assigned, while it decoded."""
    rid = engine.add_request("Tell me a story.", SamplingParams(max_new_tokens=10, ignore_eos=True))
    for _ in range(3):
        engine.step()
    held = list(engine.scheduler.get(rid).table.pages)  # type: ignore[union-attr]

    def run() -> None:
        while engine.has_unfinished():
            engine.step()

    records = traced(engine, tmp_path / "busy.jsonl", run)
    validate(records)
    steps = [r for r in records if r["type"] == "step"]
    assert steps[0]["decodes"] and steps[0]["decodes"][0]["request"] == rid
    assert [a for s in steps for a in s["admitted"]] == []
    assigned = [p for s in steps for c in s["pages"] for p in c["assigned"] + c["shared"]]
    assert not set(assigned) & set(held)  # the pages it held were not assigned in the trace
    (request,) = report_data(records)["requests"]
    assert request["running_from"] == steps[0]["step"] and request["admitted"] == []


class _FillsUp(io.TextIOBase):
    """The trace file from its `after`-th write on: the disk is full."""

    def __init__(self, out: Any, after: int) -> None:
        super().__init__()
        self.out, self.after, self.name = out, after, out.name

    def write(self, text: str) -> int:
        self.after -= 1
        if self.after < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self.out.write(text))

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self.out.close()


def test_a_trace_write_that_fails_mid_run_stops_the_trace_not_the_requests(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk under `sv serve --trace` failed the step, and with it every request in
    flight and every later one. The requests now finish as untraced; the error is logged once
    when it happens and raised when the trace is stopped; the lines before it stay readable."""
    prompts = ["Write a haiku about the sea.", "What is 2 + 2?"]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    plain = [c.output_ids for c in engine.generate(prompts, params)]
    path = tmp_path / "full.jsonl"
    recorder = start_trace(engine, path, model="tiny")
    recorder._out = _FillsUp(recorder._out, after=4)
    with caplog.at_level(logging.ERROR, logger="sv_trace.recorder"):
        traced = [c.output_ids for c in engine.generate(prompts, params)]
    assert traced == plain
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "cannot write the trace file" in errors[0], errors
    with pytest.raises(OSError, match=r"cannot write the trace file .*full.jsonl.*No space left"):
        stop_trace(engine)
    assert engine.tracer is None and engine.runner.logits_observer is None
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1 + 4 and all(json.loads(line) for line in lines)  # header + 4
    assert json.loads(lines[0])["type"] == "header"


def test_failed_steps_leave_no_step_open_and_the_trace_stays_valid(
    engine: Engine, tmp_path: Path
) -> None:
    """A step that raises never resolves: the recorder kept its record open for good (one or
    two per failure, without bound under a server whose steps keep failing). Now dropped; the
    requests' cancel lines follow, and the next steps' records are whole and valid."""
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    launch = engine.runner.launch
    recorder = start_trace(engine, tmp_path / "f.jsonl", model="tiny")
    try:
        for _ in range(3):
            engine.add_request("Hi.", params)
            engine.step()

            def broken(step: Any) -> Any:
                raise RuntimeError("device lost")

            engine.runner.launch = broken  # type: ignore[method-assign]
            with pytest.raises(RuntimeError, match="device lost"):
                while True:
                    engine.step()
            engine.runner.launch = launch  # type: ignore[method-assign]
            assert not recorder._open and recorder._current is None
        done = engine.generate(["What is 2 + 2?"], params)
    finally:
        engine.runner.launch = launch  # type: ignore[method-assign]
        stop_trace(engine)
    records = read_trace(tmp_path / "f.jsonl")
    validate(records)
    assert sum(r["type"] == "cancel" for r in records) == 3
    last = [x for r in records if r["type"] == "step" for x in r["sampled"]][-6:]
    assert [x["token"] for x in last] == done[0].output_ids


def test_a_failed_grammar_is_traced_as_an_error_not_a_cancel(
    engine: Engine, tmp_path: Path
) -> None:
    """The engine ends a request whose grammar fails between steps, with finish "error"; its
    trace line said "cancel" and the report drew it as cancelled. Now the line says why."""
    digits = frozenset(engine.tokenizer.encode(str(d))[0] for d in range(10))
    params = SamplingParams(
        max_new_tokens=12, grammar=Grammar.regex("1[a-z]+"), allowed_token_ids=digits
    )
    done: list[Any] = []
    records = traced(
        engine,
        tmp_path / "g.jsonl",
        lambda: done.extend(engine.generate(["What is 2 + 2?"], params)),
    )
    validate(records)
    assert done[0].finish_reason == "error"
    ends = [r for r in records if r["type"] == "cancel"]
    assert [(r["request"], r.get("reason")) for r in ends] == [(done[0].request_id, "error")]
    (drawn,) = report_data(records)["requests"]
    assert drawn["finish"] == "error"
