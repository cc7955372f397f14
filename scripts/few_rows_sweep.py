"""Time few-row tiles against cuBLAS (and the batch-1 GEMV at one row) on Llama 3.2 1B's
matrices, graph-replayed over weights that overflow L2, as the tuner times them (GPU only).

    python3 scripts/few_rows_sweep.py [--rows 2,8] [--grid]

Per matrix: the batch-1 GEMV and cuBLAS at one row; at 16 rows cuBLAS and every tile (the
tuner's candidates, or with --grid a wider grid of tile shapes), the best five; at each of
--rows the best three of those again. Last, each layer's sum (q/k/v + o + gate/up + down).
"""

from __future__ import annotations

import argparse
import itertools

import torch
from sv_kernels.linear_plan import FewRowsTile
from sv_kernels.linear_tuning import time_few_rows_tiles, time_gemv_tiles
from sv_kernels.triton_ops import few_rows

SHAPES = {
    "qkv": (3072, 2048),
    "o": (2048, 2048),
    "gate_up": (16384, 2048),
    "down": (2048, 8192),
    "lm_head": (128256, 2048),
}


def grid(n: int, k: int) -> tuple[FewRowsTile, ...]:
    tiles = []
    for bn, bk, split, warps, stages in itertools.product(
        (16, 32, 64), (128, 256, 512), (1, 2, 4, 8, 16, 32), (4, 8), (1, 3)
    ):
        programs = -(-n // bn) * split
        if split * bk > k or bn * bk > 16384 or programs < 132 or programs > 20000:
            continue
        if stages > 1 and split * bk == k:  # one slice per program: nothing to pipeline
            continue
        tiles.append((bn, bk, split, warps, stages))
    return tuple(tiles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2,8")
    parser.add_argument("--grid", action="store_true")
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    layer = {"gemv 1 row": 0.0, "cuBLAS 16": 0.0, "best 16": 0.0}
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        one = time_gemv_tiles(w)
        tile1, ms1 = one.best()
        print(
            f"{name:8s}  1 row: cuBLAS {one.cublas_ms * 1e3:6.1f} us, GEMV {ms1 * 1e3:6.1f} {tile1}"
        )
        tiles = grid(n, k) if args.grid else few_rows.CONFIGS
        cublas, times = time_few_rows_tiles(w, 16, tiles)
        ranked = sorted(times.items(), key=lambda kv: kv[1])
        top = "  ".join(f"{t}:{ms * 1e3:.1f}" for t, ms in ranked[:5])
        print(
            f"{name:8s} 16 rows: cuBLAS {cublas * 1e3:6.1f} us; {len(tiles)} tiles, best: {top}",
            flush=True,
        )
        if name != "lm_head":
            layer["gemv 1 row"] += ms1 * 1e3
            layer["cuBLAS 16"] += cublas * 1e3
            layer["best 16"] += min(cublas, ranked[0][1]) * 1e3
        for rows in rows_list:
            cublas_r, again = time_few_rows_tiles(w, rows, tuple(t for t, _ in ranked[:3]))
            shown = "  ".join(f"{t}:{ms * 1e3:.1f}" for t, ms in again.items())
            print(f"{name:8s} {rows:2d} rows: cuBLAS {cublas_r * 1e3:6.1f} us; {shown}", flush=True)
    print(
        "layer (q/k/v + o + gate/up + down), us: "
        + ", ".join(f"{k} {v:.1f}" for k, v in layer.items())
    )


if __name__ == "__main__":
    main()
