"""Launch shapes of the 8-bit-weight matmul (`triton_ops.w8a16_matmul`), on the GPU.

For each of Llama 3.2 1B's matrices (q/k/v, o, gate/up, down, the LM head) and each row count,
times every tile below for int8 and FP8 weights beside what a quantized weight runs without it:
the weight dequantized to BF16 (`triton_ops.dequantize`) for cuBLAS, and for FP8 the FP8
tensor cores (`scaled_mm`); and BF16's own cuBLAS on an unquantized weight of the shape, the
figure to beat. Each is a replayed
CUDA graph over weight copies that overflow L2 (as a decode step reads its weights: from DRAM).
Prints per (matrix, rows) the best tiles and the others' times; what `default_tile` should be
is read off here.

    python3 scripts/w8a16_sweep.py                  (on the GPU; PYTHONPATH as gpu-check.sh)
    python3 scripts/w8a16_sweep.py --rows 256 --matrices qkv,down
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import torch
from sv_kernels import graphs, quantized_ops
from sv_kernels.quantized import quantize
from sv_kernels.triton_ops.w8a16 import W8A16Tile, default_tile, w8a16_matmul

MATRICES = {
    "qkv": (3072, 2048),
    "o": (2048, 2048),
    "gate_up": (16384, 2048),
    "down": (2048, 8192),
    "lm_head": (128256, 2048),
}
ROWS = (16, 64, 256, 2048)
# Tiles' row heights by call size; each with every (BLOCK_N, BLOCK_K, warps, stages) below.
HEIGHTS = {16: (16,), 64: (64,), 256: (128,), 2048: (128,)}
SHAPES = tuple(itertools.product((64, 128, 256), (64, 128), (4, 8), (3, 4)))


def tiles_for(rows: int) -> list[W8A16Tile]:
    heights = HEIGHTS.get(rows, (16,) if rows <= 16 else (64,) if rows <= 64 else (128,))
    return [(bm, *shape) for bm in heights for shape in SHAPES]  # type: ignore[misc]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def time_calls(calls: list) -> float | None:
    """µs per call, or None where the compiler refuses the launch (shared memory)."""
    try:
        return graphs.graph_ms_per_call(calls, 20, 25) * 1e3
    except Exception as error:
        print(f"    n/a ({type(error).__name__}: {str(error)[:80]})")
        torch.cuda.synchronize()
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=_ints, default=ROWS)
    parser.add_argument("--matrices", default=",".join(MATRICES))
    parser.add_argument("--kinds", default="int8,fp8")
    parser.add_argument("--top", type=int, default=4, help="best tiles printed per case")
    args = parser.parse_args()
    torch.manual_seed(0)
    for name in args.matrices.split(","):
        n, k = MATRICES[name]
        bf16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        plain = graphs.copies_to_overflow_l2(bf16)
        for kind in args.kinds.split(","):
            q = quantize(bf16, kind)  # type: ignore[arg-type]
            copies = graphs.copies_to_overflow_l2(q)
            for rows in args.rows:
                if name == "lm_head" and rows > 256:  # a prompt's LM head runs on its last row
                    continue
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                base = {
                    "bf16 cuBLAS": time_calls(
                        [partial(torch.nn.functional.linear, x, w) for w in plain]
                    ),
                    "dequantize + cuBLAS": time_calls(
                        [partial(quantized_ops.dequantized_linear, x, w) for w in copies]
                    ),
                }
                if kind == "fp8":
                    base["scaled_mm"] = time_calls(
                        [partial(quantized_ops.scaled_mm, x, w) for w in copies]
                    )
                tiles = {}
                for tile in tiles_for(rows):
                    calls = [partial(w8a16_matmul, x, w.data, w.scale, tile) for w in copies]
                    us = time_calls(calls)
                    if us is not None:
                        tiles[tile] = us
                default = default_tile(rows)
                ranked = sorted(tiles.items(), key=lambda item: item[1])
                print(f"== {name} {n}x{k} {kind}, {rows} rows")
                for label, us in base.items():
                    print(f"  {label:<22} {us:8.1f} us" if us else f"  {label:<22}      n/a")
                for tile, us in ranked[: args.top]:
                    mark = "  (default)" if tile == default else ""
                    print(f"  w8a16 {tile!s:<22} {us:8.1f} us{mark}")
                if default in tiles and default not in dict(ranked[: args.top]):
                    print(f"  w8a16 {default!s:<22} {tiles[default]:8.1f} us  (default)")


if __name__ == "__main__":
    main()
