"""`sv bench --only tp --tensor-parallel-size N`: decode-b1 and throughput with the model split
over N GPUs, beside the same workloads on one GPU, in one run.

Each engine is loaded, measured and closed before the next (rank 0 shares GPU 0 with the
one-GPU engine, and a process belongs to one process group at a time). The decode-b1
roofline is rank 0's weight bytes per token over one GPU's copy bandwidth: every rank reads
its own slice at once, so the all-reduces (two per layer) are what the measured rate loses
against it. If capturing the decode graphs with their all-reduces fails on this machine, the
TP rows are measured without CUDA graphs and say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def bench_tensor_parallel(
    report: Any, model_dir: Path, roof: dict[str, float], size: int, quick: bool
) -> None:
    from sv_cli.bench.inputs import bench_engine
    from sv_cli.bench.report import Row
    from sv_cli.bench.timing import free_device_memory
    from sv_cli.bench.workloads import bench_decode_b1, bench_throughput

    rates: dict[int, float] = {}
    for n in (1, size):
        engine, graphs = _open(bench_engine, model_dir, n)
        tag = f" [tp={n}{'' if graphs else ', no CUDA graphs'}]"
        try:
            bench_decode_b1(report, engine, roof, 64 if quick else 256, tag)
            rates[n] = next(row.value for row in report.rows if row.name == "decode-b1" + tag)
            count = 32 if quick else 256
            bench_throughput(report, engine, "throughput" + tag, count, False, 64 if quick else 512)
        finally:
            _close(engine)
            del engine
            free_device_memory()
    report.add(Row(f"decode-b1 tp={size} / tp=1", rates[size] / rates[1], "x", None, "same run"))


def _open(open_engine: Any, model_dir: Path, size: int) -> tuple[Any, bool]:
    """The engine at `size` ranks, and whether it runs CUDA graphs."""
    from sv_engine import EngineError

    if size == 1:
        return open_engine(model_dir, max_num_seqs=256), True
    try:
        return open_engine(model_dir, max_num_seqs=256, tensor_parallel_size=size), True
    except (EngineError, RuntimeError) as e:
        print(f"[bench] tp={size} with CUDA graphs failed ({e}); again without", flush=True)
    return (
        open_engine(model_dir, max_num_seqs=256, tensor_parallel_size=size, use_cuda_graphs=False),
        False,
    )


def _close(engine: Any) -> None:
    from sv_engine.rank_steps import LeaderRunner

    if isinstance(engine.runner, LeaderRunner):
        engine.runner.close()
