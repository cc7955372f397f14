"""Shared by the speculation tests: engines on one runner, and prompts prompt lookup feeds on."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import torch
from sv_engine import Completion, Engine, SamplingParams
from sv_scheduler import Scheduler, SpeculationConfig

VOCAB = 16


def engine_like(
    base: Engine, spec: SpeculationConfig | None, overlap: bool = True, **config: object
) -> Engine:
    """A fresh scheduler on `base`'s runner (its KV pool, at most as many pages)."""
    cfg = dataclasses.replace(base.scheduler.config, speculation=spec, **config)  # type: ignore[arg-type]
    engine = Engine(base.tokenizer, base.runner, Scheduler(cfg), base.stop_ids)
    engine.overlap = overlap
    return engine


def assert_all_back(engine: Engine) -> None:
    assert not engine.has_unfinished()
    s = engine.stats
    assert s.free_pages == s.pool_pages and s.assigned_pages == 0
    assert s.free_credits == s.pool_pages


def completions(
    engine: Engine, prompts: list[list[int]], params: list[SamplingParams]
) -> list[Completion]:
    """Every request queued at once, run to the end; completions in request order."""
    ids = [
        engine.add_request(p, q, stream_text=False) for p, q in zip(prompts, params, strict=True)
    ]
    done = {}
    while engine.has_unfinished():
        for e in engine.step():
            if e.completion is not None:
                done[e.request_id] = e.completion
    return [done[i] for i in ids]


def outputs(
    engine: Engine, prompts: list[list[int]], params: list[SamplingParams]
) -> list[tuple[list[int], str]]:
    return [(c.output_ids, c.finish_reason) for c in completions(engine, prompts, params)]


def pattern(seed: int, length: int) -> list[int]:
    """A prompt of repeated short motifs (what prompt lookup feeds on), from a seed."""
    g = torch.Generator().manual_seed(seed)
    motif = torch.randint(3, VOCAB, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
    noise = torch.randint(3, VOCAB, (length,), generator=g)
    keep = torch.rand(length, generator=g) < 0.8
    tokens = torch.where(keep, motif.repeat(length // len(motif) + 1)[:length], noise)
    return [1, *tokens.tolist()]


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df): the regularized upper incomplete gamma."""
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(x / 2.0)))


def assert_follows(
    seen: Counter[tuple[int, ...]], probability: Callable[[tuple[int, ...]], float], draws: int
) -> None:
    """A chi-square test that `draws` outputs counted in `seen` follow `probability`. Cells:
    every output expected 5 times or more; the rest pooled into one cell."""
    expected = {seq: draws * probability(seq) for seq in seen}
    cells = [seq for seq, e in expected.items() if e >= 5]
    rest_expected = draws - sum(expected[c] for c in cells)
    rest_seen = draws - sum(seen[c] for c in cells)
    stat = sum((seen[c] - expected[c]) ** 2 / expected[c] for c in cells)
    df = len(cells) - 1
    if rest_expected >= 5:
        stat += (rest_seen - rest_expected) ** 2 / rest_expected
        df += 1
    assert df >= 4
    assert chi2_sf(stat, df) > 1e-3, (stat, df)
