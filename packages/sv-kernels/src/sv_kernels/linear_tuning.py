"""Each CUDA weight's `LinearPlan`, chosen by timing the candidates on this GPU.

Whether a Triton kernel beats cuBLAS depends on the shape and the chip, so nothing assumes it
does. For each distinct weight shape the tuner times, as the decode step runs them (graph
replays over copies of the weight that overflow L2):

- at one row, cuBLAS against every batch-1 GEMV tile (`triton_ops.gemv.candidates`);
- for a quantized weight, at each of TUNED_ROWS (one per row band of its plan), every path
  `ops.linear` can take without a GEMV tile (dequantize + cuBLAS, the 8-bit-weight matmul, FP8
  tensor cores: `quantized_ops.PATH_CALLS`);
- for an unquantized weight, at FEW_ROWS rows, cuBLAS against every few-row tile
  (`triton_ops.few_rows`).

The fastest of each goes into the weight's plan, which its owner keeps and passes to
`ops.linear`. Results are kept on disk per GPU and software (`tuning_cache`,
`tuning_fingerprint`), so a later process times nothing it already knows.

This module sits above the kernels (it times the dispatch layer's paths), so importing it
imports triton: `ops.tune_linear` imports it only when a CUDA weight arrives.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
import triton

from . import tuning_cache
from .graphs import copies_to_overflow_l2, graph_ms_per_call
from .linear_plan import (
    FEW_ROWS,
    MANY_ROWS,
    QUANTIZED_PATHS,
    W8A16_MAX_ROWS,
    FewRowsTile,
    GemvTile,
    LinearPlan,
    QuantizedPath,
    TunedLinear,
)
from .quantized import LinearWeight, QuantizedWeight
from .quantized_ops import PATH_CALLS, W8A16_DTYPES, dequantized_linear, scaled_mm_fits
from .triton_ops import few_rows
from .triton_ops.gemv import CONFIGS, QUANTIZED_CONFIGS, candidates, gemv
from .triton_ops.w8a16 import TILES as W8A16_TILES

Tile = TypeVar("Tile", GemvTile, FewRowsTile)


def tune(
    weights: list[LinearWeight],
    cache: tuning_cache.TuningCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TunedLinear]:
    """One `TunedLinear` per CUDA weight, in order: its batch-1 GEMV tile and quantized paths
    (`tune_gemv`), and for an unquantized weight its few-row tile (`tune_few_rows`)."""
    if not weights:
        return []
    tuned = tune_gemv(weights, cache, progress)
    plain = [(i, w) for i, w in enumerate(weights) if not isinstance(w, QuantizedWeight)]
    fingerprint = tuning_fingerprint(weights[0].device)
    few = tune_few_rows([w for _, w in plain], cache, fingerprint, progress)
    for (i, _), (tile, summary) in zip(plain, few, strict=True):
        plan = dataclasses.replace(tuned[i].plan, few_rows=tile)
        tuned[i] = TunedLinear(plan, f"{tuned[i].summary}; {summary}")
    return tuned


# Tuning replays each candidate from a CUDA graph, as the decode step runs it: timing eager
# calls measured the host's launch cost too, which on a slow host made cuBLAS (a cheaper launch
# from Python) "win" shapes where its kernel is the slower one. Each replay makes
# _TUNE_CALLS calls over enough copies of the weight to overflow L2, as a decode step, which
# streams 2.5 GB of weights, sees them: from DRAM.
_TUNE_CALLS = 20


def tune_gemv(
    weights: list[LinearWeight],
    cache: tuning_cache.TuningCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TunedLinear]:
    """Time cuBLAS and every candidate tile (`candidates`) on each distinct weight shape; one
    result per weight.

    cache: a `tuning_cache` file. Shapes it holds for this GPU and software (see
    `tuning_fingerprint`) are not timed again, unless `cache.retune`; shapes timed here are
    added to it. `progress` hears one line before the first shape that has to be timed (a few
    seconds in all). Weights of one shape share one result. Remembers nothing itself.

    A quantized weight is also timed on each path of `_quantized_paths` (dequantize + cuBLAS,
    the 8-bit-weight matmul, FP8 tensor cores) at each of TUNED_ROWS, for its plan's
    `quantized_few_rows`, `quantized_many_rows` and `quantized_prompt_rows` (each kept under a
    cache key of its own).

    Must not run while a CUDA graph is being captured (it synchronizes and captures graphs of
    its own).
    """
    if not weights:
        return []
    fingerprint = tuning_fingerprint(weights[0].device)
    kept = {}
    if cache is not None and not cache.retune:
        kept = tuning_cache.load(cache.path, fingerprint)
    measured: dict[str, tuning_cache.TunedShape] = {}
    by_shape: dict[str, TunedLinear] = {}

    def announce(what: str) -> None:  # one progress line, before the first timing of any kind
        if progress is not None and not measured:
            where = f" (kept in {cache.path})" if cache is not None else ""
            progress(f"timing {what} against cuBLAS{where}")

    for w in weights:
        shape = _shape_key(w)
        if shape in by_shape:  # a second matrix of a shape already done
            continue
        tuned = kept.get(shape)
        tiles = candidates(w)
        if tuned is not None and tuned.choice is not None and tuned.choice not in tiles:
            tuned = None  # not a candidate of this code (a hand-edited file): time it
        source = "kept from the tuning cache"
        if tuned is None:
            announce("the batch-1 GEMV tiles")
            cublas, best, best_ms = _time_candidates(w)
            tuned = measured[shape] = tuning_cache.TunedShape(best, best_ms * 1e3, cublas * 1e3)
            source = "measured"
        tile = None if tuned.choice is None else tiles[tiles.index(tuned.choice)]
        name = "cuBLAS" if tile is None else f"triton gemv {tile}"
        summary = f"{name}: {tuned.us:.1f} us (cuBLAS {tuned.cublas_us:.1f} us), {source}"
        paths: dict[int, QuantizedPath] = dict.fromkeys(TUNED_ROWS, "cublas")
        if isinstance(w, QuantizedWeight) and _quantized_paths(w, FEW_ROWS) != ["cublas"]:
            for rows in paths:
                key = f"{shape}, {rows} rows"
                timed = kept.get(key)
                if timed is None or _quantized_path(timed.choice) not in _quantized_paths(w, rows):
                    announce("the quantized weights' paths")
                    timed = measured[key] = _time_quantized_paths(w, rows)
                paths[rows] = _quantized_path(timed.choice)
                summary += (
                    f"; at {rows} rows {paths[rows]}: {timed.us:.1f} us "
                    f"(dequantize + cuBLAS {timed.cublas_us:.1f} us)"
                )
        plan = LinearPlan(
            one_row_gemv=tile,
            quantized_few_rows=paths[FEW_ROWS],
            quantized_many_rows=paths[MANY_ROWS],
            quantized_prompt_rows=paths[PROMPT_ROWS],
        )
        by_shape[shape] = TunedLinear(plan, summary)
    if cache is not None and measured:
        tuning_cache.store(cache.path, fingerprint, measured)
    return [by_shape[_shape_key(w)] for w in weights]


def _shape_key(w: LinearWeight) -> str:
    """A weight shape as the tuning cache names it: "3072x2048 torch.bfloat16", or for a
    quantized one "3072x2048 torch.float8_e4m3fn per-row scales -> torch.bfloat16"."""
    if isinstance(w, QuantizedWeight):
        return f"{w.shape[0]}x{w.shape[1]} {w.data.dtype} per-row scales -> {w.dtype}"
    return f"{w.shape[0]}x{w.shape[1]} {w.dtype}"


# The row counts at which a quantized weight's paths are timed, one per band of its plan: the
# most rows of the few-row and many-row bands, and for the prompt-row band a quarter of a
# step's default token budget (its choice held at 2,048 and 8,192 rows alike: BENCHMARKS.md
# run 152).
PROMPT_ROWS = 2048
TUNED_ROWS = (FEW_ROWS, MANY_ROWS, PROMPT_ROWS)


def _fp8_tensor_cores(device: torch.device) -> bool:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= (8, 9)


def _cublas(x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):
        return dequantized_linear(x, w)
    return torch.nn.functional.linear(x, w)


def _gemv_call(x: torch.Tensor, w: LinearWeight, config: GemvTile) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):
        return gemv(x, w.data, config, scale=w.scale)
    return gemv(x, w, config)


def _quantized_paths(w: QuantizedWeight, rows: int) -> list[QuantizedPath]:
    """The paths `ops.linear` can take for a call of w on its device with `rows` rows that no
    GEMV tile takes."""
    paths: list[QuantizedPath] = ["cublas"]
    if scaled_mm_fits(w) and _fp8_tensor_cores(w.device):
        paths += ["scaled_mm", "scaled_mm_tensorwise"]
    # the dtype of the activations it will meet, and no more rows than it takes
    if w.dtype in W8A16_DTYPES and rows <= W8A16_MAX_ROWS:
        paths.append("w8a16")
    return paths


def _quantized_path(choice: tuple[int, ...] | None) -> QuantizedPath:
    """A kept choice as a path: None is cuBLAS, (i,) the i-th of QUANTIZED_PATHS (an index
    past the list, from a hand-edited file, reads as cuBLAS and is timed again)."""
    if choice is None or len(choice) != 1 or not 0 < choice[0] < len(QUANTIZED_PATHS):
        return "cublas"
    return QUANTIZED_PATHS[choice[0]]


def _time_quantized_paths(w: QuantizedWeight, rows: int) -> tuning_cache.TunedShape:
    """Every path of `_quantized_paths(w, rows)` at `rows` rows: the fastest path's index in
    QUANTIZED_PATHS as the choice, None when dequantize + cuBLAS wins."""
    copies = copies_to_overflow_l2(w)
    x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
    times = {
        path: graph_ms_per_call(
            [functools.partial(PATH_CALLS[path], x, c) for c in copies], _TUNE_CALLS
        )
        for path in _quantized_paths(w, rows)
    }
    best = min(times, key=lambda path: times[path])
    choice = None if best == "cublas" else (QUANTIZED_PATHS.index(best),)
    return tuning_cache.TunedShape(choice, times[best] * 1e3, times["cublas"] * 1e3)


def tuning_fingerprint(device: torch.device) -> str:
    """What a kept tuning result is valid for: this GPU model, these torch and Triton versions
    and these candidate lists (their hash; the few-row tiles' too, kept in the same file)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    lists = (
        CONFIGS,
        QUANTIZED_CONFIGS,
        few_rows.CONFIGS,
        QUANTIZED_PATHS,
        W8A16_TILES,
    )
    configs = hashlib.sha256(repr(lists).encode()).hexdigest()[:8]
    return (
        f"{torch.cuda.get_device_name(index)} (sm {major}.{minor}), torch {torch.__version__}, "
        f"triton {triton.__version__}, configs {configs}"
    )


@dataclass(frozen=True)
class GemvTimes:
    """One weight shape's batch-1 timings: cuBLAS (on the matrix dequantized, for a quantized
    weight) and every candidate tile, in ms per call."""

    cublas_ms: float
    tiles: dict[GemvTile, float]

    def best(self) -> tuple[GemvTile | None, float]:
        """The fastest tile and its ms, or (None, cuBLAS's ms) when no tile beats cuBLAS."""
        return _fastest(self.cublas_ms, self.tiles)


def _fastest(cublas_ms: float, tiles: Mapping[Tile, float]) -> tuple[Tile | None, float]:
    """The fastest of `tiles` (ms per call) and its ms, or (None, cublas_ms) when none is
    faster than cuBLAS; the first of equal times."""
    best: tuple[Tile | None, float] = (None, cublas_ms)
    for tile, ms in tiles.items():
        if ms < best[1]:
            best = (tile, ms)
    return best


def time_gemv_tiles(w: LinearWeight) -> GemvTimes:
    """Time cuBLAS and every candidate tile of `candidates(w)` on weight w, as the tuner does:
    graph replays over enough copies of w to overflow L2. Must not run while a CUDA graph is
    being captured."""
    copies = copies_to_overflow_l2(w)
    x = torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device)
    calls = [functools.partial(_cublas, x, c) for c in copies]
    cublas = graph_ms_per_call(calls, _TUNE_CALLS)
    tiles = {}
    for config in candidates(w):
        calls = [functools.partial(_gemv_call, x, c, config) for c in copies]
        tiles[config] = graph_ms_per_call(calls, _TUNE_CALLS)
    return GemvTimes(cublas, tiles)


def _time_candidates(w: LinearWeight) -> tuple[float, GemvTile | None, float]:
    """(cuBLAS ms, the best config or None if cuBLAS won, its ms) per call, for weight w (a
    quantized one: cuBLAS on it dequantized, as `ops.linear` would run it without a tile)."""
    times = time_gemv_tiles(w)
    best, best_ms = times.best()
    return times.cublas_ms, best, best_ms


def tune_few_rows(
    weights: list[torch.Tensor],
    cache: tuning_cache.TuningCache | None = None,
    fingerprint: str = "",
    progress: Callable[[str], None] | None = None,
) -> list[tuple[FewRowsTile | None, str]]:
    """For each weight: the fastest tile at FEW_ROWS rows, or None where cuBLAS is faster, and a
    line saying so. Shapes kept in `cache` under `fingerprint` are not timed again (unless
    `cache.retune`); the counters of every chosen tile are made here, so the calls can be
    captured afterwards. Must not run during a graph capture."""
    kept = {}
    if cache is not None and not cache.retune:
        kept = tuning_cache.load(cache.path, fingerprint)
    measured: dict[str, tuning_cache.TunedShape] = {}
    by_key: dict[str, tuple[FewRowsTile | None, str]] = {}
    for w in weights:
        key = _few_rows_shape_key(w)
        if key in by_key:
            continue
        tuned = kept.get(key)
        source = "kept from the tuning cache"
        if tuned is None or (tuned.choice is not None and tuned.choice not in few_rows.CONFIGS):
            if progress is not None and not measured:
                progress(f"timing the {FEW_ROWS}-row linear tiles against cuBLAS")
            tuned = measured[key] = _time_few_rows_tiles(w)
            source = "measured"
        tile = (
            None if tuned.choice is None else few_rows.CONFIGS[few_rows.CONFIGS.index(tuned.choice)]
        )
        if tile is not None:
            few_rows.prepare_counters(w, tile, swiglu=False)
            few_rows.prepare_counters(w, tile, swiglu=True)
        name = "cuBLAS" if tile is None else f"triton {tile}"
        by_key[key] = (
            tile,
            f"at {FEW_ROWS} rows {name}: {tuned.us:.1f} us (cuBLAS {tuned.cublas_us:.1f} us), {source}",
        )
    if cache is not None and measured:
        tuning_cache.store(cache.path, fingerprint, measured)
    return [by_key[_few_rows_shape_key(w)] for w in weights]


def _few_rows_shape_key(w: torch.Tensor) -> str:
    """A weight shape as the tuning cache names its few-row entry: "2048x2048 torch.bfloat16,
    16 rows" (the batch-1 GEMV's entry for the shape lacks the rows)."""
    return f"{w.shape[0]}x{w.shape[1]} {w.dtype}, {FEW_ROWS} rows"


def time_few_rows_tiles(
    w: torch.Tensor, rows: int = FEW_ROWS, tiles: tuple[FewRowsTile, ...] = few_rows.CONFIGS
) -> tuple[float, dict[FewRowsTile, float]]:
    """cuBLAS's ms per call and each tile's (the candidates unless given), at `rows` rows of x,
    graph-replayed over copies of w that overflow L2. Must not run during a graph capture."""
    copies = copies_to_overflow_l2(w)
    x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
    cublas = graph_ms_per_call(
        [functools.partial(torch.nn.functional.linear, x, c) for c in copies], _TUNE_CALLS
    )
    times = {}
    for tile in tiles:
        few_rows.prepare_counters(w, tile)
        calls = [functools.partial(few_rows.few_rows_linear, x, c, tile) for c in copies]
        times[tile] = graph_ms_per_call(calls, _TUNE_CALLS)
    return cublas, times


def _time_few_rows_tiles(w: torch.Tensor) -> tuning_cache.TunedShape:
    cublas, tiles = time_few_rows_tiles(w)
    tile, ms = _fastest(cublas, tiles)
    return tuning_cache.TunedShape(tile, ms * 1e3, cublas * 1e3)
