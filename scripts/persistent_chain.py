"""A persistent kernel with grid-wide barriers against PDL-launched kernels (GPU only).

Is one resident kernel that walks a layer's ops, with a software barrier between them, a
cheaper way to run the batch-1 step than one PDL-launched kernel per op? That persistent
("megakernel") design is the change the batch-1 fp8 target seems to need: ~200 us of the fp8
step are dependent latency between ~8 kernels a layer. It rests on two assumptions, and this
script measures both:

1. A grid barrier (each program adds 1 to an arrival counter in L2 with release semantics, then
   spins on acquire loads until every program has arrived) costs less than a PDL kernel
   boundary. Timed: 64 barriers in one kernel against 64 empty PDL kernels.
2. Resident programs that deal a matrix's row blocks among themselves keep as many weight bytes
   in flight as a fresh grid of programs per matrix. Timed on the chain of runs 109-110: 16
   layers of Llama 3.2 1B's batch-1 GEMVs (q/k/v; o on q/k/v's first 2,048 outputs; gate/up
   with the SwiGLU epilogue; down) and the LM head, fp8 or BF16 random weights, no norms and
   no attention.
   - pdl: `ops.linear` per matrix, on the GEMV tile the tuner picks (65 kernels);
   - persistent: one kernel of SMs x PROGRAMS_PER_SM programs. Each phase (matrix) deals its
     row blocks round-robin; a program loads the first two slices of its next block before it
     reduces the current one, and of the next phase's first block before the barrier, as a
     GEMV under PDL loads its first slices before its wait. A spin cap turns a barrier that
     cannot complete (programs not all resident) into a flag instead of a hang.

Both chains are captured as graphs of 5 chains and timed with L2 flushed, alternating, the
median of --rounds. Without norms a 16-layer chain's activations vanish (the SwiGLU squares
them), so correctness is checked on one layer: every buffer the persistent kernel writes
against the PDL chain's.

    python3 scripts/persistent_chain.py [--modes fp8,bf16] [--variants TILES:P:W,...]
        [--rounds 3]   (on the GPU; PYTHONPATH as gpu-check.sh)

Measured on an H100 (BENCHMARKS.md, runs 206-207): a barrier 1.04-1.90 us against 1.01-1.29 us
a PDL kernel; the fp8 chain 476 us as kernels, 715 us persistent at best (BF16 854 / 949).
Both chains then multiplied 1-byte weights in FP32; since 67f664a both run the GEMV's packed
FP16 products (`slice_products`).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from sv_kernels import ops, quantized
from sv_kernels.graphs import graph_ms_per_call
from sv_kernels.linear_plan import LinearPlan
from sv_kernels.linear_tuning import tune_gemv
from sv_kernels.quantized import LinearWeight, QuantizedWeight
from sv_kernels.triton_ops.gemv import (
    block_rows,
    candidates,
    row_sums,
    slice_products,
    store_swiglu_block,
)

HIDDEN, INTER, VOCAB, LAYERS, Q_OUT, QKV = 2048, 8192, 128256, 16, 2048, 3072
SHAPES = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, Q_OUT), "gate_up": (2 * INTER, HIDDEN)}
SHAPES |= {"down": (HIDDEN, INTER)}
# ~30-60 ms of spinning: far past any phase, short enough that a barrier whose programs are
# not all resident reports itself (the flag) instead of hanging the device.
MAX_SPINS: tl.constexpr = tl.constexpr(1 << 16)
BARRIERS = 64


@triton.jit
def _grid_barrier(bar_ptr, flag_ptr, target):
    """Returns once `target` arrivals are counted: every program's writes before its arrival
    are then visible to every program (release add, acquire loads, CTA barriers around)."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < MAX_SPINS):
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if spins >= MAX_SPINS:
        tl.atomic_max(flag_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _first_slices(
    w_ptr, b, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr
):
    """The first two BLOCK_K slices of block b's rows (zeros past the matrix's end)."""
    rows, mask = block_rows(b, N, BLOCK_N, GATED)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    cols0 = tl.max_contiguous(tl.arange(0, BLOCK_K), 8)
    cols1 = BLOCK_K + cols0
    w0 = tl.load(w_rows + cols0[None, :], mask=mask[:, None] & (cols0 < K)[None, :], other=0.0)
    w1 = tl.load(w_rows + cols1[None, :], mask=mask[:, None] & (cols1 < K)[None, :], other=0.0)
    return w0, w1


@triton.jit
def _phase(
    x_ptr, w_ptr, s_ptr, out_ptr, N, K, pid, P, w0, w1,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr,
    SCALED: tl.constexpr, INT8: tl.constexpr, OUT_F32: tl.constexpr,
):  # fmt: skip
    """out = x @ W^T (SwiGLU'd if GATED) for blocks pid, pid + P, ...; w0, w1: block pid's
    first two slices, already loaded. x was written by other programs: loaded past L1."""
    # the GEMV's own dot products: 1-byte weights against BF16 x in packed FP16
    HALF2: tl.constexpr = SCALED and x_ptr.dtype.element_ty != tl.float32
    n_blocks = tl.cdiv(N // 2, BLOCK_N // 2) if GATED else tl.cdiv(N, BLOCK_N)
    cols0 = tl.max_contiguous(tl.arange(0, BLOCK_K), 8)
    cols1 = BLOCK_K + cols0
    x0 = tl.load(x_ptr + cols0, mask=cols0 < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    x1 = tl.load(x_ptr + cols1, mask=cols1 < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    for b in range(pid, n_blocks, P):
        rows, mask = block_rows(b, N, BLOCK_N, GATED)
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
        acc = slice_products(w0, x0, HALF2, INT8, BLOCK_N, BLOCK_K)
        acc += slice_products(w1, x1, HALF2, INT8, BLOCK_N, BLOCK_K)
        for k0 in range(2 * BLOCK_K, K, BLOCK_K):
            cols = tl.max_contiguous(k0 + tl.arange(0, BLOCK_K), 8)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, cache_modifier=".cg")
            w = tl.load(w_rows + cols[None, :], mask=mask[:, None] & (cols < K)[None, :], other=0.0)
            acc += slice_products(w, x.to(tl.float32), HALF2, INT8, BLOCK_N, BLOCK_K)
        w0, w1 = _first_slices(w_ptr, b + P, N, K, BLOCK_N, BLOCK_K, GATED)
        y = row_sums(acc, HALF2)
        if SCALED:
            y = y * tl.load(s_ptr + rows, mask=mask, other=0.0)
        if GATED:
            store_swiglu_block(y, out_ptr, b, N, BLOCK_N)
        elif OUT_F32:
            tl.store(out_ptr + rows, y.to(tl.bfloat16).to(tl.float32), mask=mask)
        else:
            tl.store(out_ptr + rows, y.to(tl.bfloat16), mask=mask)


@triton.jit
def _persistent_chain(
    x_ptr, qkv_w, qkv_s, o_w, o_s, gu_w, gu_s, down_w, down_s, head_w, head_s,
    qkv_buf, o_buf, mlp_buf, h_buf, logits, bar_ptr, flag_ptr, P, N_LAYERS,
    SCALED: tl.constexpr, INT8: tl.constexpr,
    QN: tl.constexpr, QK: tl.constexpr, ON: tl.constexpr, OK: tl.constexpr,
    GN: tl.constexpr, GK: tl.constexpr, DN: tl.constexpr, DK: tl.constexpr,
    HN: tl.constexpr, HK: tl.constexpr,
    H: tl.constexpr, QKV_N: tl.constexpr, I2: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    """The chain (weights stacked [layer, N, K], scales [layer, N]): per layer q/k/v, o,
    gate/up + SwiGLU and down, a barrier after each; then the LM head (FP32 logits)."""
    pid = tl.program_id(0)
    INTERMEDIATE: tl.constexpr = I2 // 2
    target = 0
    src = x_ptr
    w0, w1 = _first_slices(qkv_w, pid, QKV_N, H, QN, QK, False)
    for layer in range(N_LAYERS):
        at = tl.full((), 0, tl.int64) + layer
        _phase(src, qkv_w + at * QKV_N * H, qkv_s + at * QKV_N, qkv_buf, QKV_N, H, pid, P,
               w0, w1, QN, QK, False, SCALED, INT8, False)  # fmt: skip
        o0, o1 = _first_slices(o_w + at * H * H, pid, H, H, ON, OK, False)
        target += P
        _grid_barrier(bar_ptr, flag_ptr, target)
        _phase(qkv_buf, o_w + at * H * H, o_s + at * H, o_buf, H, H, pid, P,
               o0, o1, ON, OK, False, SCALED, INT8, False)  # fmt: skip
        g0, g1 = _first_slices(gu_w + at * I2 * H, pid, I2, H, GN, GK, True)
        target += P
        _grid_barrier(bar_ptr, flag_ptr, target)
        _phase(o_buf, gu_w + at * I2 * H, gu_s + at * I2, mlp_buf, I2, H, pid, P,
               g0, g1, GN, GK, True, SCALED, INT8, False)  # fmt: skip
        d_w = down_w + at * H * INTERMEDIATE
        d0, d1 = _first_slices(d_w, pid, H, INTERMEDIATE, DN, DK, False)
        target += P
        _grid_barrier(bar_ptr, flag_ptr, target)
        _phase(mlp_buf, d_w, down_s + at * H, h_buf, H, INTERMEDIATE, pid, P,
               d0, d1, DN, DK, False, SCALED, INT8, False)  # fmt: skip
        src = h_buf
        if layer + 1 < N_LAYERS:
            w0, w1 = _first_slices(qkv_w + (at + 1) * QKV_N * H, pid, QKV_N, H, QN, QK, False)
        target += P
        _grid_barrier(bar_ptr, flag_ptr, target)
    e0, e1 = _first_slices(head_w, pid, V, H, HN, HK, False)
    _phase(h_buf, head_w, head_s, logits, V, H, pid, P, e0, e1,
           HN, HK, False, SCALED, INT8, True)  # fmt: skip


@triton.jit
def _barriers_only(bar_ptr, flag_ptr, P, COUNT: tl.constexpr):
    target = 0
    for _ in range(COUNT):
        target += P
        _grid_barrier(bar_ptr, flag_ptr, target)


@triton.jit
def _empty_pdl_kernel(x_ptr):
    """A PDL boundary with nothing else: wait for the previous kernel, touch one value."""
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()
    v = tl.load(x_ptr + tl.program_id(0))
    tl.store(x_ptr + tl.program_id(0), v + 1)


def weight(shape: tuple[int, int], mode: str, gen: torch.Generator) -> LinearWeight:
    w = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    return w if mode == "bf16" else quantized.quantize(w, mode)  # type: ignore[arg-type]


def parts(w: LinearWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, per-row scales); a BF16 weight's 'scales' are its values (never read)."""
    return w.tensors() if isinstance(w, QuantizedWeight) else (w, w)


def barrier_costs(sms: int) -> None:
    """Assumption 1: a grid barrier against a PDL kernel boundary, nothing else to do."""
    bar = torch.zeros(1, dtype=torch.int32, device="cuda")
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    for per_sm in (1, 2, 4):
        p = sms * per_sm

        def barriers(p: int = p) -> None:
            bar.zero_()
            _barriers_only[(p,)](bar, flag, p, COUNT=BARRIERS, num_warps=4)

        us = graph_ms_per_call([barriers], min_calls=5) * 1e3
        print(f"{BARRIERS} grid barriers, {p} programs: {us / BARRIERS:.2f} us a barrier "
              f"(flag {int(flag.item())})", flush=True)  # fmt: skip
    values = torch.zeros(4 * sms, dtype=torch.int32, device="cuda")
    for p in (sms, 4 * sms):

        def kernels(p: int = p) -> None:
            for _ in range(BARRIERS):
                _empty_pdl_kernel[(p,)](values, num_warps=4, launch_pdl=True)

        us = graph_ms_per_call([kernels], min_calls=5) * 1e3
        print(f"{BARRIERS} empty PDL kernels, {p} programs: {us / BARRIERS:.2f} us a kernel",
              flush=True)  # fmt: skip


def chains(mode: str, sms: int, variants: list[str], rounds: int) -> None:
    """Assumption 2: the GEMV chain as kernels and as one persistent kernel per variant."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    layers = [{n: weight(s, mode, gen) for n, s in SHAPES.items()} for _ in range(LAYERS)]
    head = weight((VOCAB, HIDDEN), mode, gen)
    tuned = tune_gemv([layers[0][n] for n in SHAPES] + [head])
    tiles = {}
    for name, t in zip([*SHAPES, "lm_head"], tuned, strict=True):
        w = head if name == "lm_head" else layers[0][name]
        tiles[name] = t.plan.one_row_gemv or candidates(w)[0]
    plans = {name: LinearPlan(one_row_gemv=tile) for name, tile in tiles.items()}
    h0 = torch.randn(1, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)

    def pdl_chain(n_layers: int = LAYERS) -> list[torch.Tensor]:
        """The engine's batch-1 calls (`ops.linear`), every matrix on the GEMV tile in `tiles`."""
        hidden, out = h0, []
        for layer in layers[:n_layers]:
            qkv = ops.linear(hidden, layer["qkv"], plan=plans["qkv"])
            o = ops.linear(qkv[:, :Q_OUT], layer["o"], plan=plans["o"])
            mlp = ops.linear_swiglu(o, layer["gate_up"], plans["gate_up"])
            hidden = ops.linear(mlp, layer["down"], plan=plans["down"])
            out = [qkv, o, mlp, hidden]
        logits = ops.linear(hidden, head, out_dtype=torch.float32, plan=plans["lm_head"])
        return [*out, logits]

    stacked = {
        n: [torch.stack([parts(layer[n])[i] for layer in layers]).contiguous() for i in (0, 1)]
        for n in SHAPES
    }
    bufs = [
        torch.empty(1, n, dtype=torch.bfloat16, device="cuda") for n in (QKV, HIDDEN, INTER, HIDDEN)
    ]
    logits = torch.empty(1, VOCAB, dtype=torch.float32, device="cuda")
    bar = torch.zeros(1, dtype=torch.int32, device="cuda")
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")

    def persistent(variant: str, n_layers: int = LAYERS) -> Any:
        spec, per_sm, warps = variant.split(":")
        if spec == "tuned":
            t = {n: tile[:2] for n, tile in tiles.items()}
        else:
            bn, bk = map(int, spec.split("x"))
            t = dict.fromkeys(tiles, (bn, bk))
        p = sms * int(per_sm)
        bar.zero_()
        return _persistent_chain[(p,)](
            h0, *stacked["qkv"], *stacked["o"], *stacked["gate_up"], *stacked["down"],
            *parts(head), *bufs, logits, bar, flag, p, n_layers,
            SCALED=mode != "bf16", INT8=mode == "int8",
            QN=t["qkv"][0], QK=t["qkv"][1], ON=t["o"][0], OK=t["o"][1],
            GN=t["gate_up"][0], GK=t["gate_up"][1], DN=t["down"][0], DK=t["down"][1],
            HN=t["lm_head"][0], HK=t["lm_head"][1],
            H=HIDDEN, QKV_N=QKV, I2=2 * INTER, V=VOCAB, num_warps=int(warps),
        )  # fmt: skip

    print(f"[{mode}] tiles {tiles}", flush=True)
    expected = pdl_chain(1)
    timed: dict[str, Callable[[], object]] = {"pdl": pdl_chain}
    for variant in variants:
        flag.zero_()
        regs = persistent(variant, 1).n_regs
        torch.cuda.synchronize()
        diffs = [
            float((got.float() - want.float()).abs().max() / want.float().abs().max())
            for got, want in zip([*bufs, logits], expected, strict=True)
        ]
        one_layer_flag = int(flag.item())
        # Run 207: two BF16 shapes passed one layer and then hit the spin cap in every
        # 16-layer chain (~0.9 s each); a full chain first keeps such a shape out of the timing.
        flag.zero_()
        persistent(variant)
        torch.cuda.synchronize()
        ok = one_layer_flag == 0 and flag.item() == 0 and max(diffs) < 2e-2
        print(f"  persistent {variant}: one layer, largest difference per buffer (q/k/v, o, "
              f"SwiGLU, down, logits) / its range {[f'{d:.1e}' for d in diffs]}; barrier flag "
              f"{one_layer_flag} (one layer), {int(flag.item())} ({LAYERS} layers): "
              f"{regs} registers: {'timed' if ok else 'NOT timed'}", flush=True)  # fmt: skip
        if ok:
            timed[variant] = lambda v=variant: persistent(v)
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(rounds):
        for name, call in timed.items():
            times[name].append(graph_ms_per_call([call], min_calls=5) * 1e3)
    for name, ts in times.items():
        print(f"[{mode}] {name:12} {statistics.median(ts):8.1f} us {[round(t, 1) for t in ts]}",
              flush=True)  # fmt: skip
    print(f"[{mode}] barrier flag after the timing: {int(flag.item())}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="fp8,bf16")
    parser.add_argument(
        "--variants",
        default="tuned:2:4,4x512:4:4,2x1024:4:4,4x1024:3:4,2x1024:2:8",
        help="persistent launches, TILES:PROGRAMS_PER_SM:WARPS; TILES is 'tuned' (the PDL "
        "chain's tile per matrix) or BNxBK for every matrix",
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(0), flush=True)
    barrier_costs(sms)
    for mode in args.modes.split(","):
        chains(mode, sms, args.variants.split(","), args.rounds)


if __name__ == "__main__":
    main()
