"""Launch shapes of the paged decode attention kernel at batch 1 and long contexts, on the GPU.

For Llama 3.2 1B's attention (32 query heads, 8 KV heads, head_dim 64, BF16 and FP8 pages) at
32k and 100k tokens of context: every combination of context splits, tokens per inner
step, warps and pipeline stages below, each timed as a replayed CUDA graph over input sets
that overflow L2, with the K/V bytes it reads per call as a fraction of the device-to-device
copy bandwidth measured in the same run. Prints the current default's row and the best rows
per context; what `choose_num_splits` and the launch defaults should become is read off here.

    python3 scripts/decode_attention_sweep.py        (on the GPU; PYTHONPATH as gpu-check.sh)
    python3 scripts/decode_attention_sweep.py --contexts 384,4096 --splits 4,64 --tiles 128 \
        --warps 4 --stages 3                         (a narrower sweep)
"""

from __future__ import annotations

import argparse
import itertools
import math
from functools import partial

import torch
from sv_kernels import graphs, triton_ops

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 64, 16
CONTEXTS = (32768, 100_000)
SPLITS = (32, 64, 128, 256)
TILES = (64, 128)
WARPS = (4, 8)
STAGES = (2, 3)


def inputs(
    context: int, dtype: torch.dtype, sets: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    pages = math.ceil(context / PAGE)
    out = []
    for _ in range(sets):
        k = torch.randn(pages, PAGE, KV_HEADS, HEAD_DIM, device="cuda").to(dtype)
        v = torch.randn(pages, PAGE, KV_HEADS, HEAD_DIM, device="cuda").to(dtype)
        tables = torch.randperm(pages, device="cuda").view(1, pages).to(torch.int32)
        lens = torch.full((1,), context, dtype=torch.int32, device="cuda")
        q = torch.randn(1, Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=_ints, default=CONTEXTS, help="comma-separated tokens")
    parser.add_argument("--splits", type=_ints, default=SPLITS)
    parser.add_argument("--tiles", type=_ints, default=TILES, help="tokens per inner step")
    parser.add_argument("--warps", type=_ints, default=WARPS)
    parser.add_argument("--stages", type=_ints, default=STAGES)
    args = parser.parse_args()
    copy = copy_gbps()
    print(f"copy bandwidth {copy:,.0f} GB/s")
    scale = HEAD_DIM**-0.5
    for dtype, context in itertools.product((torch.bfloat16, torch.float8_e4m3fn), args.contexts):
        kv_bytes = 2 * context * KV_HEADS * HEAD_DIM * (1 if dtype != torch.bfloat16 else 2)
        sets = inputs(context, dtype, max(2, min(8, math.ceil(2 * 60e6 / kv_bytes))))
        scales = torch.ones(2 * KV_HEADS, device="cuda") if dtype != torch.bfloat16 else None
        default_splits = triton_ops.choose_num_splits(1, KV_HEADS, context, 132)
        rows = []
        for splits, tile, warps, stages in itertools.product(
            args.splits, args.tiles, args.warps, args.stages
        ):
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
                    num_splits=splits,
                    tile_n=tile,
                    num_warps=warps,
                    num_stages=stages,
                )
                for q, k, v, tables, lens in sets
            ]
            try:
                ms = graphs.graph_ms_per_call(fns, 20, 50)
            except Exception as error:  # a shape the compiler refuses (shared memory)
                print(f"  {splits} {tile} {warps} {stages}: n/a ({type(error).__name__})")
                torch.cuda.synchronize()
                continue
            rows.append((ms, splits, tile, warps, stages))
        rows.sort()
        name = "bf16" if dtype == torch.bfloat16 else "fp8"
        print(f"== {name} KV, context {context}: {kv_bytes / 1e6:.1f} MB of K/V per call")
        for ms, splits, tile, warps, stages in rows[:5] + [
            r for r in rows if r[1:] == (default_splits, 64, 4, 3)
        ]:
            frac = kv_bytes / (ms * 1e-3) / 1e9 / copy
            mark = (
                "  (default)" if (splits, tile, warps, stages) == (default_splits, 64, 4, 3) else ""
            )
            print(
                f"  splits {splits:>3} tile {tile:>3} warps {warps} stages {stages}: "
                f"{ms * 1e3:7.1f} us  {frac:.2f} of copy{mark}"
            )


if __name__ == "__main__":
    main()
