"""Serving benchmark: `sv serve` under N concurrent streaming clients.

    python apps/server/bench/bench_serve.py MODEL_DIR [--clients 64] [--requests 256]
        [--prompt-len 100:1024] [--max-tokens 128] [--omit-max-tokens 0.5]
        [--admission preemptive|conservative] [--json out.json]

Starts the server in a child process (`python -m sv_server`, so the clients here do not share
its interpreter), waits for /health, warms it up, then sends `--requests` streaming
/v1/completions requests through `--clients` concurrent connections. Prompts are random token
ids (`random.Random(seed)`), EOS is ignored so every request generates exactly `--max-tokens`.
`--omit-max-tokens F` sends that fraction of the requests (every other one for 0.5) as chat
requests without `max_tokens`, as most chat clients do (a user message of common words, about
as many tokens as the prompt length drawn): those run to the context limit (`--max-model-len`),
and show what the admission policy does with requests of unknown length beside short ones.

Reports requests/s, output tokens/s, time to first token (p50/p90/p99; also for the requests
with and without max_tokens apart), inter-token latency, end-to-end latency and the server's
preemptions, as one JSON object (last line of stdout, and `--json`). `client_cpu_fraction`
is this process's CPU time over the wall time: near 1.0 means the clients, not the server,
were the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


@dataclass
class Result:
    ok: bool
    sent: float
    first: float | None = None
    end: float = 0.0
    tokens: int = 0
    error: str = ""
    bounded: bool = True  # sent with max_tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "sv_server",
        "--model",
        str(args.model_dir),
        "--port",
        str(port),
        "--device",
        args.device,
        "--max-queue",
        str(max(args.requests, 1)),
        "--log-level",
        "warning",
    ]
    if args.kv_cache_mib:
        command += ["--kv-cache-mib", str(args.kv_cache_mib)]
    if args.max_model_len:
        command += ["--max-model-len", str(args.max_model_len)]
    if args.admission:
        command += ["--admission", args.admission]
    print(f"[bench_serve] starting: {' '.join(command)}", file=sys.stderr, flush=True)
    return subprocess.Popen(command, env=os.environ.copy())


def wait_ready(url: str, server: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode} before it was up")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                data: dict[str, Any] = httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]
                return data
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not up after {timeout:.0f} s")


def make_prompts(
    count: int, lengths: tuple[int, int], vocab_size: int, seed: int
) -> list[list[int]]:
    """`count` prompts of random token ids, lengths uniform in `lengths` (inclusive)."""
    rng = random.Random(seed)
    top = min(vocab_size, 128000) - 1  # stay below Llama 3's special tokens
    return [[rng.randint(0, top) for _ in range(rng.randint(*lengths))] for _ in range(count)]


WORDS = (
    *("the", "sea", "river", "light", "stone", "city", "garden", "window", "morning"),
    *("winter", "paper", "music", "story", "quiet", "bright", "small", "green", "old"),
    *("house", "road", "north", "summer", "letter", "friend", "table", "water", "mountain"),
)


def chat_text(prompt: list[int]) -> str:
    """A user message of common words (about one token each), as long as `prompt`, from it."""
    return " ".join(WORDS[token % len(WORDS)] for token in prompt)


async def one_request(
    http: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int | None
) -> Result:
    """One streamed request: a completion of token ids with `max_tokens`, or (None) a chat
    request without it, which the server lets run to the context limit."""
    body: dict[str, Any] = {
        "model": model,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if max_tokens is not None:
        path = "/v1/completions"
        body |= {"prompt": prompt, "max_tokens": max_tokens}
    else:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": chat_text(prompt)}]
    result = Result(ok=False, sent=time.perf_counter(), bounded=max_tokens is not None)
    tail = b""
    try:
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            # Count nothing per chunk here (parsing every event would make the clients the
            # bottleneck): note the first bytes' time, keep the tail for the usage chunk.
            async for data in response.aiter_bytes():
                if result.first is None and b"data: " in data:
                    result.first = time.perf_counter()
                tail = (tail + data)[-4096:]
        result.end = time.perf_counter()
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    events = [e for e in tail.decode(errors="replace").split("\n\n") if e.startswith("data: {")]
    if not tail.rstrip().endswith(b"data: [DONE]") or not events:
        result.error = "the stream did not end with a usage chunk and [DONE]"
        return result
    last = json.loads(events[-1].removeprefix("data: "))
    if "error" in last:
        result.error = str(last["error"])
        return result
    result.tokens = int(last["usage"]["completion_tokens"])
    result.ok = True
    return result


def omits_max_tokens(index: int, fraction: float) -> bool:
    """Whether request `index` goes without max_tokens: spread evenly, `fraction` of them."""
    return int((index + 1) * fraction) > int(index * fraction)


async def drive(
    url: str,
    model: str,
    prompts: list[list[int]],
    clients: int,
    max_tokens: int,
    omit_fraction: float = 0.0,
) -> tuple[list[Result], float]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    queue: asyncio.Queue[tuple[list[int], int | None]] = asyncio.Queue()
    for i, prompt in enumerate(prompts):
        queue.put_nowait((prompt, None if omits_max_tokens(i, omit_fraction) else max_tokens))
    results: list[Result] = []

    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as http:

        async def client() -> None:
            while not queue.empty():
                prompt, limit = queue.get_nowait()
                results.append(await one_request(http, model, prompt, limit))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    return results, wall


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(results: list[Result], wall: float, cpu: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = [r.first - r.sent for r in ok if r.first is not None]
    latency = [r.end - r.sent for r in ok]
    itl = [(r.end - r.first) / (r.tokens - 1) for r in ok if r.first is not None and r.tokens > 1]
    tokens = sum(r.tokens for r in ok)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1e3, 2)

    def ttft_of(bounded: bool) -> dict[str, float | None]:
        values = [r.first - r.sent for r in ok if r.first is not None and r.bounded is bounded]
        return {"p50": ms(_percentile(values, 50)), "p99": ms(_percentile(values, 99))}

    return {
        "requests": len(results),
        "succeeded": len(ok),
        "failed": len(results) - len(ok),
        "first_errors": sorted({r.error for r in results if not r.ok})[:5],
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(ok) / wall, 3),
        "output_tokens": tokens,
        "output_tok_per_s": round(tokens / wall, 1),
        "ttft_ms": {"p50": ms(_percentile(ttft, 50)), "p90": ms(_percentile(ttft, 90)),
                    "p99": ms(_percentile(ttft, 99)), "mean": ms(statistics.fmean(ttft) if ttft else None)},
        "ttft_ms_with_max_tokens": ttft_of(True),
        "ttft_ms_without_max_tokens": ttft_of(False),
        "itl_ms": {"p50": ms(_percentile(itl, 50)), "p99": ms(_percentile(itl, 99)),
                   "mean": ms(statistics.fmean(itl) if itl else None)},
        "latency_ms": {"p50": ms(_percentile(latency, 50)), "p99": ms(_percentile(latency, 99))},
        "client_cpu_fraction": round(cpu / wall, 3),
    }  # fmt: skip


def _prompt_len(text: str) -> tuple[int, int]:
    try:
        lo, _, hi = text.partition(":")
        bounds = (int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LO:HI, got {text!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return bounds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_serve", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path, help="model folder to serve")
    p.add_argument("--clients", type=int, default=64, help="concurrent streaming clients")
    p.add_argument("--requests", type=int, default=256, help="requests in all")
    p.add_argument("--prompt-len", type=_prompt_len, default=(100, 1024), metavar="LO:HI")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument(
        "--omit-max-tokens",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction of requests sent without max_tokens (they run to the context limit)",
    )
    p.add_argument("--admission", choices=["conservative", "preemptive"], help="server policy")
    p.add_argument("--warmup", type=int, default=8, help="requests before timing")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--device", default="auto")
    p.add_argument("--kv-cache-mib", type=float)
    p.add_argument("--max-model-len", type=int)
    p.add_argument(
        "--startup-timeout", type=float, default=900.0, help="seconds to wait for /health"
    )
    p.add_argument("--url", help="benchmark a server already running here instead of starting one")
    p.add_argument("--json", type=Path, help="also write the report here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.max_tokens < 1:
        print(
            "bench_serve: error: --clients, --requests, --max-tokens must be >= 1", file=sys.stderr
        )
        return 2
    if not 0.0 <= args.omit_max_tokens <= 1.0:
        print("bench_serve: error: --omit-max-tokens is a fraction in 0..1", file=sys.stderr)
        return 2
    server = None
    url = args.url
    if url is None:
        if not (args.model_dir / "config.json").is_file():
            print(f"bench_serve: error: {args.model_dir} has no config.json", file=sys.stderr)
            return 2
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_server(args, port)
    try:
        t0 = time.perf_counter()
        if server is not None:
            card = wait_ready(url, server, args.startup_timeout)
        else:
            card = httpx.get(f"{url}/v1/models").json()["data"][0]
        startup = time.perf_counter() - t0
        config = json.loads((args.model_dir / "config.json").read_text())
        vocab_size = int(config.get("vocab_size", 32000))
        prompts = make_prompts(args.requests, args.prompt_len, vocab_size, args.seed)
        model = card["id"]
        if args.warmup:  # compiles kernels, captures CUDA graphs: not part of the measurement
            warm = make_prompts(args.warmup, args.prompt_len, vocab_size, args.seed + 1)
            warm_results, _ = asyncio.run(drive(url, model, warm, args.clients, 8))
            failed = [r.error for r in warm_results if not r.ok]
            if failed:
                raise RuntimeError(f"warm-up requests failed: {failed[:3]}")
        cpu0 = time.process_time()
        results, wall = asyncio.run(
            drive(url, model, prompts, args.clients, args.max_tokens, args.omit_max_tokens)
        )
        report = summarize(results, wall, time.process_time() - cpu0)
        report["config"] = {
            "model": model,
            "model_dir": str(args.model_dir),
            "max_model_len": card.get("max_model_len"),
            "clients": args.clients,
            "prompt_len": list(args.prompt_len),
            "max_tokens": args.max_tokens,
            "omit_max_tokens": args.omit_max_tokens,
            "admission": args.admission or "the server's default",
            "server_startup_s": round(startup, 1),
        }
        try:
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
            for key, name in (
                ("server_prefix_cache_hit_tokens", "sv_prefix_cache_hit_tokens_total"),
                ("server_preemptions", "sv_preemptions_total"),
                ("server_recomputed_tokens", "sv_recomputed_tokens_total"),
            ):
                report[key] = next(
                    (float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith(f"{name} ")), None
                )  # fmt: skip
        except httpx.HTTPError:
            pass
    except RuntimeError as e:
        print(f"bench_serve: error: {e}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    text = json.dumps(report, indent=1)
    print(
        f"[bench_serve] {report['succeeded']}/{report['requests']} ok, "
        f"{report['requests_per_s']} req/s, {report['output_tok_per_s']} output tok/s, "
        f"TTFT p50 {report['ttft_ms']['p50']} ms p99 {report['ttft_ms']['p99']} ms",
        file=sys.stderr,
    )
    if args.json:
        args.json.write_text(text + "\n")
    print(json.dumps(report))
    return 0 if report["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
