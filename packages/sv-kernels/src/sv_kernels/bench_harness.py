"""The harness of `sv_kernels.bench`: the shapes to measure, one timed row, and `Bench`, which
times an op (do_bench, then a CUDA graph when the op is launch-bound; see bench.py's module
doc), derives its bandwidth and prints the row. Every section of the benchmark (bench.py,
bench_gemv.py) records its rows through it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sv_kernels import graphs

GRAPH_BELOW_MS = 0.5
GRAPH_CALLS = 20
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Shapes:
    """What to measure. The defaults are Llama 3.2 1B serving shapes."""

    hidden: int = 2048
    inter: int = 8192
    vocab: int = 128256
    hq: int = 32
    hkv: int = 8
    head_dim: int = 64
    norm_tokens: tuple[int, ...] = (256, 8192)
    swiglu_tokens: tuple[int, ...] = (256, 8192)
    embed_tokens: int = 256
    rope_tokens: tuple[tuple[int, str], ...] = (
        (256, "decode"),
        (2048, "prefill"),
        (8192, "prefill chunk"),  # the engine's default max_step_tokens
    )
    rope_pool_pages: int = 16384  # a 256k-token pool: 268 MB per cache
    decode: tuple[tuple[int, int], ...] = ((256, 1024), (1, 8192), (1, 32768))
    prefill_len: int = 2048
    sample_batches: tuple[int, ...] = (1, 256)
    copy_bytes: int = 2**30
    layers: int = 16  # decoder layers: the GEMV sweep's per-token sum
    gemv_tiles: int | None = None  # the sweep's first N candidate tiles only (None: all)


SERVING = Shapes()
SMOKE = Shapes(
    hidden=64,
    inter=96,
    vocab=300,
    hq=4,
    hkv=2,
    head_dim=32,
    norm_tokens=(3,),
    swiglu_tokens=(3,),
    embed_tokens=3,
    rope_tokens=((4, "decode"), (32, "prefill")),
    rope_pool_pages=8,
    decode=((2, 64), (1, 256)),
    prefill_len=40,
    sample_batches=(2,),
    copy_bytes=2**20,
    layers=2,
    gemv_tiles=1,  # the interpreter takes seconds per tile
)


@dataclass
class Row:
    op: str
    shape: str
    impl: str
    ms: float | None = None
    bytes: int | None = None
    gbps: float | None = None
    frac_copy: float | None = None
    tflops: float | None = None
    eager_ms: float | None = None  # set when `ms` is a graph replay's (see the module doc)
    note: str = ""


class Bench:
    def __init__(self, device: torch.device, shapes: Shapes, quick: bool) -> None:
        self.device = device
        self.shapes = shapes
        self.rep_ms = 40 if quick else 100
        self.copy_gbps: float | None = None
        self.rows: list[Row] = []

    def time_ms(self, fn: Callable[[], object]) -> float:
        if self.device.type != "cuda":  # --smoke without a GPU: one wall-clock run will do
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        fn()  # compile / warm up outside the timing
        import triton.testing

        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=10, rep=self.rep_ms, return_mode="median"))

    def time_graph_ms(self, fn_sets: Sequence[Callable[[], object]]) -> float | None:
        """Per-call time of GRAPH_CALLS calls (rotating over `fn_sets`) replayed as one CUDA graph.

        None when the op cannot be captured (a host sync inside, say): the eager time stands.
        """
        try:
            return graphs.graph_ms_per_call(fn_sets, GRAPH_CALLS, self.rep_ms)
        except Exception:  # not capturable (a host sync inside): the eager time stands
            torch.cuda.synchronize()
            return None

    def sets_for(self, nbytes: int) -> int:
        """Input sets to rotate so that together they exceed L2 twice over (at most 16)."""
        return graphs.sets_to_overflow_l2(nbytes, self.device)

    def randn(self, *shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=torch.float32).to(dtype)

    def sms(self) -> int:
        from sv_kernels.triton_ops._common import num_sms

        return num_sms(self.device)

    def add(
        self,
        op: str,
        shape: str,
        impl: str,
        fn_sets: Sequence[Callable[[], object]],
        nbytes: int,
        flops: float | None = None,
    ) -> None:
        """Time `fn_sets` (one closure per input set, called in rotation) and record a row."""
        row = Row(op, shape, impl, bytes=nbytes)
        try:
            counter = [0]

            def rotating() -> object:
                counter[0] += 1
                return fn_sets[counter[0] % len(fn_sets)]()

            ms = self.time_ms(rotating)
            # The torch references stay eager: some synchronize with the host (boolean
            # indexing), and a capture that fails that way leaves torch's CUDA generator
            # unusable for the rest of the process ("Offset increment outside graph capture",
            # torch 2.11, 2026-11-30), which broke the engine benchmarks that follow.
            if self.device.type == "cuda" and ms < GRAPH_BELOW_MS and impl != "torch-ref":
                graph_ms = self.time_graph_ms(fn_sets)
                if graph_ms is not None:
                    row.eager_ms, ms = ms, graph_ms
            row.ms = ms
            if flops is not None:
                row.tflops = flops / (ms * 1e-3) / 1e12
        except Exception as error:  # a failing measurement must not end the run
            row.note = f"n/a: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        self.record(row)

    def record(self, row: Row) -> None:
        """Keep and print a row; a timed one (ms and bytes set) gets its bandwidth, also as a
        fraction of the copy bandwidth."""
        if row.ms is not None and row.bytes is not None:
            row.gbps = row.bytes / (row.ms * 1e-3) / 1e9
            if self.copy_gbps:
                row.frac_copy = row.gbps / self.copy_gbps
        self.rows.append(row)
        print(format_row(row), flush=True)


def format_row(row: Row) -> str:
    def num(value: float | None, fmt: str) -> str:
        return format(value, fmt) if value is not None else "-"

    us = row.ms * 1e3 if row.ms is not None else None
    timing = f"graph (eager {row.eager_ms * 1e3:.1f} us)" if row.eager_ms is not None else ""
    return (
        f"{row.op:<18} {row.shape:<26} {row.impl:<34} {num(us, '10.1f')} us "
        f"{num(row.gbps, '8.0f')} GB/s {num(row.frac_copy, '5.2f')} "
        f"{num(row.tflops, '6.1f')} TF/s  {timing}{row.note}"
    )


def print_table(rows: list[Row], copy_gbps: float | None) -> None:
    print()
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s" if copy_gbps else "copy bandwidth: n/a")
    print(f"{'op':<18} {'shape':<26} {'impl':<34} {'time':>13} {'bandwidth':>13} {'/copy':>5}")
    for row in rows:
        print(format_row(row))
