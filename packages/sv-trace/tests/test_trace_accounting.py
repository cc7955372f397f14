"""The trace against the scheduler's own accounting, on scripted scenarios: the pool's counts
against the block tables recorded beside them, the admission waits against --stats, and hand
computed timelines."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sv_scheduler import SchedulerConfig
from sv_tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from scripted import Run, Scenario, prompt, run


def config(**overrides: Any) -> SchedulerConfig:
    values: dict[str, Any] = {"num_pages": 5, "max_model_len": 512, "page_size": 16}
    values.update(overrides)
    return SchedulerConfig(**values)


SCENARIOS = {
    # 3 requests of 2 credits each (ceil((20 + 13 - 1) / 16)) in a 5-page pool: two run.
    "conservative-tiny-pool": Scenario(
        config(), [prompt(20, 1), prompt(20, 2), prompt(20, 3)], [13, 13, 13]
    ),
    "static": Scenario(
        config(num_pages=6, policy="static"),
        [prompt(30, 1), prompt(5, 2), prompt(40, 3), prompt(8, 4)],
        [6, 9, 4, 5],
        stop_at={2: 3},
    ),
    "preemptive-tiny-pool": Scenario(
        config(num_pages=6, admission="preemptive"),
        [prompt(17, 1), prompt(17, 2), prompt(17, 3)],
        [40, 40, 40],
    ),
    "cancels": Scenario(
        config(num_pages=8),
        [prompt(24, 1), prompt(24, 2), prompt(24, 3), prompt(10, 4)],
        [30, 30, 30, 8],
        cancel_after={3: 1, 5: 3},
    ),
    "shared-prefix": Scenario(
        config(num_pages=32),
        [prompt(40, 9), [*prompt(40, 9)[:32], *prompt(9, 5)], prompt(12, 3)],
        [5, 5, 5],
    ),
    "max-num-seqs": Scenario(
        config(num_pages=64, max_num_seqs=1), [prompt(10, 1), prompt(10, 2)], [4, 4]
    ),
    "token-budget": Scenario(
        config(num_pages=64, max_num_seqs=4, max_step_tokens=16),
        [prompt(40, 1), prompt(20, 2)],
        [3, 3],
    ),
}


@pytest.fixture(scope="module")
def runs(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    folder = tmp_path_factory.mktemp("traces")
    return {name: run(s, tokenizer, folder / f"{name}.jsonl") for name, s in SCENARIOS.items()}


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_line_matches_the_schema(runs: dict[str, Run], validator: Any, name: str) -> None:
    records = runs[name].records
    assert records[0]["type"] == "header" and records[-1]["type"] == "end"
    for record in records:
        errors = sorted(validator.iter_errors(record), key=str)
        assert not errors, f"{record['type']} line: {errors[0].message}"


@pytest.mark.parametrize("name", SCENARIOS)
def test_page_counts_sum_to_the_pool_and_match_the_block_tables(
    runs: dict[str, Run], name: str
) -> None:
    num_pages = SCENARIOS[name].config.num_pages
    for record in [*runs[name].steps(), runs[name].records[-1]]:
        pool = record["pool"]
        assert pool["free"] + pool["cached"] + pool["assigned"] == num_pages
        held = {page for table in pool["tables"] for page in table["pages"]}
        assert len(held) == pool["assigned"]
        assert len(set(pool["cached_pages"])) == pool["cached"]
        assert held.isdisjoint(pool["cached_pages"])
        rows = [table["row"] for table in pool["tables"]]
        assert len(rows) == len(set(rows))  # one table row per running request
    end = runs[name].records[-1]["pool"]
    assert end["assigned"] == 0 and end["tables"] == []


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_counted_wait_is_an_admission_wait_of_the_stats(
    runs: dict[str, Run], name: str
) -> None:
    r = runs[name]
    waits = [s["wait"] for s in r.steps() if s["wait"] is not None]
    counted = [w for w in waits if w["counted"]]
    assert len(counted) == r.stats.admission_waits
    assert len({w["request"] for w in counted}) == r.stats.waited_requests
    assert r.records[-1]["stats"]["admission_waits"] == r.stats.admission_waits


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_peaks_of_the_trace_are_those_of_the_stats(runs: dict[str, Run], name: str) -> None:
    r = runs[name]
    steps = r.steps()
    assert len(steps) == r.stats.steps
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert max(s["pool"]["assigned"] for s in steps) == r.stats.peak_assigned_pages
    assert max(len(s["pool"]["tables"]) for s in steps) == r.stats.peak_running
    assert max(len(s["decodes"]) for s in steps) == r.stats.largest_decode_batch
    assert sum(len(s["preempted"]) for s in steps) == r.stats.preemptions
    assert sum(a["cached_tokens"] for s in steps for a in s["admitted"]) == (
        r.stats.prefix_cache_hit_tokens
    )


@pytest.mark.parametrize("name", SCENARIOS)
def test_page_changes_add_up_to_each_block_table(runs: dict[str, Run], name: str) -> None:
    """assigned + shared since admission is the table; freed is the table as last recorded."""
    built: dict[int, list[int]] = {}
    last: dict[int, list[int]] = {}
    for step in runs[name].steps():
        for freed in step["freed"]:
            assert freed["pages"] == last.pop(freed["request"])
            built.pop(freed["request"])
        for change in step["pages"]:
            built.setdefault(change["request"], []).extend(change["shared"] + change["assigned"])
        tables = {t["request"]: t["pages"] for t in step["pool"]["tables"]}
        assert tables == built
        last = tables


@pytest.mark.parametrize("name", SCENARIOS)
def test_sampled_tokens_are_each_requests_output(runs: dict[str, Run], name: str) -> None:
    r = runs[name]
    traced: dict[int, list[int]] = {rid: [] for rid in r.outputs}
    for step in r.steps():
        for s in step["sampled"]:
            assert not s["dropped"]
            traced[s["request"]].append(s["token"])
        for s in step["prefills"]:
            assert 0 <= s["start"] < s["end"]
    assert traced == r.outputs


def test_hand_computed_conservative_wait(runs: dict[str, Run]) -> None:
    """Requests 1 and 2 reserve 2 credits each of 5; request 3 (2 credits) waits for credits
    from step 0 until both finish by length: their prompts sample token 1 at step 0 and
    decodes give tokens 2..13 at steps 1..12, so request 3 is admitted at step 13."""
    steps = runs["conservative-tiny-pool"].steps()
    waits = [(s["step"], s["wait"]) for s in steps if s["wait"] is not None]
    assert waits == [(i, {"request": 3, "reason": "credits", "counted": True}) for i in range(13)]
    admitted = {a["request"]: s["step"] for s in steps for a in s["admitted"]}
    assert admitted == {1: 0, 2: 0, 3: 13}
    finished = {f["request"]: (s["step"], f["reason"]) for s in steps for f in s["finished"]}
    assert finished == {1: (12, "length"), 2: (12, "length"), 3: (25, "length")}
    assert steps[13]["freed"] == [
        {"request": 1, "pages": steps[12]["pool"]["tables"][0]["pages"]},
        {"request": 2, "pages": steps[12]["pool"]["tables"][1]["pages"]},
    ]


def test_static_batching_waits_for_the_whole_group(runs: dict[str, Run]) -> None:
    """Credits 3, 1, 3, 1 in a 6-page pool: requests 1 and 2 start; request 3 waits for
    credits at step 0, then for the group (request 2 stops at its 3rd token, step 2; request 1
    ends by length at its 6th, step 5); requests 3 and 4 start together at step 6."""
    steps = runs["static"].steps()
    admitted = {a["request"]: s["step"] for s in steps for a in s["admitted"]}
    finished = {f["request"]: (s["step"], f["reason"]) for s in steps for f in s["finished"]}
    assert admitted == {1: 0, 2: 0, 3: 6, 4: 6}
    assert finished[1] == (5, "length") and finished[2] == (2, "stop")
    waits = [(s["step"], s["wait"]["reason"]) for s in steps if s["wait"] is not None]
    assert waits == [(0, "credits")] + [(i, "static_group") for i in range(1, 6)]


def test_static_group_waits_are_named(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """A pool that holds one request at a time under static batching: the second group starts
    the step after the first has finished, and every step between is a static_group wait."""
    scenario = Scenario(
        config(num_pages=3, policy="static"), [prompt(30, 1), prompt(30, 2)], [4, 4]
    )
    steps = run(scenario, tokenizer, tmp_path / "t.jsonl").steps()
    admitted = {a["request"]: s["step"] for s in steps for a in s["admitted"]}
    finished = {f["request"]: s["step"] for s in steps for f in s["finished"]}
    assert admitted[2] == finished[1] + 1
    reasons = [s["wait"]["reason"] for s in steps if s["wait"] is not None]
    # step 0: request 2's credits (3 + 3 > 3 pages) do not fit; then the group is running
    assert reasons == ["credits"] + ["static_group"] * finished[1]


def test_preemptions_are_recorded_and_resumed(runs: dict[str, Run]) -> None:
    steps = runs["preemptive-tiny-pool"].steps()
    preempted = [rid for s in steps for rid in s["preempted"]]
    assert preempted, "the scenario must preempt"
    resumed = [a["request"] for s in steps for a in s["admitted"] if a["resumed"]]
    assert Counter(resumed) == Counter(preempted)
    assert {s["wait"]["reason"] for s in steps if s["wait"] is not None} <= {"pages"}
    for s in steps:
        for rid in s["preempted"]:
            assert rid not in {t["request"] for t in s["pool"]["tables"]} or any(
                a["request"] == rid for a in s["admitted"]
            )


def test_cancels_free_their_pages_at_the_next_plan(runs: dict[str, Run]) -> None:
    r = runs["cancels"]
    cancels = [rec["request"] for rec in r.records if rec["type"] == "cancel"]
    assert cancels == [1, 3]
    steps = r.steps()
    for step_no, rid in SCENARIOS["cancels"].cancel_after.items():
        held = {t["request"]: t["pages"] for t in steps[step_no]["pool"]["tables"]}
        assert {"request": rid, "pages": held[rid]} in steps[step_no + 1]["freed"]
    assert r.stats.cancelled_requests == 2


def test_shared_prefix_wait_then_shares_the_pages(runs: dict[str, Run]) -> None:
    """Request 2 starts with request 1's first 32 tokens: it waits (uncounted) while request 1
    computes those two pages, then starts on them."""
    steps = runs["shared-prefix"].steps()
    assert steps[0]["wait"] == {"request": 2, "reason": "shared_prefix", "counted": False}
    first = steps[0]["pool"]["tables"][0]["pages"]
    admitted = {a["request"]: (s["step"], a["cached_tokens"]) for s in steps for a in s["admitted"]}
    assert admitted[2] == (1, 32)
    change = next(c for c in steps[1]["pages"] if c["request"] == 2)
    assert change["shared"] == first[:2]
    tables = {t["request"]: t["pages"] for t in steps[1]["pool"]["tables"]}
    assert tables[2][:2] == first[:2]


def test_uncounted_waits(runs: dict[str, Run]) -> None:
    steps = runs["max-num-seqs"].steps()
    reasons = {s["wait"]["reason"] for s in steps if s["wait"] is not None}
    assert reasons == {"max_num_seqs"}
    assert runs["max-num-seqs"].stats.admission_waits == 0
    steps = runs["token-budget"].steps()
    # request 1's 40-token prompt takes the step's 16 tokens twice, then request 2 gets in
    assert [(c["request"], c["start"], c["end"]) for c in steps[0]["prefills"]] == [(1, 0, 16)]
    assert steps[0]["wait"] == {"request": 2, "reason": "token_budget", "counted": False}
    assert runs["token-budget"].stats.admission_waits == 0
