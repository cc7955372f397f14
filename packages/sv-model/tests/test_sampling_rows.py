"""SamplingRows' host-side filter flags: a superset of what the sampling kernels will use."""

from __future__ import annotations

from sv_model import SamplingRows


def rows(temperature: list[float], top_k: list[int], top_p: list[float]) -> SamplingRows:
    n = len(temperature)
    return SamplingRows(temperature, top_k, top_p, [0] * n, [0] * n)


def test_filters_of_greedy_rows_do_not_count() -> None:
    r = rows([0.0, -1.0], [50, 5], [0.5, 0.9])  # greedy rows ignore their filters
    assert r.all_greedy() and not r.any_top_k() and not r.any_top_p()


def test_each_filter_is_seen_on_a_sampled_row() -> None:
    r = rows([0.0, 0.8, 1.0], [0, 0, 40], [1.0, 1.0, 1.0])
    assert not r.all_greedy() and r.any_top_k() and not r.any_top_p()
    r = rows([0.7, 0.8], [0, 0], [1.0, 0.999])
    assert not r.any_top_k() and r.any_top_p()
    r = rows([0.7], [0], [1.5])  # top_p >= 1 is off
    assert not r.any_top_k() and not r.any_top_p()
