"""`sv weights inspect PATH`: list the tensors of a safetensors file or a model folder.

For a folder it also reads config.json, prints its summary and checks the tensors against it;
a config.json sv cannot read (unsupported or malformed) is a note on stderr, after the tensors.
A checkpoint calibrated for an FP8 KV cache (`kv_cache_scheme`) gets a line on its K and V
scales: their range, and that only `--kv-cache-dtype fp8` uses them (a value the load refuses,
NaN, 0 or below, is an error here too); one whose quantization_config quantizes no weight (a
KV-cache-only calibration) gets a line saying its weights are unquantized.
Bad input prints one line on stderr and exits with status 2 (no traceback).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TextIO

from sv_engine.options import OneLineErrorParser
from sv_weights import (
    ModelConfig,
    SafetensorsHeader,
    WeightsError,
    read_header,
    validate_checkpoint,
)
from sv_weights.checkpoint import check_scale_range, checkpoint_infos, read_checkpoint_headers
from sv_weights.quantization import FP8Quantization, read_quantization
from sv_weights.safetensors import load_from_header

PROG = "sv weights inspect"


def inspect_main(
    argv: list[str], stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run the command with `argv` (the arguments after `inspect`). Returns the exit status."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = OneLineErrorParser(
        prog=PROG,
        description="List the tensors (name, dtype, shape, bytes) of a .safetensors file or of a "
        "model folder (config.json + model.safetensors or a sharded index), with totals.",
    )
    parser.add_argument("path", help="a .safetensors file or a model folder")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed usage (or --help)
        return int(exit_.code or 0)
    if not args.path.strip():  # (an unset shell variable: not this folder, as Path("") is)
        print(f"{PROG}: error: the path must not be empty", file=err)
        return 2
    path = Path(args.path)
    try:
        if path.is_dir():
            headers = read_checkpoint_headers(path)
            _print_table(headers, out)
            try:
                config = ModelConfig.from_model_dir(path)
                quantization = read_quantization(path)
            except WeightsError as exc:
                # The tensors are listed whatever config.json says: inspecting a checkpoint sv
                # cannot run (another architecture, another quantization) is what this is for.
                print(
                    f"{PROG}: note: {_one_line(exc)}; the tensors were not checked against it",
                    file=err,
                )
                return 0
            print(f"config: {config.summary()}", file=out)
            validate_checkpoint(config, checkpoint_infos(headers), str(path), quantization)
            print("check: tensors match config.json", file=out)
            if quantization is not None and not quantization.quantizes_weights:
                # Said, since the config does have a quantization_config: a KV-cache-only
                # calibration (or one that quantizes nothing) leaves the weights as listed.
                print("weights: unquantized (quantization_config has no config_groups)", file=out)
            if quantization is not None and quantization.kv_cache:
                print(f"kv cache: {_kv_scales(config, headers, quantization, str(path))}", file=out)
        else:
            _print_table([read_header(path)], out)
    except WeightsError as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=err)
        return 2
    return 0


def _kv_scales(
    config: ModelConfig,
    headers: list[SafetensorsHeader],
    quantization: FP8Quantization,
    source: str,
) -> str:
    """What a calibrated KV cache's scales are (validated) and what uses them."""
    found = quantization.check_kv_scales(
        config.num_hidden_layers, checkpoint_infos(headers), source
    )
    if not found:
        return "kv_cache_scheme without scales: --kv-cache-dtype fp8 uses scales of 1"
    values: dict[str, list[float]] = {"k_scale": [], "v_scale": []}
    files = set(found.values())
    for header in headers:
        if files.intersection(header.tensors):
            tensors = load_from_header(header, "cpu")  # mapped: only these few values are read
            # The load's check of their values: a range of NaN, 0 or below, printed as
            # scales the FP8 cache uses, would pass a checkpoint the load then refuses.
            check_scale_range(
                tensors, sorted(files.intersection(tensors)), source, "KV-cache scale"
            )
            for ours, name in found.items():
                if name in tensors:
                    values[ours.rsplit(".", 1)[1]].append(float(tensors[name].float()))
    ranges = ", ".join(f"{which[0]} {min(v):.4g}-{max(v):.4g}" for which, v in values.items())
    return (
        f"FP8 scales in all {config.num_hidden_layers} layers ({ranges}), used by "
        "--kv-cache-dtype fp8; a BF16 or FP32 cache does not need them"
    )


def _one_line(error: WeightsError) -> str:
    return " ".join(str(error).split())  # whatever the message holds


def _natural_key(name: str) -> list[tuple[int, int, str]]:
    """Sort key that puts layer 2 before layer 10. A run of ASCII digits (the odd parts of
    the split) is compared by its value as (digits without leading zeros, those digits), not
    by int(), which refuses a run past 4300 digits; the other parts as text, whatever digits
    of other scripts (or a "²", which str.isdigit accepts and int() does not) they hold."""
    parts = re.split(r"([0-9]+)", name)
    return [
        (0, len(part.lstrip("0")), part.lstrip("0")) if index % 2 else (1, 0, part)
        for index, part in enumerate(parts)
    ]


def _print_table(headers: list[SafetensorsHeader], out: TextIO) -> None:
    sharded = len(headers) > 1
    rows = [
        (
            name,
            info.dtype,
            "[" + ", ".join(map(str, info.shape)) + "]",
            info.nbytes,
            header.path.name,
        )
        for header in headers
        for name, info in sorted(header.tensors.items(), key=lambda item: _natural_key(item[0]))
    ]
    name_width = max([len("tensor"), *(len(row[0]) for row in rows)])
    shape_width = max([len("shape"), *(len(row[2]) for row in rows)])
    title = f"{'tensor':<{name_width}}  {'dtype':<7}  {'shape':<{shape_width}}  {'bytes':>13}"
    print(title + ("  file" if sharded else ""), file=out)
    for name, dtype, shape, nbytes, file_name in rows:
        line = f"{name:<{name_width}}  {dtype:<7}  {shape:<{shape_width}}  {nbytes:>13,}"
        print(line + (f"  {file_name}" if sharded else ""), file=out)
    total_bytes = sum(row[3] for row in rows)
    total_elements = sum(info.numel for header in headers for info in header.tensors.values())
    by_dtype: dict[str, int] = {}
    for row in rows:
        by_dtype[row[1]] = by_dtype.get(row[1], 0) + 1
    dtypes = ", ".join(f"{count} {dtype}" for dtype, count in sorted(by_dtype.items()))
    files = f" in {len(headers)} files" if sharded else ""
    print(
        f"total: {len(rows)} tensors{files} ({dtypes or 'none'}), {total_elements:,} elements, "
        f"{total_bytes:,} bytes ({total_bytes / 2**20:.1f} MiB)",
        file=out,
    )
