"""Command-line options shared by every app that loads a model (`sv generate`, `sv chat`,
`sv serve`): one definition, so the apps cannot drift apart."""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from sv_kernels import TuningCache
from sv_kernels.quantized import QUANT_KINDS, QuantKind
from sv_scheduler import Admission, SchedulerError, SpeculationConfig, check_batch_limits
from sv_tokenizer import TokenizerError, check_utf8
from sv_weights import WeightsError
from sv_weights.quantization import read_quantization

from sv_engine.cache_folder import cache_dir
from sv_engine.default_model import default_model_dir
from sv_engine.engine import Engine
from sv_engine.errors import EngineError
from sv_engine.loading import (
    KV_CACHE_DTYPES,
    EngineConfig,
    check_gpu_memory_utilization,
    resolve_device,
)
from sv_engine.ranks import serve_torchrun_rank, torchrun_rank
from sv_engine.tracing import start_trace

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

EXIT_USAGE = 2
_SPECULATION = SpeculationConfig()  # the defaults --spec-k and --spec-ngram show
_ENGINE = EngineConfig()  # the defaults --max-num-seqs and --max-num-batched-tokens show
# --dtype's names (vLLM's): None is the device's default (BF16 on CUDA, FP32 on the CPU).
DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
}


class _MissingRequired(Exception):
    """argparse's "the following arguments are required" met inside a parse: held back until
    the arguments the parser did not know have been looked for (they are reported first)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# argparse's messages for a required argument, or a required group's, that was not given.
_MISSING_REQUIRED = re.compile(
    r"the following arguments are required: (?P<names>.*)|one of the arguments .* is required"
)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2; an unknown option is
    reported before a missing argument (argparse checks the required ones first, so `sv generate
    --no-such-flag` said PROMPT was missing); a missing positional after an option of several
    values says that option took them; and help that cannot be written is an error."""

    _parsing = False  # inside parse_known_args: a missing argument is held back, not reported

    def error(self, message: str) -> NoReturn:
        if self._parsing and _MISSING_REQUIRED.fullmatch(message):
            raise _MissingRequired(message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse ignores an OSError here: `sv --help > /dev/full` printed nothing and exited
        # 0. Standard output's is raised, for `sv` to report (stderr's is still ignored: an
        # error message that cannot be written has nowhere else to go).
        if message and file is not None and file is sys.stdout:
            file.write(message)
            return
        super()._print_message(message, file)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        given = sys.argv[1:] if args is None else list(args)
        self._parsing = True
        try:
            parsed, extras = super().parse_known_args(given, namespace)
        except _MissingRequired as missing:
            self._parsing = False  # from here on, error() reports (and exits)
            self._missing_required(given, missing.message)
        finally:
            self._parsing = False
        if extras and not hasattr(parsed, _EXTRAS_PARSER):
            setattr(parsed, _EXTRAS_PARSER, self)  # the innermost subcommand's, first
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an unknown argument is reported by the subcommand that did not
        know it (`sv generate: error: ... (see sv generate --help)`), not by `sv`, whose help
        does not list the subcommand's options."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser: OneLineErrorParser = getattr(parsed, _EXTRAS_PARSER)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        if hasattr(parsed, _EXTRAS_PARSER):
            delattr(parsed, _EXTRAS_PARSER)
        return parsed

    def _missing_required(self, given: list[str], message: str) -> NoReturn:
        """Report an argument that `given` lacks (`message`, argparse's), unless `given` also
        holds one this parser does not know: that is the mistake to fix first (a mistyped
        option, whose value argparse may then have taken as the missing positional)."""
        required = [a for a in self._actions if a.required]
        groups = [g for g in self._mutually_exclusive_groups if g.required]
        for action in required:
            action.required = False
        for group in groups:
            group.required = False
        try:  # the same arguments with nothing required: what is left over is unknown
            parsed, extras = super().parse_known_args(given, None)
        finally:
            for action in required:
                action.required = True
            for group in groups:
                group.required = True
        if extras:
            parser: OneLineErrorParser = getattr(parsed, _EXTRAS_PARSER, self)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        self.error(message + self._list_option_hint(given, message))

    def _list_option_hint(self, given: list[str], message: str) -> str:
        """Where a positional is missing because an option of several values (nargs + or *,
        e.g. --bad-words) came last and took every argument after it: how to end its list."""
        missing = _MISSING_REQUIRED.fullmatch(message)
        names = (missing.group("names") or "").split(", ") if missing else []
        positionals = [a for a in self._actions if not a.option_strings]
        positional = next((n for n in names for a in positionals if n == _name(a)), None)
        if positional is None:
            return ""
        last: argparse.Action | None = None  # the option the arguments since it went to
        taken: list[str] = []
        for arg in given:
            if arg == "--":  # every argument after it is a positional: none was taken
                return ""
            if arg[:1] in self.prefix_chars and len(arg) > 1:
                action = self._option_string_actions.get(arg)  # (`--opt=value`: one value)
                last, taken = (action, []) if action and action.nargs in ("+", "*") else (None, [])
            elif last is not None:
                taken.append(arg)
        if last is None or not taken:
            return ""
        option = last.option_strings[-1]
        metavar = last.metavar if isinstance(last.metavar, str) else "VALUE"
        return (
            f" ({option} took {' '.join(map(repr, taken))} as its {metavar.lower()}s, which run "
            f"to the next flag: end them with --, as in `{option} {metavar} ... -- {positional}`)"
        )


def _name(action: argparse.Action) -> str:
    """A positional's name in argparse's messages: its metavar, else its dest."""
    return action.metavar if isinstance(action.metavar, str) else action.dest


_EXTRAS_PARSER = "_sv_extras_parser"  # the parser that met unknown arguments (in a Namespace)


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1, got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


ADMISSION_HELP = {
    "conservative": "reserve each request's whole budget (prompt + max new tokens) when it "
    "starts: never preempts, but a long request holds pages it may never use",
    "preemptive": "start a request when its prompt's pages fit, grow on demand, and when pages "
    "run out preempt the newest running request (it recomputes later)",
}


def add_engine_arguments(p: argparse.ArgumentParser, *, admission: Admission) -> None:
    """--model, --kv-cache-mib, --gpu-memory-utilization, --kv-cache-dtype, --device,
    --dtype, --max-model-len, --max-num-seqs, --max-num-batched-tokens, --admission,
    --[no-]enable-prefix-caching, --chat-template, --trace, --no-overlap, --quantization,
    --speculate with --spec-k, --spec-ngram and --spec-max-batch, --tensor-parallel-size
    (those vLLM has too take its names and meanings).
    `admission` is this app's default policy."""
    p.add_argument(
        "--model",
        metavar="DIR",
        help="model folder (config.json, model.safetensors, tokenizer); "
        "default: the embedded SmolLM2-135M-Instruct",
    )
    p.add_argument(
        "--kv-cache-mib",
        type=positive_float,
        metavar="N",
        help="KV-cache pool size in MiB (default: most free GPU memory, or 256 MiB on the CPU)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=fraction,
        metavar="F",
        help="on CUDA, the share (0 < F <= 1) of the GPU's whole memory the engine may use, "
        "weights included: the KV pool takes 0.85 of what is left of F times the GPU's memory "
        "once the weights are loaded (no more than is free), the rest is for activations "
        "(default: 0.85 of the memory free after the weights, which F never exceeds; not with "
        "--kv-cache-mib, and not on the CPU, where --kv-cache-mib sizes the pool)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (default: CUDA when present), cuda or cpu"
    )
    p.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="auto",
        help="the weights' and activations' dtype: auto (default: bfloat16 on CUDA, float32 on "
        "the CPU), bfloat16, float16 (or half), float32 (or float)",
    )
    p.add_argument(
        "--max-model-len",
        type=positive_int,
        metavar="N",
        help="context limit in tokens (default: the model's max_position_embeddings)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=_ENGINE.max_num_seqs,
        metavar="N",
        help=f"most requests running at once, the largest decode batch "
        f"(default {_ENGINE.max_num_seqs}); the others wait",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=_ENGINE.max_step_tokens,
        metavar="N",
        help=f"most tokens one step computes, prompt chunks and decodes together (default "
        f"{_ENGINE.max_step_tokens}); longer prompts are computed in chunks; at least "
        "--max-num-seqs",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=_ENGINE.prefix_caching,
        help="reuse the KV pages of a prompt's opening that an earlier or running request "
        "already computed (default on; --no-enable-prefix-caching computes every prompt whole)",
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE_OR_TEXT",
        help="a jinja chat template, as a file or (when no such file exists and it holds "
        "'{', '}' or a newline) the text itself, with backslash escapes such as \\n "
        "decoded: replaces the model folder's for every chat prompt, checked at load as the "
        "folder's is",
    )
    p.add_argument(
        "--admission",
        choices=sorted(ADMISSION_HELP),
        default=admission,
        help=f"how requests share the KV-cache pool (default {admission}): "
        + "; ".join(f"{name}: {text}" for name, text in sorted(ADMISSION_HELP.items())),
    )
    p.add_argument(
        "--quantization",
        choices=("auto", *QUANT_KINDS, "none"),
        default="auto",
        help="quantize the weight matrices at load: fp8 (e4m3) or int8, one scale per output "
        "channel, half the bytes of BF16 per decode step (int8 quantizes an FP8 checkpoint's "
        "matrices again); none: the checkpoint's own dtypes (an FP8 checkpoint's matrices stay "
        "FP8 on CUDA); the CPU has no FP8 kernel: there FP8 matrices (fp8's, or a "
        "checkpoint's) are dequantized at load, FP8's values at FP32's speed and size; auto "
        "(default): int8 on the CPU, where its perplexity on the default model is within "
        "0.5%% of FP32's (BENCHMARKS.md), none on CUDA and for a checkpoint whose weights come "
        "quantized (FP8; one that calibrates only its KV cache counts as plain)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="KV-cache storage: auto (default: the weights' dtype) or fp8 (e4m3: one byte per "
        "value, so the same pool holds twice the tokens of BF16's, CUDA's default, and four "
        "times FP32's, the CPU's)",
    )
    add_tensor_parallel_argument(p)
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="record every step into FILE, one JSON line each (the plan, admissions and waits, "
        "pages, sampled tokens with their top-5 logprobs, timings); `sv trace report FILE` "
        "draws it",
    )
    p.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="run the plain step loop: wait for each step's tokens before planning the next "
        "(same output, slower; for debugging and comparison)",
    )
    p.add_argument(
        "--speculate",
        choices=["ngram"],
        help="speculative decoding: ngram drafts the next tokens by looking the last few up in "
        "the prompt and output, and one step verifies them (same output; faster where the "
        "output repeats its input: summaries, rewrites, code edits)",
    )
    # The --spec-* defaults are None, so that one given without --speculate can be refused
    # (speculation_from_args); the help states the values they stand for.
    p.add_argument(
        "--spec-k",
        type=positive_int,
        metavar="K",
        help=f"with --speculate: most draft tokens per step (default {_SPECULATION.max_draft}, "
        "the most a CUDA graph verifies)",
    )
    p.add_argument(
        "--spec-ngram",
        type=positive_int,
        metavar="N",
        help=f"with --speculate ngram: longest suffix looked up (default {_SPECULATION.ngram}); "
        f"when it is not found, shorter ones down to {_SPECULATION.min_ngram}",
    )
    p.add_argument(
        "--spec-max-batch",
        type=non_negative_int,
        metavar="N",
        help="with --speculate: no drafts while more than N requests are running or "
        "waiting (a step with drafts cannot overlap with the one before it, which costs more "
        f"than it saves in a large batch); 0: no limit (default {_SPECULATION.max_batch})",
    )


def add_tensor_parallel_argument(p: argparse.ArgumentParser, pool_flag: bool = True) -> None:
    """--tensor-parallel-size (also `sv bench`'s, which has no --kv-cache-mib: `pool_flag`
    False leaves its mention out of the help)."""
    per_rank = "and --kv-cache-mib is per rank; " if pool_flag else ""
    p.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="split the model over N ranks, one process and one GPU each (this process is "
        "rank 0 and starts the others; under torchrun, its processes are the ranks): each "
        f"holds 1/N of the attention heads, KV heads and MLP, {per_rank}"
        "N must divide the model's attention and key/value heads (default 1)",
    )


def resolve_quantization(
    choice: str, device: str, model_dir: Path | None = None
) -> QuantKind | None:
    """What --quantization asks for on `device`: "auto" is int8 on the CPU (a quarter of FP32's
    bytes per decode step, its perplexity within 1% of FP32's) and none on CUDA; and none for
    a checkpoint in `model_dir` whose weights come quantized (its author chose which matrices
    stay BF16, such as the LM head: auto keeps that choice). A checkpoint calibrated for its
    KV cache alone has plain weights, chosen by no one, and gets what a plain one gets: its
    scales serve `--kv-cache-dtype fp8` whatever the weights are. On the CPU, an FP8 checkpoint
    re-quantized to int8 measured +1.03% perplexity over its own values (default model,
    scripts/quality.py), past the 1% the CPU default must keep: it is dequantized at load."""
    if choice == "none":
        return None
    if choice == "auto":
        if model_dir is not None and _comes_quantized(model_dir):
            return None
        return "int8" if resolve_device(device).type == "cpu" else None
    if choice not in QUANT_KINDS:
        raise EngineError(f"--quantization must be auto, fp8, int8 or none, got {choice!r}")
    return "fp8" if choice == "fp8" else "int8"


def _comes_quantized(model_dir: Path) -> bool:
    """Whether model_dir's config.json has a quantization_config that quantizes weights (or
    one the load then refuses with its own message, if it cannot read it). One with no config
    group (a KV-cache-only calibration, or a config that quantizes nothing) leaves every
    weight plain, and auto treats the checkpoint as plain."""
    try:
        scheme = read_quantization(model_dir)
    except WeightsError:
        return True
    return scheme is not None and scheme.quantizes_weights


GEMV_TUNING_FILE = "gemv-tuning.json"


def default_tuning_cache() -> TuningCache:
    """The apps' GEMV tuning cache: gemv-tuning.json in sv's cache folder ($SV_CACHE_DIR, else
    ~/.cache/sv); SV_RETUNE=1 in the environment measures again (and replaces what was kept)."""
    retune = os.environ.get("SV_RETUNE", "") not in ("", "0")
    return TuningCache(cache_dir() / GEMV_TUNING_FILE, retune=retune)


def speculation_from_args(args: argparse.Namespace) -> SpeculationConfig | None:
    """The speculation --speculate, --spec-k, --spec-ngram and --spec-max-batch ask for (None:
    off). A --spec-* flag without --speculate is an EngineError: it would change nothing."""
    if getattr(args, "speculate", None) is None:
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("spec_k", "spec_ngram", "spec_max_batch")
            if getattr(args, name, None) is not None
        ]
        if given:
            raise EngineError(
                f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --speculate ngram "
                "(without it, speculative decoding is off)"
            )
        return None
    max_batch = _SPECULATION.max_batch if args.spec_max_batch is None else args.spec_max_batch
    try:
        return SpeculationConfig(
            max_draft=_SPECULATION.max_draft if args.spec_k is None else args.spec_k,
            ngram=_SPECULATION.ngram if args.spec_ngram is None else args.spec_ngram,
            max_batch=max_batch or None,  # 0: no limit
        )
    except SchedulerError as e:
        raise EngineError(str(e)) from e


def check_batch_limits_args(args: argparse.Namespace) -> None:
    """--max-num-batched-tokens below --max-num-seqs is an EngineError naming both flags (the
    scheduler's rule: one decode token of every running request fits in a step)."""
    seqs = getattr(args, "max_num_seqs", _ENGINE.max_num_seqs)
    tokens = getattr(args, "max_num_batched_tokens", _ENGINE.max_step_tokens)
    try:
        check_batch_limits(seqs, tokens)
    except SchedulerError:
        raise EngineError(
            f"--max-num-batched-tokens ({tokens}) must be at least --max-num-seqs ({seqs}): "
            "every running request decodes one token per step"
        ) from None


JINJA_CHARACTERS = "{}\n"  # vLLM's test: a --chat-template holding one is text, not a path


def chat_template_from_args(args: argparse.Namespace) -> tuple[str, str] | None:
    """The --chat-template text and how messages name it, as vLLM reads the flag: the file
    it names; else, when it holds a jinja character, the text itself with backslash escapes
    decoded (a shell passes \\n as two characters); else an EngineError."""
    value: str | None = getattr(args, "chat_template", None)
    if value is None:
        return None
    if not value.strip():  # (an unset shell variable; an empty path reads as ".")
        raise EngineError("--chat-template must not be empty")
    try:
        return Path(value).read_text(encoding="utf-8"), f"--chat-template {value}"
    except UnicodeDecodeError:
        raise EngineError(f"--chat-template {value}: not UTF-8 text") from None
    except OSError as e:
        if not any(character in value for character in JINJA_CHARACTERS):
            raise EngineError(
                f"--chat-template {value}: cannot read the file ({e.strerror or e}); a "
                "template given as text holds '{', '}' or a newline"
            ) from None
    try:  # non-ASCII characters survive as escapes, and come back as themselves
        with warnings.catch_warnings():  # an unknown escape (\\q) stays as it is, as in vLLM
            warnings.simplefilter("ignore", DeprecationWarning)
            text = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise EngineError(f"--chat-template (text): a bad backslash escape: {e.reason}") from None
    check_flag_utf8(text, "--chat-template (text)")  # (else U+FFFD in every prompt)
    return text, "--chat-template (text)"


def check_flag_utf8(text: str, flag: str) -> None:
    """An EngineError naming `flag` if its `text` holds bytes that were not UTF-8 (Python
    passes them on as lone surrogates, which encoding silently turns into U+FFFD)."""
    try:
        check_utf8(text, flag)
    except TokenizerError as e:
        raise EngineError(str(e)) from None


def engine_from_args(args: argparse.Namespace, **overrides: Any) -> tuple[Engine, Path]:
    """The engine the options of `add_engine_arguments` ask for, and its model folder.

    Without --model the embedded default model is used (converted into the cache on first
    use, with a progress line on stderr). A GPU warm-up reports its phases on stderr too.
    Every failure is an EngineError with a one-line message.

    In a process torchrun launched as a rank other than 0, this serves rank 0's steps
    instead, and the process exits when rank 0 stops (it never returns)."""
    rank = torchrun_rank()
    if rank is not None and rank != 0:
        serve_torchrun_rank(args.device)
        raise SystemExit(0)
    # Usage errors: found before any conversion or load.
    speculation = speculation_from_args(args)
    check_batch_limits_args(args)
    share = getattr(args, "gpu_memory_utilization", None)
    if share is not None:  # the engine's own check, in the flags' names
        check_gpu_memory_utilization(
            share,
            args.kv_cache_mib,
            resolve_device(args.device),
            names=("--gpu-memory-utilization", "--kv-cache-mib"),
        )
    chat_template = chat_template_from_args(args)
    if args.model == "":  # (an unset shell variable: not the current folder's model)
        raise EngineError("--model must not be empty")
    trace = getattr(args, "trace", None)
    if trace is not None and (reason := cannot_write(trace)) is not None:
        raise EngineError(f"--trace: cannot write the trace file {trace!r}: {reason}")
    try:
        return _load_engine(args, speculation, chat_template, overrides)
    except EngineError as e:
        if e.field == "max_model_len":  # the flag's name
            raise e.named("--max-model-len") from None
        raise


def cannot_write(path: str) -> str | None:
    """Why a file cannot be written at `path` (the OS's reason), or None. For a file written
    only after long work (--trace after the load, `sv bench --json` after the run): checked
    by opening it for append, which keeps an existing file as it is; a file the check
    created is removed again."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    if not existed:
        os.unlink(path)
    return None


def _model_file(path: str, model_dir: Path) -> str | None:
    """The name of the model folder's file that `path` is (through any link), or None: a
    trace written over config.json or the weights (mapped while they run) loses the model."""
    if not os.path.isfile(path) or not model_dir.is_dir():
        return None
    for entry in model_dir.iterdir():
        try:
            if entry.is_file() and os.path.samefile(path, entry):
                return entry.name
        except OSError:  # (a broken link in the folder)
            continue
    return None


def _load_engine(
    args: argparse.Namespace,
    speculation: SpeculationConfig | None,
    chat_template: tuple[str, str] | None,
    overrides: dict[str, Any],
) -> tuple[Engine, Path]:
    if args.model is not None:
        model_dir = Path(args.model)
    else:
        model_dir = default_model_dir(progress=lambda message: print(message, file=sys.stderr))
    trace = getattr(args, "trace", None)
    if trace is not None and (clash := _model_file(trace, model_dir)) is not None:
        raise EngineError(
            f"--trace {trace!r}: that is the model folder's {clash}, which the trace would "
            "overwrite: name another file"
        )
    quantization = resolve_quantization(
        getattr(args, "quantization", "auto"), args.device, model_dir
    )
    if quantization == "fp8" and resolve_device(args.device).type == "cpu":
        print(
            "sv: note: the CPU has no FP8 kernel: --quantization fp8 rounds the weights to FP8 "
            "and holds them in FP32 (FP8's outputs at FP32's speed and memory); int8, the "
            "CPU's default, is the fast one",
            file=sys.stderr,
        )
    engine = Engine.from_model_dir(
        model_dir,
        device=args.device,
        kv_cache_mib=args.kv_cache_mib,
        max_model_len=args.max_model_len,
        admission=args.admission,
        kv_cache_dtype=args.kv_cache_dtype,
        speculation=speculation,
        tuning_cache=default_tuning_cache(),
        quantization=quantization,
        progress=lambda message: print(f"sv: {message}", file=sys.stderr, flush=True),
        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
        max_num_seqs=getattr(args, "max_num_seqs", _ENGINE.max_num_seqs),
        max_step_tokens=getattr(args, "max_num_batched_tokens", _ENGINE.max_step_tokens),
        dtype=DTYPES[getattr(args, "dtype", "auto")],
        prefix_caching=getattr(args, "enable_prefix_caching", _ENGINE.prefix_caching),
        gpu_memory_utilization=getattr(args, "gpu_memory_utilization", None),
        chat_template=None if chat_template is None else chat_template[0],
        chat_template_source=None if chat_template is None else chat_template[1],
        **overrides,
    )
    builtin = engine.tokenizer.builtin_chat_format  # None with --chat-template: it is used
    if builtin is not None:
        print(
            f"sv: note: {model_dir} has no chat template (tokenizer_config.json's chat_template "
            f"or chat_template.jinja): chat prompts use the built-in {builtin} format that its "
            "special tokens name; --chat-template gives another",
            file=sys.stderr,
        )
    engine.overlap = getattr(args, "overlap", True)
    if trace is not None:
        start_trace(engine, trace, model=str(model_dir))
    return engine, model_dir
