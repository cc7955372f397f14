"""From a model folder to a ready model runner: device, dtype, weights, KV pool size."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from sv_kernels import TuningCache
from sv_kernels.quantized import QUANT_KINDS, QuantKind
from sv_kernels.reference import FP8_KV_DTYPE
from sv_kvcache import KVCacheError, pages_for_free_memory, pages_for_mib
from sv_model import ModelRunner, ModelWeights, dequantize_weights, quantize_weights
from sv_model.parallel import TensorParallel, rank_config, shard_state
from sv_scheduler import Admission, SchedulerError, check_batch_limits
from sv_tokenizer import Tokenizer, TokenizerError
from sv_weights import ModelConfig, WeightsError, load_checkpoint

from sv_engine.default_model import damaged_default_model_hint
from sv_engine.errors import EngineError

PAGE_SIZE = 16
MIB = 1 << 20
# On the CPU the pool defaults to this many MiB: enough for a few thousand tokens of the
# default model, small enough for any laptop.
CPU_DEFAULT_KV_MIB = 256
# On CUDA the pool takes this fraction of the memory left free once the weights are loaded
# (or, with gpu_memory_utilization, of what the engine may still use: gpu_kv_budget);
# the rest is for activations (a prefill chunk of 8,192 tokens) and CUDA graphs.
GPU_KV_FRACTION = 0.85

KVCacheDtype = Literal["auto", "fp8"]
KV_CACHE_DTYPES: tuple[KVCacheDtype, ...] = ("auto", "fp8")


@dataclass(frozen=True)
class EngineConfig:
    device: str = "auto"
    kv_cache_mib: float | None = None
    policy: str = "continuous"
    dtype: torch.dtype | None = None
    max_num_seqs: int = 256
    max_model_len: int | None = None
    max_step_tokens: int = 8192
    prefix_caching: bool = True
    admission: Admission = "conservative"
    tuning_cache: TuningCache | None = None  # where the batch-1 GEMV choices are kept
    use_cuda_graphs: bool = True
    quantization: QuantKind | None = None  # quantize the matrices at load (fp8 or int8)
    kv_cache_dtype: KVCacheDtype = "auto"  # "auto": the weights' dtype; "fp8": e4m3 pages
    # Ranks the model is split over (sv_engine.ranks; a KV pool of kv_cache_mib on each).
    tensor_parallel_size: int = 1
    # On CUDA: the share of the device's whole memory the engine may use (gpu_kv_budget);
    # None: the pool takes GPU_KV_FRACTION of the memory free after the weights.
    gpu_memory_utilization: float | None = None
    # A chat template that replaces the model folder's, and what to call it in messages.
    chat_template: str | None = None
    chat_template_source: str | None = None


# Sees a model's tokenizer before its weights load; a ValueError refuses the load.
TokenizerCheck = Callable[[Tokenizer], object]


@dataclass
class LoadedModel:
    config: ModelConfig
    tokenizer: Tokenizer
    runner: ModelRunner
    num_pages: int
    max_model_len: int


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise EngineError(f"unknown device {name!r} (expected auto, cpu or cuda)") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineError("device 'cuda' asked for, but torch sees no CUDA device")
    if device.type not in ("cpu", "cuda"):
        raise EngineError(f"unsupported device {name!r} (expected auto, cpu or cuda)")
    return device


# What the weights and activations may be computed in (`Engine.from_model_dir(dtype=...)`).
MODEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def default_dtype(device: torch.device) -> torch.dtype:
    # BF16 on the GPU (what the checkpoints ship and the tensor cores want); FP32 on the CPU,
    # where BF16 matmuls are slow and the reference path should be exact.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(
    model_dir: Path,
    cfg: EngineConfig,
    tensor_parallel: TensorParallel | None = None,
    make_runner: Callable[..., ModelRunner] = ModelRunner,
    check_tokenizer: TokenizerCheck | None = None,
) -> LoadedModel:
    """The model, tokenizer and runner `cfg` asks for. With `tensor_parallel`, the runner is
    this rank's (sv_engine.ranks starts the others), made by `make_runner` (rank 0's sends
    every step to the other ranks first). `check_tokenizer` sees the tokenizer before the
    weights load: a ValueError it raises (an option this model's tokenizer cannot honour)
    is the load's EngineError, found in a second rather than after the load."""
    if cfg.policy not in ("continuous", "static"):
        raise EngineError(f"policy must be 'continuous' or 'static', got {cfg.policy!r}")
    if cfg.admission not in ("conservative", "preemptive"):
        raise EngineError(
            f"admission must be 'conservative' or 'preemptive', got {cfg.admission!r}"
        )
    try:
        config = model_config(model_dir)
        max_model_len = _context_limit(config, model_dir, cfg.max_model_len)
        tokenizer = Tokenizer.from_model_dir(
            model_dir,
            chat_template=cfg.chat_template,
            chat_template_source=cfg.chat_template_source,
        )
    except (WeightsError, TokenizerError) as e:
        raise EngineError(f"{e}{damaged_default_model_hint(model_dir)}") from e
    try:
        tokenizer.check_chat_template()
    except TokenizerError as e:
        # A template the caller gave is the caller's to fix: converting the default model
        # again would not help.
        hint = "" if cfg.chat_template is not None else damaged_default_model_hint(model_dir)
        raise EngineError(f"{e}{hint}") from e
    if check_tokenizer is not None:
        try:
            check_tokenizer(tokenizer)
        except ValueError as e:
            raise EngineError(str(e)) from None
    runner = load_runner(model_dir, cfg, config, max_model_len, tensor_parallel, make_runner)
    return LoadedModel(config, tokenizer, runner, runner.num_pages, max_model_len)


def model_config(model_dir: Path) -> ModelConfig:
    """The config of a model folder (an EngineError when there is none)."""
    if model_dir.exists() and not model_dir.is_dir():
        raise EngineError(
            f"{model_dir} is not a folder (expected a model folder: config.json, "
            "model.safetensors, tokenizer.json)"
        )
    if not model_dir.is_dir():
        raise EngineError(f"model folder {model_dir} does not exist")
    try:
        return ModelConfig.from_model_dir(model_dir)
    except WeightsError as e:
        raise EngineError(f"{e}{damaged_default_model_hint(model_dir)}") from e


def load_runner(
    model_dir: Path,
    cfg: EngineConfig,
    config: ModelConfig,
    max_model_len: int,
    tensor_parallel: TensorParallel | None = None,
    make_runner: Callable[..., ModelRunner] = ModelRunner,
) -> ModelRunner:
    """The weights on their device and a runner over a KV pool sized as `cfg` asks. With
    `tensor_parallel`: this rank's slice of the weights, a pool of its own KV heads, and
    as many pages as the rank with the least memory holds (page ids mean the same on all)."""
    if cfg.quantization is not None and cfg.quantization not in QUANT_KINDS:
        raise EngineError(
            f"quantization must be None (unquantized) or one of {', '.join(QUANT_KINDS)}, "
            f"got {cfg.quantization!r}"
        )
    if cfg.dtype is not None and cfg.dtype not in MODEL_DTYPES:
        # Found here, before the weights load: a string failed deep in torch, an integer dtype
        # at the first request's first kernel.
        raise EngineError(
            f"dtype must be None (the device's default) or one of "
            f"{', '.join(map(str, MODEL_DTYPES))}, got {cfg.dtype!r}"
        )
    try:  # the scheduler's own rule (vLLM's too), before the weights load rather than after
        check_batch_limits(cfg.max_num_seqs, cfg.max_step_tokens)
    except SchedulerError as e:
        raise EngineError(str(e)) from None
    device = resolve_device(cfg.device)
    check_gpu_memory_utilization(cfg.gpu_memory_utilization, cfg.kv_cache_mib, device)
    dtype = cfg.dtype or default_dtype(device)
    try:
        if tensor_parallel is None:
            state = load_checkpoint(model_dir, device=device)
        else:  # mapped on the host: each rank copies only its slice to its device
            size = tensor_parallel.world_size
            state = shard_state(config, load_checkpoint(model_dir), tensor_parallel.rank, size)
            config = rank_config(config, size)
    except WeightsError as e:
        raise EngineError(f"{e}{damaged_default_model_hint(model_dir)}") from e
    weights = ModelWeights.from_state_dict(config, state, device, dtype)
    del state
    if cfg.quantization is not None:
        weights = quantize_weights(weights, cfg.quantization)
        if device.type == "cuda":  # the unquantized weights' memory, back to the device
            torch.cuda.empty_cache()
    if device.type == "cpu" and cfg.quantization != "int8":
        # FP8 matrices (a checkpoint's, or quantized here): the CPU has no FP8 kernel, and the
        # reference would dequantize each at every call (fp8 decoded ~100x slower than int8 on
        # the default model); once here, the same values at the plain dtype's speed.
        weights = dequantize_weights(weights)
    kv_dtype = _kv_cache_dtype(cfg.kv_cache_dtype, dtype)
    num_pages = _pool_pages(config, device, kv_dtype, cfg.kv_cache_mib, cfg.gpu_memory_utilization)
    if tensor_parallel is not None:
        num_pages = tensor_parallel.minimum(num_pages)
    return make_runner(
        config,
        weights,
        num_pages=num_pages,
        page_size=PAGE_SIZE,
        max_num_seqs=cfg.max_num_seqs,
        max_model_len=max_model_len,
        use_cuda_graphs=cfg.use_cuda_graphs,
        tuning_cache=cfg.tuning_cache,
        kv_cache_dtype=kv_dtype,
        tensor_parallel=tensor_parallel,
    )


def _kv_cache_dtype(name: str, weights_dtype: torch.dtype) -> torch.dtype:
    if name == "auto":
        return weights_dtype
    if name == "fp8":
        return FP8_KV_DTYPE
    raise EngineError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {name!r}")


def _context_limit(config: ModelConfig, model_dir: Path, asked: int | None) -> int:
    """The context limit: the model's, or the user's when lower. Never the KV pool's: a request
    the pool cannot hold is the scheduler's to refuse, saying so."""
    model_limit = config.max_position_embeddings
    if asked is None:
        return model_limit
    if asked < 2:
        raise EngineError.bad_field(
            "max_model_len",
            f"must be at least 2 tokens (one prompt token and one output token), got {asked}",
        )
    if asked > model_limit:
        raise EngineError.bad_field(
            "max_model_len",
            f"{asked} is over the model's context of {model_limit} tokens "
            f"(max_position_embeddings in {model_dir / 'config.json'})",
        )
    return asked


def check_gpu_memory_utilization(
    utilization: object,
    kv_cache_mib: float | None,
    device: torch.device,
    names: tuple[str, str] = ("gpu_memory_utilization", "kv_cache_mib"),
) -> None:
    """gpu_memory_utilization in (0, 1], on CUDA, without kv_cache_mib (found before the
    weights load); `names` are what messages call the two (the command line's flags there).
    On the CPU it is refused rather than ignored: the pool would stay at its default while
    the user believes it follows the share."""
    if utilization is None:
        return
    share, mib = names
    if isinstance(utilization, bool) or not isinstance(utilization, int | float):
        raise EngineError(f"{share} must be a number, got {utilization!r}")
    if not 0 < utilization <= 1:
        raise EngineError(f"{share} must be in (0, 1], got {utilization!r}")
    if kv_cache_mib is not None:
        raise EngineError(f"give {mib} or {share}, not both: both size the KV pool")
    if device.type != "cuda":
        raise EngineError(
            f"{share} sizes the KV pool from a GPU's memory, and the device is the "
            f"{device.type.upper()}: on {device} the pool is {mib}"
        )


def gpu_kv_budget(utilization: float, *, free: int, total: int, weights: int) -> int:
    """Bytes of KV pool on a GPU of `total` bytes, `free` of them free, of which the engine may
    use `utilization` (vLLM's --gpu-memory-utilization), the weights already holding `weights`
    (what torch's allocator holds once they are loaded).

    The engine may still use `utilization * total - weights`, and no more than is `free` (what
    other processes hold is not the engine's to take); of that the pool takes GPU_KV_FRACTION,
    the same share it takes of the free memory without the flag, leaving the rest for
    activations and CUDA graphs (these are measured only by the warm-up, after the pool is
    allocated). So the flag never gives a larger pool than the default: it lowers the ceiling,
    to share a GPU. The CUDA context (outside torch's allocator) is not counted."""
    allowed = min(int(utilization * total) - weights, free)
    if allowed <= 0:
        raise EngineError(
            f"gpu_memory_utilization {utilization:g} lets the engine use "
            f"{utilization * total / MIB:,.0f} MiB of the GPU's {total / MIB:,.0f} MiB, and the "
            f"weights alone take {weights / MIB:,.0f} MiB: nothing is left for the KV cache"
        )
    return int(allowed * GPU_KV_FRACTION)


def _pool_pages(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    kv_cache_mib: float | None,
    gpu_memory_utilization: float | None = None,
) -> int:
    shape = (config.num_hidden_layers, config.num_key_value_heads, config.head_dim, dtype.itemsize)
    if device.type == "cuda" and kv_cache_mib is None:
        free, total = torch.cuda.mem_get_info(device)
        try:
            if gpu_memory_utilization is None:
                return pages_for_free_memory(free, GPU_KV_FRACTION, *shape, page_size=PAGE_SIZE)
            weights = torch.cuda.memory_allocated(device)
            budget = gpu_kv_budget(gpu_memory_utilization, free=free, total=total, weights=weights)
            return pages_for_mib(budget / MIB, *shape, page_size=PAGE_SIZE)
        except KVCacheError as e:
            raise EngineError(str(e)) from e
    mib = CPU_DEFAULT_KV_MIB if kv_cache_mib is None else kv_cache_mib
    available = available_memory(device)
    # Checked before anything is allocated: too large a pool would otherwise end in the
    # allocator's error, or on the CPU in the kernel's out-of-memory killer.
    if available is not None and mib * MIB > available[0]:
        raise EngineError(
            f"a KV cache of {mib:g} MiB does not fit: {available[0] // MIB:,} MiB of memory "
            f"is {available[1]}; ask for less"
        )
    try:
        return pages_for_mib(mib, *shape, page_size=PAGE_SIZE)
    except KVCacheError as e:
        raise EngineError(str(e)) from e


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """Bytes a new allocation on `device` can take, and where that figure comes from; None
    where it cannot be told. On CUDA the free device memory (the weights are loaded by then);
    on the CPU the kernel's estimate of memory available without swapping (Linux)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, f"free on {device} after loading the weights"
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available on this machine (MemAvailable)"
    except OSError:
        pass
    return None
