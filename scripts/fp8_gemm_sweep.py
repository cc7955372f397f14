"""FP8 matmuls at decode batch sizes on the GPU: which kernel and tile each 1B matrix wants.

For each of Llama 3.2 1B's matrices (q/k/v, o, gate/up, down, LM head) and each row count,
times as replayed CUDA graphs over input sets that overflow L2: BF16 cuBLAS (`F.linear`), the
per-token activation quantization (`quantize_rows_fp8`), `torch._scaled_mm` on the quantized
rows, and `triton_ops.fp8_gemm` at every tile below; prints the best tiles per matrix and
the largest difference of the best tile's result from `scaled_mm`'s (the same products, so
only the accumulation order differs), and the best tile's time with the tensor cores' own
accumulation over all of K (`fast_accum`).

    python3 scripts/fp8_gemm_sweep.py [--rows 64,128,256] [--quick]   (on the GPU)
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import torch
from sv_kernels import graphs, quantized, triton_ops
from sv_kernels.quantized_ops import scaled_mm

SHAPES = {  # name: (N, K)
    "qkv": (3072, 2048),
    "o": (2048, 2048),
    "gate_up": (16384, 2048),
    "down": (2048, 8192),
    "lm_head": (128256, 2048),
}


def tiles(quick: bool) -> list[tuple[int, int, int, int, int]]:
    out = []
    for bm, bn, bk, stages in itertools.product(
        (64, 128), (32, 64, 128, 256), (64, 128), (3, 4, 5)
    ):
        if stages * (bm + bn) * bk > 200 * 1024:  # shared memory
            continue
        for warps in (4, 8):
            if warps == 8 and bm * bn < 128 * 128:
                continue
            if quick and (stages != 4 or bk != 128):
                continue
            out.append((bm, bn, bk, warps, stages))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="64,128,256", help="comma-separated row counts")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--quick", action="store_true", help="4 stages and 128-wide K slices only")
    args = parser.parse_args()
    torch.manual_seed(0)
    candidates = tiles(args.quick)
    print(f"{len(candidates)} tiles (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)")
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        w8 = quantized.quantize(w16, "fp8")
        sets = graphs.sets_to_overflow_l2(n * k, w16.device)
        w16s = [w16, *(w16.clone() for _ in range(sets - 1))]
        w8s = [
            w8,
            *(
                quantized.QuantizedWeight(w8.data.clone(), w8.scale.clone(), "fp8", w8.dtype)
                for _ in range(sets - 1)
            ),
        ]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            xq, xs = triton_ops.quantize_rows_fp8(x)
            us = {}
            us["bf16"] = 1e3 * graphs.graph_ms_per_call(
                [partial(torch.nn.functional.linear, x, w) for w in w16s], 20, 50
            )
            us["quantize"] = 1e3 * graphs.graph_ms_per_call(
                [partial(triton_ops.quantize_rows_fp8, x)], 20, 50
            )
            us["scaled_mm"] = (
                1e3 * graphs.graph_ms_per_call([partial(scaled_mm, x, w) for w in w8s], 20, 50)
                - us["quantize"]
            )
            timed = []
            for tile in candidates:
                calls = [partial(triton_ops.fp8_gemm, xq, xs, w.data, w.scale, tile) for w in w8s]
                try:
                    timed.append((1e3 * graphs.graph_ms_per_call(calls, 20, 50), tile))
                except Exception as error:  # a tile the compiler refuses
                    print(f"  {tile}: n/a ({type(error).__name__}: {str(error)[:80]})")
                    torch.cuda.synchronize()
            timed.sort()
            best_us, best = timed[0]
            want = torch._scaled_mm(
                xq, w8.data.t(), scale_a=xs, scale_b=w8.scale[None, :], out_dtype=torch.bfloat16
            ).float()
            got = triton_ops.fp8_gemm(xq, xs, w8.data, w8.scale, best).float()
            diff = ((got - want).abs().max() / want.abs().max()).item()
            fast = [
                partial(triton_ops.fp8_gemm, xq, xs, w.data, w.scale, best, fast_accum=True)
                for w in w8s
            ]
            fast_us = 1e3 * graphs.graph_ms_per_call(fast, 20, 50)
            print(
                f"{name:8} {rows:5} rows: bf16 {us['bf16']:7.1f} us | quantize {us['quantize']:5.1f}"
                f" | scaled_mm {us['scaled_mm']:7.1f} | triton {best_us:7.1f} {best}"
                f" | rel diff {diff:.1e} | fast accum {fast_us:.1f} | next: "
                + ", ".join(f"{t} {u:.1f}" for u, t in timed[1:4])
            )


if __name__ == "__main__":
    main()
