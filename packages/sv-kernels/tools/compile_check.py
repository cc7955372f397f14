"""Compile every Triton kernel for the H200 (sm_90) on a machine without a GPU.

Runs each launch wrapper of `sv_kernels.triton_ops` on small CPU tensors with Triton's driver
replaced by a stand-in that reports an sm_90 target and never launches: every kernel is
specialized and compiled exactly as it would be on the device (same constexprs, same
16-byte-alignment specialization), down to a cubin via the ptxas that ships with Triton. Prints
per kernel: registers, spilled bytes, shared memory, and "pdl" where the kernel waits for the
previous one under programmatic dependent launch (on, as on the H200). Catches what the interpreter cannot
(Triton front-end errors in compiled mode, layout / shared-memory limits, spills).

    python packages/sv-kernels/tools/compile_check.py

Uses triton internals (`triton.runtime.driver`, `JITFunction.run`); a dev tool, not part of the API.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("compile_check needs compiled mode: unset TRITON_INTERPRET")

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver as triton_driver
from triton.runtime.jit import JITFunction

H200 = GPUTarget("cuda", 90, 32)


class _CompileOnlyDriver:
    """Just enough of a Triton driver for JITFunction.run(warmup=True) to compile for sm_90."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return H200

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


@contextmanager
def compile_only() -> Iterator[list[Any]]:
    """Within: kernel launches compile for sm_90 and are recorded instead of run."""
    compiled: list[Any] = []
    original_run = JITFunction.run

    def run(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, grid, kernel))
        return kernel

    from sv_kernels.triton_ops import _common

    previous_driver = triton_driver._active  # None on a machine without a GPU
    triton_driver.set_active(_CompileOnlyDriver())
    JITFunction.run = run  # type: ignore[method-assign]
    _common.PDL_OVERRIDE = True  # as on the H200: programmatic dependent launch where wired
    try:
        yield compiled
    finally:
        _common.PDL_OVERRIDE = None
        JITFunction.run = original_run  # type: ignore[method-assign]
        triton_driver._active = previous_driver


def _ptxas_report(ptx: str) -> str:
    """Registers / spills as ptxas reports them for sm_90a."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return "ptxas n/a"
    arch = re.search(r"\.target\s+(\S+)", ptx)
    result = subprocess.run(
        [ptxas, "-v", f"-arch={arch.group(1) if arch else 'sm_90a'}", "-o", os.devnull, "-"],
        input=ptx,
        capture_output=True,
        text=True,
        check=False,
    )
    regs = re.search(r"Used (\d+) registers", result.stderr)
    spills = re.findall(r"(\d+) bytes spill (stores|loads)", result.stderr)
    spilled = max((int(n) for n, _ in spills), default=0)
    return f"regs={regs.group(1) if regs else '?'} spill={spilled}B"


def _cases() -> Iterator[tuple[str, Any]]:
    """(label, thunk) pairs covering every kernel at Llama 3.2 1B shapes (bf16) and a few others."""
    for dtype in (torch.bfloat16, torch.float32):
        yield from _cases_for(dtype)
    yield from _quantized_gemv_cases()


def _quantized_gemv_cases() -> Iterator[tuple[str, Any]]:
    """Every 1-byte tile the tuner may pick, FP8 and int8, plain, FP32 out and SwiGLU; the
    gather of a quantized tied embedding; the FP8 matmul's row quantization; the 8-bit-weight
    matmul's tiles (BF16 and FP32 out); the unit-scaled FP8 matmul's epilogue; the dequantize
    kernel."""
    from sv_kernels import triton_ops as ops
    from sv_kernels.quantized import QuantizedWeight, QuantKind
    from sv_kernels.triton_ops.gemv import QUANTIZED_CONFIGS
    from sv_kernels.triton_ops.w8a16 import TILES as W8A16_TILES

    hidden, inter = 2048, 8192
    row = torch.zeros(1, hidden, dtype=torch.bfloat16)
    ids = torch.zeros(8, dtype=torch.int64)
    kinds: tuple[tuple[torch.dtype, QuantKind], ...] = (
        (torch.float8_e4m3fn, "fp8"),
        (torch.int8, "int8"),
    )
    for k in (hidden, inter):  # the FP8 matmul's activations: each row to e4m3 with its scale
        x = torch.zeros(256, k, dtype=torch.bfloat16)
        yield f"quantize_rows_fp8 K={k}", lambda x=x: ops.quantize_rows_fp8(x)
    product, row_scale, col_scale = torch.zeros(256, hidden), torch.ones(256, 1), torch.ones(hidden)
    for dtype in (torch.bfloat16, torch.float32):  # the unit-scaled FP8 matmul's epilogue
        yield (
            f"scale_product -> {dtype}",
            lambda dtype=dtype: ops.scale_product(product, row_scale, col_scale, dtype),
        )
    for storage, kind in kinds:
        w = torch.zeros(2 * inter, hidden, dtype=storage)
        scale = torch.ones(2 * inter)
        table = QuantizedWeight(w, scale, kind, torch.bfloat16)
        yield f"embedding {storage}", lambda t=table: ops.embedding(ids, t)
        for config in QUANTIZED_CONFIGS:
            yield (
                f"gemv {config} {storage}",
                lambda config=config, w=w, s=scale: ops.gemv(row, w, config, scale=s),
            )
            yield (
                f"gemv -> fp32 {config} {storage}",
                lambda config=config, w=w, s=scale: ops.gemv(
                    row, w, config, scale=s, out_dtype=torch.float32
                ),
            )
            yield (
                f"gemv+swiglu {config} {storage}",
                lambda config=config, w=w, s=scale: ops.gemv(row, w, config, swiglu=True, scale=s),
            )
        yield from _qkv_rope_cases(torch.bfloat16, QUANTIZED_CONFIGS, storage)
        for dtype in (torch.bfloat16, torch.float32):
            yield (
                f"dequantize {storage} -> {dtype}",
                lambda t=table, dtype=dtype: ops.dequantize(t, dtype),
            )
        for rows, tile in W8A16_TILES:  # the 8-bit-weight matmul at each row count's tile
            x = torch.zeros(min(rows, 256), hidden, dtype=torch.bfloat16)
            yield (
                f"w8a16 {tile} {storage}",
                lambda x=x, w=w, s=scale: ops.w8a16_matmul(x, w, s),
            )
            yield (  # an LM head's FP32 logits
                f"w8a16 -> fp32 {tile} {storage}",
                lambda x=x, w=w, s=scale: ops.w8a16_matmul(x, w, s, out_dtype=torch.float32),
            )


def _cases_for(dtype: torch.dtype) -> Iterator[tuple[str, Any]]:
    from sv_kernels import triton_ops as ops
    from sv_kernels.quantized import ScaledProduct

    hidden, inter, vocab = 2048, 8192, 128256
    x = torch.zeros(8, hidden, dtype=dtype)
    w = torch.ones(hidden, dtype=dtype)
    ids = torch.zeros(8, dtype=torch.int64)
    yield f"embedding {dtype}", lambda: ops.embedding(ids, torch.zeros(64, hidden, dtype=dtype))
    yield f"rms_norm+residual {dtype}", lambda: ops.rms_norm(x, w, 1e-5, x)
    yield f"rms_norm {dtype}", lambda: ops.rms_norm(x, w, 1e-5)
    if dtype != torch.float32:  # the FP8 matmuls' activations, from a 16-bit model's norm
        yield f"rms_norm+residual fp8 rows {dtype}", lambda: ops.rms_norm(x, w, 1e-5, x, True)
        # the o and down projections' unscaled FP8 products, scaled as the norm reads them
        scaled = ScaledProduct(torch.zeros(8, hidden), torch.ones(8, 1), torch.ones(hidden), dtype)
        yield f"rms_norm scaled product {dtype}", lambda: ops.rms_norm(scaled, w, 1e-5, x, True)
    yield f"swiglu {dtype}", lambda: ops.swiglu(torch.zeros(8, 2 * inter, dtype=dtype))
    if dtype != torch.float32:
        gate_up = torch.zeros(8, 2 * inter, dtype=dtype)
        yield f"swiglu fp8 rows {dtype}", lambda: ops.swiglu(gate_up, True)
    tables = torch.zeros(9, 8192, dtype=torch.int32)
    yield (
        "decode_metadata",
        lambda: ops.decode_metadata(tables, ids[:4].int(), ids[:4].int(), 16),
    )
    yield (
        "feed_tokens",
        lambda: ops.feed_tokens(ids[:4].int(), ids[:4].int(), ids),
    )
    logits = torch.zeros(4, vocab, dtype=dtype)
    yield f"argmax {dtype}", lambda: ops.argmax(logits)
    yield (
        f"apply_token_bitmask {dtype}",
        lambda: ops.apply_token_bitmask(
            logits, torch.zeros(2, (vocab + 31) // 32, dtype=torch.int32), ids[:2]
        ),
    )
    per_row = (
        torch.ones(4),
        torch.zeros(4, dtype=torch.int32),
        torch.ones(4),
        torch.zeros(4, dtype=torch.int64),
        torch.zeros(4, dtype=torch.int64),
    )
    yield f"sample {dtype}", lambda: ops.sample(logits, *per_row)
    yield (
        f"sample, no filters {dtype}",
        lambda: ops.sample(logits, *per_row, any_top_k=False, any_top_p=False),
    )
    for batch in (1, 256):  # the narrowest and the widest chunks of the log-probabilities
        rows = torch.zeros(batch, vocab, dtype=dtype)
        chosen = torch.zeros(batch, dtype=torch.int64)
        yield (
            f"token_logprobs B={batch} {dtype}",
            lambda rows=rows, chosen=chosen: ops.token_logprobs(rows, chosen, 20),
        )
    from sv_kernels.triton_ops.gemv import CONFIGS

    row = torch.zeros(1, hidden, dtype=dtype)
    yield (
        f"gemv -> fp32 {dtype}",
        lambda: ops.gemv(row, torch.zeros(inter, hidden, dtype=dtype), out_dtype=torch.float32),
    )
    for config in CONFIGS:  # every tile the batch-1 tuner may pick
        yield (
            f"gemv {config} {dtype}",
            lambda config=config: ops.gemv(row, torch.zeros(inter, hidden, dtype=dtype), config),
        )
        yield (
            f"gemv+bias {config} {dtype}",
            lambda config=config: ops.gemv(
                row,
                torch.zeros(inter, hidden, dtype=dtype),
                config,
                bias=torch.zeros(inter, dtype=dtype),
            ),
        )
        yield (
            f"gemv+swiglu {config} {dtype}",
            lambda config=config: ops.gemv(
                row, torch.zeros(2 * inter, hidden, dtype=dtype), config, swiglu=True
            ),
        )
    yield from _few_rows_cases(dtype, hidden, inter)
    yield from _qkv_rope_cases(dtype, CONFIGS, None)
    for head_dim, hq, hkv in ((64, 32, 8), (128, 24, 8), (64, 9, 3)):
        yield from _attention_cases(dtype, head_dim, hq, hkv)


def _qkv_rope_cases(
    dtype: torch.dtype, tiles: tuple[Any, ...], storage: torch.dtype | None, tokens: int = 1
) -> Iterator[tuple[str, Any]]:
    """The q/k/v projection with RoPE and the cache write (Llama 3.2 1B: 32 + 2 x 8 heads of
    64) for every tile that holds whole RoPE pairs, into a 16-bit and an FP8 cache: one token
    through the GEMV, more through the few-row kernel; `storage` is a quantized weight's (FP8
    or int8), with its scales."""
    from sv_kernels import triton_ops as ops

    hq, hkv, head_dim, hidden = 32, 8, 64, 2048
    row = torch.zeros(tokens, hidden, dtype=dtype)
    w = torch.zeros((hq + 2 * hkv) * head_dim, hidden, dtype=storage or dtype)
    scale = None if storage is None else torch.ones(w.shape[0])
    cos = sin = torch.zeros(4096, head_dim // 2)
    index = torch.zeros(tokens, dtype=torch.int64)
    caches = [(dtype, None), (torch.float8_e4m3fn, torch.ones(2, hkv))]
    for tile in tiles:
        if not ops.qkv_rope_fits(tile[0], head_dim):
            continue
        for cache_dtype, kv_scales in caches:
            cache = torch.zeros(8, 16, hkv, head_dim, dtype=cache_dtype)
            yield (
                f"qkv_rope_cache {tokens} rows {tile} {storage or dtype} -> {cache_dtype} cache",
                lambda tile=tile, cache=cache, kv_scales=kv_scales: ops.qkv_rope_cache(
                    row, w, tile, hq, index, cos, sin, cache, cache, index, kv_scales, scale=scale
                ),
            )


def _few_rows_cases(dtype: torch.dtype, hidden: int, inter: int) -> Iterator[tuple[str, Any]]:
    """Every tile the few-row tuner may pick, with each epilogue (a verify step's 16 rows)."""
    from sv_kernels import triton_ops as ops
    from sv_kernels.triton_ops.few_rows import CONFIGS

    rows = torch.zeros(16, hidden, dtype=dtype)
    for tile in CONFIGS:
        w = torch.zeros(inter, hidden, dtype=dtype)
        yield (
            f"few_rows {tile} {dtype}",
            lambda tile=tile, w=w: ops.few_rows_linear(rows, w, tile),
        )
        yield (
            f"few_rows+bias -> fp32 {tile} {dtype}",
            lambda tile=tile, w=w: ops.few_rows_linear(
                rows, w, tile, out_dtype=torch.float32, bias=torch.zeros(inter, dtype=dtype)
            ),
        )
        gate_up = torch.zeros(2 * inter, hidden, dtype=dtype)
        yield (
            f"few_rows+swiglu {tile} {dtype}",
            lambda tile=tile, w=gate_up: ops.few_rows_linear(rows, w, tile, swiglu=True),
        )
    yield from _qkv_rope_cases(dtype, CONFIGS, None, tokens=rows.shape[0])


def _attention_cases(
    dtype: torch.dtype, head_dim: int, hq: int, hkv: int
) -> Iterator[tuple[str, Any]]:
    from sv_kernels import rope_tables
    from sv_kernels import triton_ops as ops

    cos, sin = rope_tables.rope_tables(head_dim, 64, 500000.0)
    t, pages, page = 8, 32, 16
    q = torch.zeros(t, hq, head_dim, dtype=dtype)
    kv = torch.zeros(t, hkv, head_dim, dtype=dtype)
    cache = torch.zeros(pages, page, hkv, head_dim, dtype=dtype)
    slots = torch.arange(t, dtype=torch.int64)
    pos = torch.arange(t, dtype=torch.int64)
    tag = f"D={head_dim} Hq={hq} Hkv={hkv} {dtype}"
    # The model's own cache, and an FP8 (e4m3) one with its K and V scales per KV head.
    caches = [("", cache, None)]
    fp8_cache = cache.to(torch.float8_e4m3fn)
    caches.append((" fp8-kv", fp8_cache, torch.ones(2, hkv)))
    for kind, kv_cache, scales in caches:
        for tile_tokens in (None, 4):  # one token per program (decode) and several (prefill)
            yield (
                f"rope_cache_write tile_tokens={tile_tokens}{kind} {tag}",
                lambda tile_tokens=tile_tokens, c=kv_cache, s=scales: ops.rope_cache_write(
                    q, kv, kv, pos, cos, sin, c, c, slots, s, tile_tokens=tile_tokens
                ),
            )
    tables = torch.zeros(4, pages, dtype=torch.int32)
    lens = torch.full((4,), 100, dtype=torch.int32)
    qd = torch.zeros(4, hq, head_dim, dtype=dtype)
    for kind, kv_cache, scales in caches:
        for splits in (1, 8):
            for window in (None, 40):  # full attention, and Mistral's sliding window
                yield (
                    f"decode splits={splits} window={window}{kind} {tag}",
                    lambda splits=splits, window=window, c=kv_cache, s=scales: (
                        ops.paged_decode_attention(
                            qd,
                            c,
                            c,
                            tables,
                            lens,
                            0.125,
                            kv_scales=s,
                            sliding_window=window,
                            num_splits=splits,
                        )
                    ),
                )
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    seq_lens = torch.tensor([3, 8], dtype=torch.int32)
    for kind, kv_cache, scales in caches:
        for max_q in (8, 2048):
            for window in (None, 40):
                yield (
                    f"prefill max_q={max_q} window={window}{kind} {tag}",
                    lambda max_q=max_q, window=window, c=kv_cache, s=scales: ops.prefill_attention(
                        q,
                        c,
                        c,
                        cu,
                        seq_lens,
                        tables[:2],
                        0.125,
                        max_q,
                        kv_scales=s,
                        sliding_window=window,
                    ),
                )


def _sampler_variants_per_kernel() -> dict[str, int]:
    """Compiled variants of each sampling kernel over batch sizes 1..256 (Llama 3.2 vocab):
    the chunk width, chunk count and round shift are run-time arguments, so batch size must
    not multiply compiles (only TOP_P, a constexpr, makes two of the round kernels)."""
    from sv_kernels import triton_ops as ops

    variants: dict[str, set[str]] = {}
    for batch in (1, 5, 40, 256):
        logits = torch.zeros(batch, 128256, dtype=torch.bfloat16)
        per_row = (
            torch.ones(batch),
            torch.zeros(batch, dtype=torch.int32),
            torch.ones(batch),
            torch.zeros(batch, dtype=torch.int64),
            torch.zeros(batch, dtype=torch.int64),
        )
        with compile_only() as compiled:
            ops.sample(logits, *per_row)
        for name, _grid, kernel in compiled:
            variants.setdefault(name, set()).add(kernel.hash)
    return {name: len(hashes) for name, hashes in variants.items()}


def main(argv: list[str] | None = None) -> int:
    del argv
    failures = 0
    variants = _sampler_variants_per_kernel()
    print(f"sampler: compiled variants over batch sizes 1..256: {variants}")
    allowed = {"_radix_histogram_kernel": 2, "_radix_select_kernel": 2}
    for name, count in variants.items():
        if count > allowed.get(name, 1):
            failures += 1
            print(f"FAIL {name}: {count} compiled variants across batch sizes")
    seen: set[str] = set()
    for label, thunk in _cases():
        with compile_only() as compiled:
            try:
                thunk()
            except Exception as error:  # report every failing case, not just the first
                failures += 1
                print(f"FAIL {label}: {type(error).__name__}: {error}")
                continue
        for name, _grid, kernel in compiled:
            key = f"{name} {label}"
            if key in seen:
                continue
            seen.add(key)
            shared = kernel.metadata.shared
            ptx = kernel.asm["ptx"]
            pdl = " pdl" if "griddepcontrol.wait" in ptx else ""
            print(f"ok   {label:<40} {name:<28} shared={shared}B {_ptxas_report(ptx)}{pdl}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
