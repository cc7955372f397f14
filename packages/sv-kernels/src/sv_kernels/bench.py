"""Benchmark every Triton op at Llama 3.2 1B serving shapes (bf16) against its torch reference.

    python -m sv_kernels.bench [--json PATH] [--skip-flex] [--quick] [--only gemv,logprobs,...]
    (also run by `sv bench --kernels`; `sv bench --only gemv` runs the GEMV sweep alone)
    python -m sv_kernels.bench --smoke   # tiny shapes, any device

or `from sv_kernels.bench import main; rows = main(["--json", "out.json"])`.

First measures the device's copy bandwidth (a 1 GiB device-to-device copy: bytes read +
written), then times each op with `triton.testing.do_bench` (median; do_bench also flushes L2
before every repetition). An op that takes under GRAPH_BELOW_MS that way is launch-bound in that
measurement (Python argument handling and the launch cost as much as the kernel), so it is timed
again the way the engine runs it: GRAPH_CALLS calls captured in one CUDA graph, the replays timed
by do_bench, divided by the call count; both times are kept (`ms` is the graph's, `eager_ms` the
plain call's). The table reports the minimum bytes the op must move (every input read once,
every output written once), the achieved GB/s and its fraction of the copy bandwidth. Several
input sets are rotated between calls so that small shapes are not served from the 50+ MB L2.
Attention is also timed with torch's scaled_dot_product_attention (flash backend, contiguous
K/V) and compiled FlexAttention on the same shapes; prefill reports TFLOP/s too.

`--smoke` runs every measurement at tiny shapes (on the CPU under TRITON_INTERPRET=1 when
there is no GPU) to check the script itself; its numbers mean nothing.

Targets (issue): >= 0.7 of copy bandwidth for rms_norm, swiglu, rope+cache write and decode
attention at batch 256 x context 1024. Every measurement is independent: one that fails prints
"n/a: <reason>" and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

import torch

from sv_kernels.bench_gemv import bench_gemv
from sv_kernels.bench_harness import BF16, SERVING, SMOKE, Bench, Row, print_table

PAGE = 16


# --- the measurements -----------------------------------------------------------------------


def bench_copy(b: Bench) -> None:
    n = b.shapes.copy_bytes
    src = torch.ones(n, dtype=torch.uint8, device=b.device)
    dst = torch.empty_like(src)
    ms = b.time_ms(lambda: dst.copy_(src))
    b.copy_gbps = 2 * n / (ms * 1e-3) / 1e9
    b.record(Row("copy", f"{n >> 20} MiB d2d", "torch", ms=ms, bytes=2 * n))  # 1.0 of itself


def bench_norm_swiglu_embedding(b: Bench) -> None:
    from sv_kernels import reference, triton_ops

    s = b.shapes
    for tokens in s.norm_tokens:
        nbytes = (4 * tokens * s.hidden + s.hidden) * 2  # read x, residual, w; write out, sum
        sets = [
            (b.randn(tokens, s.hidden), b.randn(tokens, s.hidden), b.randn(s.hidden))
            for _ in range(b.sets_for(nbytes))
        ]
        for impl, norm in (("triton", triton_ops.rms_norm), ("torch-ref", reference.rms_norm)):
            fns = [lambda x=x, norm=norm: norm(x[0], x[2], 1e-5, x[1]) for x in sets]
            b.add("rms_norm+residual", f"T={tokens} H={s.hidden}", impl, fns, nbytes)

    for tokens in s.swiglu_tokens:
        nbytes = 3 * tokens * s.inter * 2  # read gate and up, write the product
        inputs = [b.randn(tokens, 2 * s.inter) for _ in range(b.sets_for(nbytes))]
        for impl, act in (("triton", triton_ops.swiglu), ("torch-ref", reference.swiglu)):
            fns = [lambda x=x, act=act: act(x) for x in inputs]
            b.add("swiglu", f"T={tokens} I={s.inter}", impl, fns, nbytes)

    tokens = s.embed_tokens
    nbytes = 2 * tokens * s.hidden * 2 + tokens * 8  # read rows, write rows, read ids
    weight = b.randn(s.vocab, s.hidden)
    id_sets = [torch.randint(0, s.vocab, (tokens,), device=b.device) for _ in range(8)]
    for impl, embed in (("triton", triton_ops.embedding), ("torch-ref", reference.embedding)):
        fns = [lambda ids=ids, embed=embed: embed(ids, weight) for ids in id_sets]
        b.add("embedding", f"T={tokens} H={s.hidden}", impl, fns, nbytes)


def bench_rope_cache_write(b: Bench) -> None:
    from sv_kernels import reference, rope_tables, triton_ops

    s = b.shapes
    llama3 = rope_tables.Llama3RopeScaling(32.0, 1.0, 4.0, 8192)
    cos, sin = rope_tables.rope_tables(s.head_dim, 131072, 500000.0, llama3, b.device)
    pages = s.rope_pool_pages
    k_cache = torch.zeros(pages, PAGE, s.hkv, s.head_dim, dtype=BF16, device=b.device)
    v_cache = torch.zeros_like(k_cache)
    for tokens, label in s.rope_tokens:
        qkv_elems = tokens * (s.hq + 2 * s.hkv) * s.head_dim
        # read q, k, v, positions, slots and the cos/sin rows; write q_rot, and k, v to the cache
        nbytes = 2 * qkv_elems * 2 + tokens * (8 + 8 + s.head_dim * 4)
        sets = []
        for _ in range(b.sets_for(nbytes)):
            qkv = b.randn(tokens, s.hq + 2 * s.hkv, s.head_dim)
            positions = torch.randint(0, 100000, (tokens,), device=b.device)
            if label == "decode":  # one token per sequence, anywhere in the pool
                slots = torch.randperm(pages * PAGE, device=b.device)[:tokens]
            else:  # one prompt: consecutive slots in shuffled pages
                order = torch.randperm(pages, device=b.device)[: math.ceil(tokens / PAGE)]
                slots = (order[:, None] * PAGE + torch.arange(PAGE, device=b.device)).flatten()
                slots = slots[:tokens]
            q, k, v = qkv[:, : s.hq], qkv[:, s.hq : s.hq + s.hkv], qkv[:, s.hq + s.hkv :]
            sets.append((q, k, v, positions, slots))
        # What a plain device copy of the same byte count achieves: at these sizes the launch
        # and the ramp-up of a short kernel alone keep any op under the 1 GiB copy's rate.
        sources = [b.randn(nbytes // 4) for _ in range(len(sets))]
        targets = [torch.empty_like(x) for x in sources]
        copies = [partial(t.copy_, x) for t, x in zip(targets, sources, strict=True)]
        b.add("rope_cache_write", f"T={tokens} ({label})", "copy of the same bytes", copies, nbytes)
        del sources, targets, copies
        for impl, op in (
            ("triton", triton_ops.rope_cache_write),
            ("torch-ref", reference.rope_cache_write),
        ):
            fns = [
                lambda x=x, op=op: op(x[0], x[1], x[2], x[3], cos, sin, k_cache, v_cache, x[4])
                for x in sets
            ]
            b.add("rope_cache_write", f"T={tokens} ({label})", impl, fns, nbytes)


def _paged_kv(
    b: Bench, batch: int, context: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """k_cache, v_cache, block_tables, seq_lens: `batch` sequences of `context` tokens in
    shuffled pages."""
    s = b.shapes
    pages_per_seq = math.ceil(context / PAGE)
    num_pages = batch * pages_per_seq
    k_cache = b.randn(num_pages, PAGE, s.hkv, s.head_dim)
    v_cache = b.randn(num_pages, PAGE, s.hkv, s.head_dim)
    order = torch.randperm(num_pages, device=b.device)
    tables = order.view(batch, pages_per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=b.device)
    return k_cache, v_cache, tables, lens


def _sdpa_fn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[Callable[[], object], str]:
    """torch SDPA ([B, H, T, D] inputs) with the flash backend if it takes them, else the default."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run() -> object:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def flash() -> object:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return run()

    try:
        flash()
        return flash, "flash"
    except Exception as error:
        return run, f"default backend (flash: {type(error).__name__})"


def _flex_fn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> Callable[[], object]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if causal:
        n = q.shape[2]

        def causal_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return q_idx >= kv_idx

        block_mask = create_block_mask(causal_mask, None, None, n, n, device=q.device)

    def run() -> object:
        return compiled(q, k, v, block_mask=block_mask, enable_gqa=True)

    return run


def _torch_attention_rows(
    b: Bench,
    op: str,
    shape: str,
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    causal: bool,
    nbytes: int,
    flops: float | None,
    with_flex: bool,
) -> None:
    """SDPA and FlexAttention on contiguous K/V [B, H, T, D]; "n/a: reason" when one fails."""
    try:
        fn, backend = _sdpa_fn(q4, k4, v4, causal)
        b.add(op, shape, f"sdpa {backend}", [fn], nbytes, flops)
    except Exception as error:
        b.rows.append(Row(op, shape, "sdpa", note=f"n/a: {type(error).__name__}: {error}"[:160]))
    if with_flex:
        try:
            b.add(op, shape, "flex (compiled)", [_flex_fn(q4, k4, v4, causal)], nbytes, flops)
        except Exception as error:
            b.rows.append(
                Row(op, shape, "flex", note=f"n/a: {type(error).__name__}: {error}"[:160])
            )


def bench_attention(b: Bench, with_flex: bool) -> None:
    from sv_kernels import reference, triton_ops

    s = b.shapes
    scale = 1 / math.sqrt(s.head_dim)
    for batch, context in s.decode:
        shape = f"B={batch} ctx={context}"
        kv_bytes = 2 * batch * context * s.hkv * s.head_dim * 2
        nbytes = kv_bytes + 2 * batch * s.hq * s.head_dim * 2  # K, V; q and the output
        sets = [
            (b.randn(batch, s.hq, s.head_dim), *_paged_kv(b, batch, context))
            for _ in range(b.sets_for(nbytes))
        ]
        splits = triton_ops.choose_num_splits(batch, s.hkv, context, b.sms())
        fns = [partial(triton_ops.paged_decode_attention, *x, scale) for x in sets]
        b.add("decode_attention", shape, f"triton (splits={splits})", fns, nbytes)
        if splits > 1:
            fns = [
                partial(triton_ops.paged_decode_attention, *x, scale, num_splits=1) for x in sets
            ]
            b.add("decode_attention", shape, "triton (no split)", fns, nbytes)
        if batch * context <= 256 * 1024:  # the per-sequence Python loop is slow beyond
            fns = [partial(reference.paged_decode_attention, *sets[0], scale)]
            b.add("decode_attention", shape, "torch-ref", fns, nbytes)
        del sets, fns
        q4 = b.randn(batch, s.hq, 1, s.head_dim)
        k4 = b.randn(batch, s.hkv, context, s.head_dim)
        v4 = b.randn(batch, s.hkv, context, s.head_dim)
        _torch_attention_rows(
            b, "decode_attention", shape, q4, k4, v4, False, nbytes, None, with_flex
        )

    n = s.prefill_len  # one prompt
    shape = f"1 x {n} tokens"
    flops = 4.0 * s.head_dim * s.hq * n * (n + 1) / 2  # QK^T and PV over the causal half
    nbytes = 2 * n * s.hq * s.head_dim * 2 + 2 * n * s.hkv * s.head_dim * 2
    k_cache, v_cache, tables, lens = _paged_kv(b, 1, n)
    q = b.randn(n, s.hq, s.head_dim)
    cu = torch.tensor([0, n], dtype=torch.int32, device=b.device)
    args = (q, k_cache, v_cache, cu, lens, tables, scale, n)
    for impl, attend in (
        ("triton", triton_ops.prefill_attention),
        ("torch-ref", reference.prefill_attention),
    ):
        b.add("prefill_attention", shape, impl, [partial(attend, *args)], nbytes, flops)
    q4 = q.transpose(0, 1)[None].contiguous()
    k4 = b.randn(1, s.hkv, n, s.head_dim)
    v4 = b.randn(1, s.hkv, n, s.head_dim)
    _torch_attention_rows(b, "prefill_attention", shape, q4, k4, v4, True, nbytes, flops, with_flex)


def bench_sampling(b: Bench) -> None:
    from sv_kernels import reference, triton_ops

    s = b.shapes
    for batch in s.sample_batches:
        nbytes = batch * s.vocab * 2
        sets = [b.randn(batch, s.vocab) * 3 for _ in range(b.sets_for(nbytes))]
        for impl, pick in (("triton", triton_ops.argmax), ("torch-ref", reference.argmax)):
            fns = [lambda x=x, pick=pick: pick(x) for x in sets]
            b.add("argmax", f"B={batch} V={s.vocab}", impl, fns, nbytes)
        dev = b.device
        filtered = (
            torch.full((batch,), 0.7, device=dev),
            torch.full((batch,), 50, dtype=torch.int32, device=dev),
            torch.full((batch,), 0.9, device=dev),
            torch.arange(batch, device=dev),
            torch.zeros(batch, dtype=torch.int64, device=dev),
        )
        plain = (
            filtered[0],
            torch.zeros_like(filtered[1]),
            torch.ones_like(filtered[2]),
            *filtered[3:],
        )
        for label, p, used in (
            ("T=0.7 top-k=50 top-p=0.9", filtered, True),
            ("T=0.7", plain, False),
        ):
            # The engine tells the Triton sampler which filters its rows use (host knowledge).
            hinted = partial(triton_ops.sample, any_top_k=used, any_top_p=used)
            for impl, draw in (("triton", hinted), ("torch-ref", reference.sample)):
                fns = [partial(draw, x, *p) for x in sets]
                b.add("sample", f"B={batch} {label}", impl, fns, nbytes)


def bench_token_logprobs(b: Bench) -> None:
    """The log-probabilities a step returns (FP32 logits, top 20): the Triton kernel beside
    the plain-torch two-stage path it replaced and the reference (full log_softmax + topk)."""
    from sv_kernels import reference, token_logprobs, triton_ops

    s = b.shapes
    for batch in s.sample_batches:
        nbytes = batch * s.vocab * 4  # the FP32 logits, read once; the outputs are small
        sets = [
            (b.randn(batch, s.vocab, dtype=torch.float32) * 4, torch.arange(batch, device=b.device))
            for _ in range(b.sets_for(nbytes))
        ]
        for impl, op in (
            ("triton", triton_ops.token_logprobs),
            ("torch two-stage top-k", token_logprobs.two_stage_topk),
            ("torch-ref", reference.token_logprobs),
        ):
            fns = [lambda x=x, op=op: op(x[0], x[1], 20) for x in sets]
            b.add("token_logprobs", f"B={batch} V={s.vocab} k=20", impl, fns, nbytes)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the benchmarks, print the table, return the rows (and write them with --json)."""
    parser = argparse.ArgumentParser(description="sv-kernels benchmarks")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    parser.add_argument("--skip-flex", action="store_true", help="skip compiled FlexAttention")
    parser.add_argument("--quick", action="store_true", help="shorter timing windows")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: check the script")
    parser.add_argument(
        "--only",
        help="comma-separated sections: elementwise,rope,attention,sampling,logprobs,gemv "
        "(default: all; gemv: every batch-1 GEMV tile on every decode-step matrix, BF16, FP8 "
        "and int8)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    sections: dict[str, Callable[[Bench], None]] = {
        "elementwise": bench_norm_swiglu_embedding,
        "rope": bench_rope_cache_write,
        "attention": lambda b: bench_attention(b, with_flex=not args.skip_flex),
        "sampling": bench_sampling,
        "logprobs": bench_token_logprobs,
        "gemv": bench_gemv,
    }
    chosen = list(sections) if args.only is None else args.only.split(",")
    # Checked before the device and the copy benchmark: a misspelt name used to be found
    # only after the copy was timed (or, without a GPU, not at all).
    unknown = [name for name in chosen if name not in sections]
    if unknown:
        parser.error(f"unknown --only section {unknown[0]!r} ({', '.join(sections)})")
    if torch.cuda.is_available():
        device = torch.device("cuda")
        name = torch.cuda.get_device_name(0)
    elif args.smoke:
        device, name = torch.device("cpu"), "cpu (Triton interpreter)"
    else:
        raise SystemExit("sv_kernels.bench needs a CUDA device (or --smoke)")

    started = time.perf_counter()
    torch.manual_seed(0)
    b = Bench(device, SMOKE if args.smoke else SERVING, quick=args.quick or args.smoke)
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    bench_copy(b)
    for section in (sections[name] for name in chosen):
        try:
            section(b)
        except Exception as error:  # keep what was measured so far
            print(f"section failed: {type(error).__name__}: {error}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(b.rows, b.copy_gbps)
    print(f"total {time.perf_counter() - started:.0f} s")
    rows = [asdict(row) for row in b.rows]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "copy_gbps": b.copy_gbps, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
