"""Perplexity and mean KL divergence per token of quantized weights or FP8 KV pages against the
unquantized model.

    uv run --frozen python scripts/quality.py [--model DIR] [--device cpu] [--modes fp8,int8,fp8-kv]

Teacher-forced on a fixed held-out text committed to the repository (scripts/data/heldout.txt:
prose and Python code written for this purpose), cut into windows of --window tokens, each
scored from position 0. For each mode: perplexity of the text's next tokens, its ratio to the
unquantized model's, and the mean over positions of KL(p_unquantized || p_mode) in nats. The
unquantized model is the default dtype of the device (FP32 on the CPU, BF16 on CUDA).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from sv_engine import Engine
from sv_engine.default_model import default_model_dir
from sv_model import StepInputs

TEXT = Path(__file__).parent / "data" / "heldout.txt"
PAGE = 16
# What each mode changes from the unquantized model: the weights' type or the KV pages'.
MODES: dict[str, dict[str, Any]] = {
    "fp8": {"quantization": "fp8"},
    "int8": {"quantization": "int8"},
    "fp8-kv": {"kv_cache_dtype": "fp8"},
}


def window_log_probs(engine: Engine, ids: list[int]) -> torch.Tensor:
    """log p(next token) at every position of one window: [len(ids), V], FP32."""
    runner = engine.runner
    runner.set_block_tables([(0, list(range(-(-len(ids) // PAGE))))])
    n = len(ids)
    step = StepInputs(ids, list(range(n)), [0], [n], [n], [0])
    return torch.log_softmax(runner.logits(step, every_token=True).float(), dim=-1)


def score(engine: Engine, windows: list[list[int]]) -> list[torch.Tensor]:
    return [window_log_probs(engine, w) for w in windows]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder (default: the embedded default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)} (fp8-kv: unquantized weights, FP8 KV pages)",
    )
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--text", default=str(TEXT))
    args = p.parse_args()
    model_dir = Path(args.model) if args.model else default_model_dir()
    torch.manual_seed(0)
    base = Engine.from_model_dir(model_dir, device=args.device, kv_cache_mib=64)
    ids = base.tokenizer.encode(Path(args.text).read_text(encoding="utf-8"))
    windows = [ids[i : i + args.window] for i in range(0, len(ids), args.window)]
    windows = [w for w in windows if len(w) > 1]
    targets = [torch.tensor(w[1:]) for w in windows]
    print(f"{args.text}: {len(ids)} tokens in {len(windows)} windows of <= {args.window}")

    def nll(log_probs: list[torch.Tensor]) -> float:
        total = sum(
            float(-lp[:-1].gather(1, t[:, None]).sum())
            for lp, t in zip(log_probs, targets, strict=True)
        )
        return total / sum(len(t) for t in targets)

    t0 = time.perf_counter()
    reference = score(base, windows)
    del base
    base_ppl = math.exp(nll(reference))
    name = "FP32" if args.device == "cpu" else "BF16"
    print(f"{name:>5}: perplexity {base_ppl:.4f} ({time.perf_counter() - t0:.0f} s)")
    rows = [(name, base_ppl, 1.0, 0.0)]
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"--modes: unknown {', '.join(unknown)} (known: {', '.join(MODES)})")
    for mode in modes:
        t0 = time.perf_counter()
        engine = Engine.from_model_dir(
            model_dir, device=args.device, kv_cache_mib=64, **MODES[mode]
        )
        ours = score(engine, windows)
        del engine
        ppl = math.exp(nll(ours))
        kl_sum = sum(
            float((ref.exp() * (ref - mine)).sum())
            for ref, mine in zip(reference, ours, strict=True)
        )
        kl = kl_sum / sum(len(w) for w in windows)
        print(
            f"{mode:>5}: perplexity {ppl:.4f} ({ppl / base_ppl - 1:+.2%} vs {name}), "
            f"mean KL {kl:.5f} nats/token ({time.perf_counter() - t0:.0f} s)"
        )
        rows.append((mode, ppl, ppl / base_ppl, kl))
    print("\n| mode | perplexity | vs " + name + " | mean KL (nats/token) |")
    print("|---|---|---|---|")
    for mode, ppl, ratio, kl in rows:
        print(f"| {mode} | {ppl:.3f} | {ratio - 1:+.2%} | {kl:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
