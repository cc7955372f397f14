"""Launch shapes of the paged decode attention kernel, on the GPU.

For Llama 3.2 1B's attention (32 query heads, 8 KV heads, head_dim 64, BF16 and FP8 pages), per
case of B sequences of C tokens: every combination of context splits, tokens per inner step,
warps and pipeline stages below, each timed as a replayed CUDA graph over input sets that
overflow L2, with the K/V bytes it reads per call as a fraction of the device-to-device copy
bandwidth measured in the same run. With --rounds N every shape is timed N times, each round on
new inputs (a new random page order), and the median is reported with the spread. Rounds in
one process agreed within about 1% (BENCHMARKS.md run 119), yet one shape can measure very
differently in another process (FP8 pages, 128-token steps, 64 x 4k: 109 us in run 117, 169 in
run 118): compare shapes within a run, and trust a choice only where separate runs agree.
Prints the best rows per case and the launch defaults' row (marked); what the defaults should
become is read off here. A split count, tile, warp or stage count of 0 is the kernel's own
choice for that case.

    python3 scripts/decode_attention_sweep.py        (on the GPU; PYTHONPATH as gpu-check.sh)
    python3 scripts/decode_attention_sweep.py --cases 1x384,256x1024 --splits 0 --tiles 0,128 \
        --warps 4 --stages 0,3                       (a narrower sweep)
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from functools import partial

import torch
from sv_kernels import graphs, triton_ops
from sv_kernels.reference import kv_pages

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 64, 16
CASES = ((1, 32768), (1, 100_000))
SPLITS = (32, 64, 128, 256)
TILES = (64, 128)
WARPS = (1, 2, 4)
STAGES = (0, 2, 3)
DEFAULT = (0, 0, 0, 0)  # (splits, tile, warps, stages): paged_decode_attention's defaults


def inputs(
    batch: int, context: int, dtype: torch.dtype, sets: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    per_sequence = math.ceil(context / PAGE)
    pages = batch * per_sequence
    out = []
    for _ in range(sets):
        # In the engine's pool layout (on CUDA, each page stored head by head).
        k = kv_pages((), pages, PAGE, KV_HEADS, HEAD_DIM, dtype, "cuda")
        v = kv_pages((), pages, PAGE, KV_HEADS, HEAD_DIM, dtype, "cuda")
        k.copy_(torch.randn(k.shape, device="cuda"))
        v.copy_(torch.randn(v.shape, device="cuda"))
        tables = torch.randperm(pages, device="cuda").view(batch, per_sequence).to(torch.int32)
        lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        out.append((q, k, v, tables, lens))
    return out


def copy_gbps() -> float:
    """Device-to-device copy bandwidth of 1 GiB, read plus written."""
    from triton.testing import do_bench

    src = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = float(do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median"))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def _cases(text: str) -> tuple[tuple[int, int], ...]:
    """'1x32768,256x1024' -> ((1, 32768), (256, 1024)): sequences x tokens each."""
    cases = []
    for part in text.split(","):
        batch, _, context = part.partition("x")
        if not context:
            raise argparse.ArgumentTypeError(f"a case is BATCHxCONTEXT, got {part!r}")
        cases.append((int(batch), int(context)))
    return tuple(cases)


def time_shape(
    shape: tuple[int, ...],
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    scale: float,
    scales: torch.Tensor | None,
) -> float | None:
    """ms per call of one launch shape over the input sets; None if it cannot be compiled."""
    splits, tile, warps, stages = shape
    fns = [
        partial(
            triton_ops.paged_decode_attention,
            q,
            k,
            v,
            tables,
            lens,
            scale,
            kv_scales=scales,
            num_splits=splits or None,
            tile_n=tile or None,
            num_warps=warps or None,
            num_stages=stages or None,
        )
        for q, k, v, tables, lens in sets
    ]
    try:
        return graphs.graph_ms_per_call(fns, 20, 50)
    except Exception as error:  # a shape the compiler refuses (shared memory)
        print(f"  {shape}: n/a ({type(error).__name__})")
        torch.cuda.synchronize()
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=_cases, default=CASES, help="e.g. 1x32768,256x1024")
    parser.add_argument("--splits", type=_ints, default=SPLITS, help="0: the kernel's choice")
    parser.add_argument(
        "--tiles", type=_ints, default=TILES, help="tokens per inner step; 0: default"
    )
    parser.add_argument("--warps", type=_ints, default=WARPS, help="0: default")
    parser.add_argument("--stages", type=_ints, default=STAGES, help="0: default")
    parser.add_argument("--dtypes", default="bf16,fp8", help="page types: bf16, fp8 or both")
    parser.add_argument("--rounds", type=int, default=1, help="timings per shape, new inputs each")
    args = parser.parse_args()
    copy = copy_gbps()
    print(f"copy bandwidth {copy:,.0f} GB/s")
    scale = HEAD_DIM**-0.5
    dtypes = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
    for name, (batch, context) in itertools.product(args.dtypes.split(","), args.cases):
        dtype = dtypes[name]
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * dtype.itemsize
        scales = torch.ones(2, KV_HEADS, device="cuda") if dtype != torch.bfloat16 else None
        shapes = list(itertools.product(args.splits, args.tiles, args.warps, args.stages))
        if DEFAULT not in shapes:  # always the defaults' row, to compare the others with
            shapes.append(DEFAULT)
        timings: dict[tuple[int, ...], list[float]] = {shape: [] for shape in shapes}
        for _ in range(args.rounds):
            sets = inputs(batch, context, dtype, max(2, min(8, math.ceil(2 * 60e6 / kv_bytes))))
            for shape in shapes:
                ms = time_shape(shape, sets, scale, scales)
                if ms is not None:
                    timings[shape].append(ms)
            del sets
        rows = [(statistics.median(ms), min(ms), max(ms), s) for s, ms in timings.items() if ms]
        rows.sort()
        print(f"== {name} KV, {batch} x {context} tokens: {kv_bytes / 1e6:.1f} MB of K/V per call")
        for ms, low, high, launch in rows[:6] + [r for r in rows[6:] if r[3] == DEFAULT]:
            splits, tile, warps, stages = launch
            frac = kv_bytes / (ms * 1e-3) / 1e9 / copy
            spread = f" ({low * 1e3:.1f}-{high * 1e3:.1f})" if args.rounds > 1 else ""
            print(
                f"  splits {splits or 'auto':>4} tile {tile or 'auto':>4} warps {warps or 'auto':>4} "
                f"stages {stages or 'auto':>4}: {ms * 1e3:7.1f} us{spread}  {frac:.2f} of copy"
                + ("  (default)" if launch == DEFAULT else "")
            )


if __name__ == "__main__":
    main()
