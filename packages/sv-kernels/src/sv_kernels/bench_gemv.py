"""The batch-1 GEMV sweep: every candidate tile on every decode-step matrix, BF16, FP8 and int8.

For each matrix of a Llama 3.2 1B decode step (q/k/v, o, gate/up, down, the LM head) and each
weight type, the tuner's own timing (`linear_tuning.time_gemv_tiles`: CUDA-graph replays over
copies of the weight that overflow L2) of cuBLAS and of every candidate tile of that type. One
row per (matrix, type) for cuBLAS and one for the fastest tile, whose note lists every tile's
time; then per type the step's sum over its layers and the LM head (each matrix at its best),
which is the GEMV share of a batch-1 decode step. Bytes are the least the call must move: the
weight (and its FP32 row scales), x and the output.

One compile per tile and weight type (the five shapes share Triton's specialization), about two
dozen in all: the sweep takes well under two minutes on an H200.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

from sv_kernels.bench_harness import Bench, Row
from sv_kernels.linear_plan import GemvTile
from sv_kernels.quantized import LinearWeight, QuantizedWeight, quantize

WeightType = Literal["bf16", "fp8", "int8"]
WEIGHT_TYPES: tuple[WeightType, ...] = ("bf16", "fp8", "int8")


def matrices(b: Bench) -> list[tuple[str, int, int]]:
    """(name, N, K) of each matrix a decode step multiplies by, from the bench's shapes."""
    s = b.shapes
    qkv = (s.hq + 2 * s.hkv) * s.head_dim
    return [
        ("qkv", qkv, s.hidden),
        ("o", s.hq * s.head_dim, s.hidden),
        ("gate_up", 2 * s.inter, s.hidden),
        ("down", s.hidden, s.inter),
        ("lm_head", s.vocab, s.hidden),
    ]


def weight_bytes(w: LinearWeight) -> int:
    """Bytes a GEMV must read of w: its values, and a quantized matrix's FP32 row scales."""
    if isinstance(w, QuantizedWeight):
        return w.data.nbytes + w.scale.nbytes
    return w.nbytes


def _tile(tile: GemvTile) -> str:
    return "(" + ",".join(str(v) for v in tile) + ")"


def bench_gemv(b: Bench) -> None:
    per_token_ms = dict.fromkeys(WEIGHT_TYPES, 0.0)
    per_token_bytes = dict.fromkeys(WEIGHT_TYPES, 0)
    for name, n, k in matrices(b):
        count = b.shapes.layers if name != "lm_head" else 1
        plain = b.randn(n, k)
        for kind in WEIGHT_TYPES:
            weight: LinearWeight = plain if kind == "bf16" else quantize(plain, kind)
            nbytes = weight_bytes(weight) + 2 * (k + n)  # x and the output, BF16
            cublas_ms, tiles = _times(b, weight)
            shape = f"{name} {n}x{k}"
            cublas = "dequantize + cuBLAS" if kind != "bf16" else "cuBLAS"
            best_tile, best_ms = min(tiles.items(), key=lambda item: item[1])
            listed = " ".join(f"{_tile(t)}={ms * 1e3:.1f}" for t, ms in tiles.items())
            for impl, ms, note in (
                (f"{kind} {cublas}", cublas_ms, ""),
                (f"{kind} best {_tile(best_tile)}", best_ms, f"us per tile: {listed}"),
            ):
                b.record(Row("gemv b1", shape, impl, ms=ms, bytes=nbytes, note=note))
            per_token_ms[kind] += count * min(best_ms, cublas_ms)
            per_token_bytes[kind] += count * nbytes
            del weight
        del plain
    for kind in WEIGHT_TYPES:
        shape = f"{b.shapes.layers} layers + LM head"
        b.record(
            Row(
                "gemv b1 per token",
                shape,
                f"{kind} best per matrix",
                ms=per_token_ms[kind],
                bytes=per_token_bytes[kind],
                note="sum of the rows above, each matrix at its fastest (the SwiGLU epilogue "
                "aside)",
            )
        )


def _times(b: Bench, weight: LinearWeight) -> tuple[float, dict[GemvTile, float]]:
    """(cuBLAS ms, ms per candidate tile): the tuner's timing on a GPU; on the CPU (--smoke,
    the Triton interpreter) one wall-clock call of each of the first `gemv_tiles` tiles, which
    only checks the script."""
    from sv_kernels import reference, triton_ops
    from sv_kernels.triton_ops.gemv import candidates

    if b.device.type == "cuda":
        from sv_kernels.linear_tuning import time_gemv_tiles

        times = time_gemv_tiles(weight)
        return times.cublas_ms, times.tiles
    x = b.randn(1, weight.shape[1])
    cublas_ms = b.time_ms(lambda: reference.linear(x, weight))
    tiles = {}
    for tile in candidates(weight)[: b.shapes.gemv_tiles]:
        if isinstance(weight, QuantizedWeight):
            call = partial(triton_ops.gemv, x, weight.data, tile, scale=weight.scale)
        else:
            call = partial(triton_ops.gemv, x, weight, tile)
        tiles[tile] = b.time_ms(call)
    return cublas_ms, tiles
