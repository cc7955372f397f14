"""CPU decode speed of the default model: sv FP32, sv int8 weights and transformers FP32, side by side.

    uv run --frozen python scripts/cpu-bench.py [--model DIR] [--tokens 64] [--rounds 3] [--threads N]
                                                [--kernels]

One greedy request (a short chat prompt, EOS ignored), decode tok/s from the first to the last
streamed token; transformers' `generate` on the same weights, its decode rate taken as the
extra tokens over the extra time between a 1-token and a (1 + tokens)-token call. The three
are measured in turns, `--rounds` times, in one process, so a shared machine's load falls on
all of them alike; each figure is the best round. Not a test: the figures depend on the host.

`--kernels` first times, in turns, torch's CPU kernels that could run a batch-1 step's matrices
(the model's own, int8 as sv quantizes them), and how far each one's output is from the
FP32 product: FP32 matmul, `torch._weight_int8pack_mm` (int8 weights, BF16 activations: what
sv runs), fbgemm's dynamic int8 GEMM (`quantized.linear_dynamic`, which also rounds the
activations to 7 bits per token) and fbgemm's FP16-weight GEMM (`linear_dynamic_fp16`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from sv_engine import Engine, SamplingParams
from sv_engine.default_model import default_model_dir
from sv_engine.options import positive_int

PROMPT = "Write a short story about a lighthouse keeper who builds a clock."


def sv_rate(engine: Engine, tokens: int) -> float:
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    times = [time.perf_counter() for _event in engine.stream([PROMPT], params)]
    return (len(times) - 1) / (times[-1] - times[0])


def hf_rate(model: object, ids: torch.Tensor, tokens: int) -> float:
    def run(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(  # type: ignore[attr-defined]
                ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )
        return time.perf_counter() - t0

    return tokens / (run(1 + tokens) - run(1))


def matmul_ms(engine: Engine) -> float:
    """One batch-1 decode step's matrices alone (every linear layer and the LM head, through
    `ops.linear` as the model calls it), in ms: the part of a step quantization shrinks."""
    from sv_kernels import ops

    weights = engine.runner.model.weights
    matrices = [
        m for layer in weights.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    matrices.append(weights.lm_head)
    inputs = [torch.randn(1, m.shape[1]) for m in matrices]
    with torch.inference_mode():
        for x, m in zip(inputs, matrices, strict=True):
            ops.linear(x, m)
        t0 = time.perf_counter()
        for x, m in zip(inputs, matrices, strict=True):
            ops.linear(x, m)
    return (time.perf_counter() - t0) * 1e3


def kernel_candidates(engine: Engine, rounds: int) -> None:
    """Time torch's candidate CPU kernels on one batch-1 step's matrices, in turns, and print
    the best round of each with its output error relative to the FP32 product."""
    import warnings

    from sv_kernels.quantized import quantize

    weights = engine.runner.model.weights
    matrices = [
        m for layer in weights.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    matrices.append(weights.lm_head)
    plain = [m for m in matrices if isinstance(m, torch.Tensor)]
    assert len(plain) == len(matrices), "--kernels needs the FP32 engine"
    int8 = [quantize(m, "int8") for m in plain]
    with warnings.catch_warnings():  # torch marks its quantized tensor types deprecated
        warnings.simplefilter("ignore")
        w8a8 = [
            torch.ops.quantized.linear_prepack(
                torch._make_per_channel_quantized_tensor(
                    q.data, q.scale.double(), torch.zeros(q.shape[0], dtype=torch.long), 0
                ),
                None,
            )
            for q in int8
        ]
        fp16 = [torch.ops.quantized.linear_prepack_fp16(m, None) for m in plain]
    ones = [torch.ones(q.shape[0], dtype=torch.bfloat16) for q in int8]
    xs = [torch.randn(1, m.shape[1]) for m in plain]
    kernels: dict[str, Callable[[int], torch.Tensor]] = {
        "FP32 matmul": lambda i: torch.nn.functional.linear(xs[i], plain[i]),
        "int8 weights, BF16 activations (_weight_int8pack_mm)": lambda i: (
            torch._weight_int8pack_mm(xs[i].to(torch.bfloat16), int8[i].data, ones[i]).float()
            * int8[i].scale
        ),
        "int8 weights and activations (fbgemm linear_dynamic)": lambda i: (
            torch.ops.quantized.linear_dynamic(xs[i], w8a8[i], True)
        ),
        "FP16 weights (fbgemm linear_dynamic_fp16)": lambda i: (
            torch.ops.quantized.linear_dynamic_fp16(xs[i], fp16[i])
        ),
    }
    best = dict.fromkeys(kernels, 1e9)
    errors = {}
    with torch.inference_mode():
        exact = [
            torch.nn.functional.linear(x.double(), m.double())
            for x, m in zip(xs, plain, strict=True)
        ]
        for name, run in kernels.items():
            out = [run(i) for i in range(len(plain))]  # also the warm-up
            errors[name] = max(
                float((o.double() - e).norm() / e.norm()) for o, e in zip(out, exact, strict=True)
            )
        for _ in range(rounds):
            for name, run in kernels.items():
                t0 = time.perf_counter()
                for i in range(len(plain)):
                    run(i)
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    fp32 = best["FP32 matmul"]
    print(f"batch-1 step's matrices ({len(plain)}), best of {rounds} rounds in turns:")
    for name in kernels:
        print(
            f"  {name}: {best[name]:.1f} ms ({fp32 / best[name]:.2f}x FP32), "
            f"largest error vs FP32 {errors[name]:.2%}"
        )


def cpu_model() -> str:
    """The processor's name and the vector extensions torch's int8 and BF16 kernels can use:
    the ratios differ from one processor to another (on the same code, the int8 matrices
    measured 2.2-2.4x FP32's speed on one session's machine and 5.0-5.3x on another's)."""
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in info.read_text().splitlines():  # the first processor's lines are enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", platform.machine())
    family = fields.get("cpu family", "?")
    flags = set(fields.get("flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
    found = " ".join(f for f in wanted if f in flags) or "none of " + ", ".join(wanted)
    return f"{name} (family {family}; {found})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder (default: the embedded default model)")
    # (a bad count used to fail after minutes of loading and measuring, with a traceback, or,
    # as --threads 0, to be ignored)
    p.add_argument("--tokens", type=positive_int, default=64)
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument(
        "--threads", type=positive_int, help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument("--kernels", action="store_true", help="time torch's candidate kernels first")
    args = p.parse_args()
    if args.tokens < 2:  # the rate is taken between the first token and the last
        p.error(f"argument --tokens: must be at least 2, got {args.tokens}")
    if args.model and not (Path(args.model) / "config.json").is_file():
        p.error(f"--model {args.model!r}: no config.json there (not a model folder)")
    if args.threads:
        # On a machine shared with other busy processes, one thread avoids OpenMP's barriers
        # waiting on a descheduled partner thread at every op.
        torch.set_num_threads(args.threads)
    import transformers

    model_dir = Path(args.model) if args.model else default_model_dir()
    engines = {
        "sv FP32": Engine.from_model_dir(model_dir, device="cpu", kv_cache_mib=64),
        "sv int8": Engine.from_model_dir(
            model_dir, device="cpu", kv_cache_mib=64, quantization="int8"
        ),
    }
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt_ids = engines["sv FP32"].tokenizer.chat_format.encode_user_prompt(PROMPT)
    ids = torch.tensor([prompt_ids])
    print(
        f"{cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; {args.tokens} new tokens, {len(prompt_ids)}-token prompt"
    )
    if args.kernels:
        kernel_candidates(engines["sv FP32"], max(3, args.rounds))
    best: dict[str, float] = {}
    for r in range(args.rounds):
        matmuls = {name: matmul_ms(engine) for name, engine in engines.items()}
        print(
            f"round {r + 1}: batch-1 matrices alone: "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in matmuls.items()),
            flush=True,
        )
        for name, value in matmuls.items():
            best[name + " matrices ms"] = min(best.get(name + " matrices ms", 1e9), value)
        figures = {name: sv_rate(engine, args.tokens) for name, engine in engines.items()}
        figures["transformers FP32"] = hf_rate(hf, ids, args.tokens)
        print(
            f"round {r + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True
        )
        for name, value in figures.items():
            best[name] = max(best.get(name, 0.0), value)
    fp32, int8, peer = best["sv FP32"], best["sv int8"], best["transformers FP32"]
    print("\n| decode tok/s (best of rounds) | sv FP32 | sv int8 | transformers FP32 |")
    print("|---|---|---|---|")
    print(f"| | {fp32:.1f} | {int8:.1f} | {peer:.1f} |")
    print(f"int8 / sv FP32 = {int8 / fp32:.2f}x, int8 / transformers FP32 = {int8 / peer:.2f}x")
    m32, m8 = best["sv FP32 matrices ms"], best["sv int8 matrices ms"]
    print(f"batch-1 matrices alone (best): FP32 {m32:.1f} ms, int8 {m8:.1f} ms = {m32 / m8:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
