"""Batch-1 GEMV tiles chosen inside the decode step, against the tuner's choice (GPU only).

The tuner (`sv_kernels.linear_tuning.tune_gemv`) times each matrix's tiles alone: 20 calls
of one plain GEMV back to back, each starting its weight loads under the previous call's tail
(PDL). In a decode step every GEMV follows a different kernel: q/k/v (with its RoPE and cache
write epilogue) an RMSNorm, o the split merge after the attention, gate/up a norm, down the
gate/up GEMV. What a tile loads before its PDL wait, and how long its tail runs into the next
kernel, then overlap other work than the tuner saw. This script times the whole batch-1 step
as `sv bench`'s "decode step GPU time" row does (20 graph replays back to back, the best of
three), with one matrix class's tile (every layer's) swapped for each candidate and for
cuBLAS, class after class, `--passes` times over, keeping each class's fastest (coordinate
descent), and prints the tuned step, every swap's time and the best plan found.

    python3 scripts/gemv_tiles_in_step.py [--modes fp8,int8,bf16] [--passes 1]
        (on the GPU; PYTHONPATH as gpu-check.sh; SV_TOKENIZER_DIR or --tokenizer-dir)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import torch
from sv_cli.bench.inputs import bench_engine, prepare_checkpoint, scratch_decode_step
from sv_cli.bench.runner import decode_replay
from sv_cli.bench.timing import replayed_ms
from sv_kernels.linear_plan import GemvTile
from sv_kernels.triton_ops.gemv import candidates
from sv_model import ModelRunner
from sv_model.decode_graphs import DecodeGraphs
from sv_model.linear_plans import LinearPlans

CLASSES = ("qkv", "o", "gate_up", "down", "lm_head")


def with_tile(plans: LinearPlans, name: str, tile: GemvTile | None) -> LinearPlans:
    """`plans` with every matrix of class `name` on GEMV tile `tile` (None: cuBLAS)."""
    if name == "lm_head":
        return dataclasses.replace(
            plans, lm_head=dataclasses.replace(plans.lm_head, one_row_gemv=tile)
        )
    layers = tuple(
        dataclasses.replace(
            layer, **{name: dataclasses.replace(getattr(layer, name), one_row_gemv=tile)}
        )
        for layer in plans.layers
    )
    return dataclasses.replace(plans, layers=layers)


def tile_of(plans: LinearPlans, name: str) -> GemvTile | None:
    plan = plans.lm_head if name == "lm_head" else getattr(plans.layers[0], name)
    return plan.one_row_gemv


def step_us(runner: ModelRunner, plans: LinearPlans) -> float:
    """The batch-1 decode step's GPU time (µs) with `plans`, in a graph captured for them (a
    captured graph keeps the kernels it was captured with)."""
    runner.model.linear_plans = plans
    runner.decode_graphs = DecodeGraphs(
        runner._decode_forward, runner.last_ids, runner.scratch_table_row, 1
    )
    replay = decode_replay(runner, scratch_decode_step(runner, 1))
    return min(replayed_ms(replay) for _ in range(3)) * 1e3


def sweep(model_dir: Path, mode: str, passes: int) -> None:
    quantization = None if mode == "bf16" else mode
    engine = bench_engine(model_dir, max_num_seqs=1, kv_cache_mib=256, quantization=quantization)
    runner = engine.runner
    weights = runner.model.weights
    tuned: LinearPlans = runner.model.linear_plans
    matrices = {name: getattr(weights.layers[0], name) for name in CLASSES[:-1]}
    matrices["lm_head"] = weights.lm_head
    base = step_us(runner, tuned)
    print(
        f"[{mode}] tuned plans: step {base:.1f} us; tiles "
        + ", ".join(f"{name} {tile_of(tuned, name)}" for name in CLASSES),
        flush=True,
    )
    best, best_us = tuned, base
    for p in range(passes):
        for name in CLASSES:
            options: list[GemvTile | None] = [None, *candidates(matrices[name])]
            times = {}
            for tile in options:
                times[tile] = step_us(runner, with_tile(best, name, tile))
            pick = min(times, key=lambda t: times[t])
            shown = "  ".join(
                f"{t}:{us:.1f}" for t, us in sorted(times.items(), key=lambda kv: kv[1])
            )
            print(f"[{mode}] pass {p + 1} {name:8s} {shown}  (cuBLAS is None)", flush=True)
            if times[pick] < best_us:
                best, best_us = with_tile(best, name, pick), times[pick]
    again = step_us(runner, tuned)
    found = step_us(runner, best)
    print(
        f"[{mode}] RESULT tuned {base:.1f} / {again:.1f} us, best found {found:.1f} us "
        f"({found - again:+.1f}); tiles "
        + ", ".join(f"{name} {tile_of(best, name)}" for name in CLASSES),
        flush=True,
    )
    del engine, runner, weights
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="fp8,int8,bf16", help="fp8, int8, bf16")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/sv-bench"))
    parser.add_argument("--tokenizer-dir", type=Path, default=os.environ.get("SV_TOKENIZER_DIR"))
    args = parser.parse_args()
    model_dir = prepare_checkpoint(args.workdir, args.tokenizer_dir)
    for mode in args.modes.split(","):
        sweep(model_dir, mode, args.passes)


if __name__ == "__main__":
    main()
