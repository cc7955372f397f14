"""Preemptive admission changes when requests run, never what they generate: on the CPU
reference (FP32, greedy), a pool small enough to preempt often gives the outputs of the
conservative policy, in both step loops, and every page comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from sv_engine import Engine, EngineError, SamplingParams

PROMPTS = [
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Name three colours.",
    "Translate 'good morning' into French, please, and explain the phrase in detail.",
    "Count from one to ten.",
    "Why is the sky blue?",
]


def outputs(tiny_llama_dir: Path, admission: str, overlap: bool) -> tuple[list[list[int]], Engine]:
    engine = Engine.from_model_dir(
        tiny_llama_dir,
        device="cpu",
        admission=admission,  # type: ignore[arg-type]
        kv_cache_mib=0.05,
        max_step_tokens=32,
        max_num_seqs=4,
    )
    engine.overlap = overlap
    params = [SamplingParams(max_new_tokens=24 + 6 * i, ignore_eos=True) for i in range(6)]
    ids = [engine.add_request(p, params[i]) for i, p in enumerate(PROMPTS)]
    tokens: dict[object, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for event in engine.step():
            if event.token_id is not None:
                tokens[event.request_id].append(event.token_id)
            if event.completion is not None:
                assert event.completion.output_ids == tokens[event.request_id]
    stats = engine.stats
    assert stats.free_pages == stats.pool_pages and stats.assigned_pages == 0
    return [tokens[rid] for rid in ids], engine


@pytest.mark.parametrize("overlap", [False, True])
def test_preemptive_outputs_equal_conservative(tiny_llama_dir: Path, overlap: bool) -> None:
    want, conservative = outputs(tiny_llama_dir, "conservative", overlap)
    got, preemptive = outputs(tiny_llama_dir, "preemptive", overlap)
    assert got == want
    assert [len(t) for t in got] == [24 + 6 * i for i in range(6)]
    assert conservative.stats.preemptions == 0 and conservative.stats.admission_waits > 0
    # The pool is tight enough that preemption really happened, with recompute.
    assert preemptive.stats.preemptions > 0 and preemptive.stats.recomputed_tokens > 0
    assert preemptive.stats.peak_running > conservative.stats.peak_running


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"policy": "bogus"}, "policy must be 'continuous' or 'static', got 'bogus'"),
        ({"admission": "bogus"}, "admission must be 'conservative' or 'preemptive', got 'bogus'"),
    ],
)
def test_scheduler_options_are_checked_before_the_model_folder(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    # A folder that does not exist: the option's error comes first, before any read.
    with pytest.raises(EngineError, match=message):
        Engine.from_model_dir(tmp_path / "nowhere", device="cpu", **options)  # type: ignore[arg-type]
