"""An HF-layout checkpoint folder: which tensors it must hold, checking that, loading it.

A folder holds `config.json` and either one `model.safetensors` or shards listed in
`model.safetensors.index.json` (`{"weight_map": {tensor name: shard file name}}`). Every shard
header is read and checked against the index and the config before any weight is loaded, so a
broken download fails in milliseconds with a message naming the file and tensor.

Tied embeddings: when `tie_word_embeddings` is true the output projection is the embedding
matrix, so `lm_head.weight` is not expected. Some exporters write it anyway; it is accepted when
its shape is right and it holds the embedding's values, and then dropped by `load_checkpoint`:
the model uses the embedding matrix. One that differs is refused: transformers 4 and vLLM
would then drop it, transformers 5 would run it as an untied head, so the folder does not say
which model it is.

RoPE buffers: checkpoints saved by transformers before 4.31 (Llama 2 and its fine-tunes) hold
each layer's `self_attn.rotary_emb.inv_freq`, a buffer computed from the config. transformers
and vLLM ignore it; so does sv, which makes its RoPE tables from the config: accepted, dropped.

Pre-quantized FP8 checkpoints (compressed-tensors, see `sv_weights.quantization`) hold, beside
each FP8 linear weight, its `weight_scale` (and maybe an `input_scale`, checked and dropped):
they are validated against the config's `quantization_config` and loaded with the weights.
One with a calibrated FP8 KV cache (`kv_cache_scheme`) also holds each layer's K and V cache
scales, loaded under one name whichever spelling the file uses
(`sv_weights.quantization.kv_scale_name`): the model's FP8 KV pool uses them. A checkpoint
calibrated for the KV cache alone holds those scales beside plain weights (no config group).
"""

from __future__ import annotations

import os
import reprlib
from pathlib import Path

import torch

from sv_weights.config import ModelConfig
from sv_weights.device_load import FileSpan, copy_file_spans_to
from sv_weights.errors import WeightsError
from sv_weights.json_files import read_json_file
from sv_weights.quantization import (
    FP8_DTYPE,
    INPUT_SCALE,
    FP8Quantization,
    kv_scales_in,
    read_quantization,
)
from sv_weights.safetensors import (
    DTYPES,
    FLOAT_DTYPES,
    FP8_DTYPES,
    SafetensorsHeader,
    TensorInfo,
    load_from_header,
    read_header,
    target_device,
)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
LM_HEAD = "lm_head.weight"
EMBED_TOKENS = "model.embed_tokens.weight"


def check_layer_count(config: ModelConfig, tensors: int, source: str, field: str) -> None:
    """Refuse a layer count (config `field`) past the checkpoint's `tensors` tensors (a layer
    has nine) before `expected_tensors` names every layer's: 10^9 layers would fill memory.
    A count short of the tensors is left to the check of each tensor, which names one."""
    if config.num_hidden_layers > tensors:
        raise WeightsError(
            f"{source}: {field} is {config.num_hidden_layers:,}, more than the {tensors:,} "
            "tensors the checkpoint holds (every layer has nine)"
        )


def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every weight a checkpoint of `config` holds.

    Linear weights are [out_features, in_features]. `lm_head.weight` is absent when tied.
    The family adds q/k/v biases (Qwen2) or per-head q/k norm gains (Qwen3).
    """
    architecture = config.architecture
    hidden = config.hidden_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {EMBED_TOKENS: (config.vocab_size, hidden)}
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (q_width, hidden)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv_width, hidden)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv_width, hidden)
        if architecture.qkv_bias:
            shapes[f"{prefix}.self_attn.q_proj.bias"] = (q_width,)
            shapes[f"{prefix}.self_attn.k_proj.bias"] = (kv_width,)
            shapes[f"{prefix}.self_attn.v_proj.bias"] = (kv_width,)
        if architecture.qk_norm:
            shapes[f"{prefix}.self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[f"{prefix}.self_attn.k_norm.weight"] = (config.head_dim,)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (hidden, q_width)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (config.intermediate_size, hidden)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (config.intermediate_size, hidden)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (hidden, config.intermediate_size)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes[LM_HEAD] = (config.vocab_size, hidden)
    return shapes


def rope_buffers(config: ModelConfig) -> set[str]:
    """The names of the RoPE buffers an old checkpoint may hold (module doc), one per layer."""
    return {
        f"model.layers.{layer}.self_attn.rotary_emb.inv_freq"
        for layer in range(config.num_hidden_layers)
    }


def validate_checkpoint(
    config: ModelConfig,
    infos: dict[str, TensorInfo],
    source: str,
    quantization: FP8Quantization | None = None,
) -> set[str]:
    """Check that `infos` holds exactly the tensors of `config`, with its shapes, in float dtypes.

    `source` (a file or folder) starts every message. A tied config also accepts an
    `lm_head.weight` of the embedding's shape (see the module doc). With `quantization` (the
    config's FP8 scheme) the quantized linear weights must be FP8 with their scales beside
    them, and a calibrated KV cache's scales (`kv_cache_scheme`) are checked; without it no
    tensor may be FP8 and none may be a KV-cache scale. Returns the names of the scale tensors.
    """
    check_layer_count(config, len(infos), source, "config num_hidden_layers")
    expected = expected_tensors(config)
    if config.tie_word_embeddings and LM_HEAD in infos:
        expected[LM_HEAD] = expected[EMBED_TOKENS]
    scales: set[str] = set()
    quantized: set[str] = set()  # FP8 weights, checked beside their scales
    if quantization is not None:
        linear = {n: s for n, s in expected.items() if n.endswith("_proj.weight") or n == LM_HEAD}
        scales = quantization.check_tensors(linear, infos, source)
        quantized = {n for n in linear if quantization.quantizes(n.removesuffix(".weight"))}
        kv_scales = quantization.check_kv_scales(config.num_hidden_layers, infos, source)
        scales |= set(kv_scales.values())
    else:
        fp8 = sorted(name for name, info in infos.items() if info.dtype in FP8_DTYPES)
        if fp8:
            raise WeightsError(
                f"{source}: tensor {fp8[0]!r} is {infos[fp8[0]].dtype}, but config.json has no "
                "quantization_config saying how to scale it"
            )
        kv_scales = kv_scales_in(config.num_hidden_layers, infos, source)
        if kv_scales:
            raise WeightsError(
                f"{source}: tensor {min(kv_scales.values())!r} is a KV-cache scale, but config.json has "
                "no quantization_config with a kv_cache_scheme saying how to use it"
            )
    missing = [name for name in expected if name not in infos]
    if missing:
        raise WeightsError(
            f"{source}: {len(missing)} tensor(s) the config needs are missing, e.g. "
            f"{_first(missing)} (config: {config.num_hidden_layers} layers, "
            f"tie_word_embeddings={str(config.tie_word_embeddings).lower()})"
        )
    ignored = scales | rope_buffers(config)
    unexpected = sorted(name for name in infos if name not in expected and name not in ignored)
    if unexpected:
        raise WeightsError(
            f"{source}: {len(unexpected)} tensor(s) not in a {config.model_type} checkpoint of this config, e.g. "
            f"{_first(unexpected)} (config: {config.num_hidden_layers} layers)"
        )
    for name, shape in expected.items():
        info = infos[name]
        if info.shape != shape:
            raise WeightsError(
                f"{source}: tensor {name!r} has shape {list(info.shape)}, expected {list(shape)} "
                "from config.json"
            )
        if name in quantized:
            continue
        if info.dtype in FP8_DTYPES:
            raise WeightsError(
                f"{source}: tensor {name!r} is {info.dtype}, but quantization_config does not "
                f"quantize it (only the linear weights it quantizes may be {FP8_DTYPE}, each "
                f"beside its weight_scale); expected one of {', '.join(sorted(FLOAT_DTYPES))}"
            )
        if info.dtype not in FLOAT_DTYPES:
            raise WeightsError(
                f"{source}: tensor {name!r} has dtype {info.dtype}, expected a float dtype "
                f"({', '.join(sorted(FLOAT_DTYPES))})"
            )
    return scales


def _first(names: list[str], count: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:count])
    return shown + (", ..." if len(names) > count else "")


def read_checkpoint_headers(model_dir: str | os.PathLike[str]) -> list[SafetensorsHeader]:
    """The validated headers of a folder's weight files: one file, or every shard of the index.

    With both present, `model.safetensors` wins (as in transformers). For an index: every shard
    named exists and is a plain file name inside the folder, every tensor of the map is in the
    shard it names, and every tensor of a shard is in the map (no tensor in two shards).
    """
    model_dir = Path(model_dir)
    single = model_dir / SINGLE_FILE
    index_path = model_dir / INDEX_FILE
    if _is_file(single, SINGLE_FILE, model_dir):
        return [read_header(single)]
    if not _is_file(index_path, INDEX_FILE, model_dir):
        raise WeightsError(f"{model_dir}: no {SINGLE_FILE} and no {INDEX_FILE}")
    weight_map = _read_weight_map(index_path)
    headers: list[SafetensorsHeader] = []
    seen: dict[str, str] = {}
    for shard_name in sorted(set(weight_map.values())):
        shard_path = model_dir / shard_name
        if not _is_file(shard_path, f"shard {reprlib.repr(shard_name)}", index_path):
            raise WeightsError(f"{index_path}: shard {shard_name!r} does not exist in {model_dir}")
        header = read_header(shard_path)
        for name in header.tensors:
            if name in seen:
                raise WeightsError(f"{shard_path}: tensor {name!r} is also in shard {seen[name]!r}")
            seen[name] = shard_name
            if weight_map.get(name) != shard_name:
                where = (
                    f"maps it to {weight_map[name]!r}" if name in weight_map else "does not list it"
                )
                raise WeightsError(f"{shard_path}: holds tensor {name!r}, but {INDEX_FILE} {where}")
        headers.append(header)
    for name, shard_name in weight_map.items():
        if seen.get(name) != shard_name:
            raise WeightsError(
                f"{index_path}: weight_map puts tensor {name!r} in {shard_name!r}, which does not hold it"
            )
    return headers


def _is_file(path: Path, what: str, source: Path) -> bool:
    """`path.is_file()`; a WeightsError starting with `source` where the lookup itself fails
    (`is_file` is False only for a name that is absent; a folder that cannot be searched or a
    path past the file system's length limit raise OSError, which would leave a traceback)."""
    try:
        return path.is_file()
    except OSError as exc:
        raise WeightsError(
            f"{source}: {what} cannot be looked up in {path.parent} ({exc.strerror or exc})"
        ) from exc


def _read_weight_map(index_path: Path) -> dict[str, str]:
    index = read_json_file(index_path, "index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(f"{index_path}: expected an object with a non-empty 'weight_map' object")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise WeightsError(
                f"{index_path}: weight_map[{name!r}] must be a file name, got {shard!r}"
            )
        # A shard name is a file in this folder: refuse paths that would read elsewhere.
        if shard in ("", ".", "..") or "/" in shard or "\\" in shard:
            raise WeightsError(
                f"{index_path}: weight_map[{name!r}] = {shard!r} is not a plain file name"
            )
    return weight_map


def checkpoint_infos(headers: list[SafetensorsHeader]) -> dict[str, TensorInfo]:
    """All tensors of all shards (the shard check guarantees no name repeats)."""
    return {name: info for header in headers for name, info in header.tensors.items()}


def load_checkpoint(
    model_dir: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    *,
    copy: bool = False,
) -> dict[str, torch.Tensor]:
    """Load the weights of the Llama checkpoint folder `model_dir`, validated against its config.

    Returns HF name -> tensor (see `expected_tensors`), in one of two ways:

    - mapped (the CPU, unless `copy`): every tensor is a zero-copy view of its mapped file
      (`load_file`). Nothing is read until touched, and the memory is the page cache's, shared
      and reclaimable, so views keeping a whole file mapped cost no memory of this process's.
    - copied (any other device, or the CPU with `copy=True`, which makes the weights
      independent of the file): one allocation on `device` holds exactly the tensors of
      `expected_tensors(config)`, in that order rather than the files', each at a multiple of
      TENSOR_ALIGNMENT bytes, filled from every shard by the parallel loader (`device_load`).
      In that order each layer's q, k, v and its gate, up lie end to end, so the model takes
      each group as one matrix without copying (`sv_model.ModelWeights.from_state_dict`) and
      the allocation holds nothing the model does not use: peak and resident memory are both
      the weights' own size (the staging ring is 64 MiB of pinned host memory). Packing copies
      of the file's layout instead kept those groups twice, in the buffer the other views keep
      alive and in the copies (1.5x the weights at Llama 3.2 1B shapes); giving every tensor
      a storage of its own and dropping the buffer after packing would still peak there, and
      leave the freed gigabyte in torch's cache, where the free memory the KV pool is sized
      from does not count it.

    `dtype` converts every weight (e.g. torch.bfloat16 for a float32 file), on the target
    device, into tensors of their own; FP8 weights and their scales stay as they are. A tied
    `lm_head.weight` is dropped (never copied), and so are the `input_scale`s of an FP8
    checkpoint (activations are scaled per token at run time) and the RoPE buffers of an old
    one (module doc). A calibrated KV cache's scales are returned under sv's names
    (`kv_scale_name`: "model.layers.N.self_attn.k_scale" and "...v_scale"), whichever
    spelling the file uses, in the file's dtype.
    """
    model_dir = Path(model_dir)
    config = ModelConfig.from_model_dir(model_dir)
    headers = read_checkpoint_headers(model_dir)
    quantization = read_quantization(model_dir)
    infos = checkpoint_infos(headers)
    scales = validate_checkpoint(config, infos, str(model_dir), quantization)
    kv_scales = kv_scales_in(config.num_hidden_layers, infos, str(model_dir))  # sv's -> file's
    kv_files = sorted(set(kv_scales.values()))
    weight_scales = sorted(
        name for name in scales if not name.endswith(INPUT_SCALE) and name not in kv_files
    )
    kept_scales = weight_scales + kv_files
    if config.tie_word_embeddings and any(LM_HEAD in header.tensors for header in headers):
        _check_tied_head_is_the_embedding(headers, str(model_dir))
    target = target_device(device, str(model_dir))
    if dtype is not None and not dtype.is_floating_point:
        raise WeightsError(f"{model_dir}: cannot convert weights to the non-float dtype {dtype}")
    tensors: dict[str, torch.Tensor] = {}
    if target.type == "cpu" and not copy:
        for header in headers:
            loaded = load_from_header(header, target)
            check_finite(loaded, str(header.path))
            tensors.update(loaded)
        if config.tie_word_embeddings:
            tensors.pop(LM_HEAD, None)
        for name in scales.difference(kept_scales):
            tensors.pop(name)
        for name in rope_buffers(config):
            tensors.pop(name, None)
    else:
        data, tensors = _copy_in_model_order(config, headers, target, kept_scales)
        if not _all_finite_at_once(data, tensors):
            for header in headers:
                check_finite(
                    {n: tensors[n] for n in header.tensors if n in tensors}, str(header.path)
                )
    check_scale_range(tensors, weight_scales, str(model_dir), "FP8 weight scale")
    check_scale_range(tensors, kv_files, str(model_dir), "KV-cache scale")
    renamed = {ours: tensors[name] for ours, name in kv_scales.items()}
    for name in kv_files:
        del tensors[name]
    tensors.update(renamed)
    if dtype is not None:
        keep = set(weight_scales) | set(kv_scales)
        tensors = {
            name: t if name in keep or t.dtype == DTYPES[FP8_DTYPE] else t.to(dtype)
            for name, t in tensors.items()
        }
    return tensors


# Where the copying load puts each tensor: at a multiple of this, as the CUDA allocator would
# place a tensor of its own, so that kernels see the aligned pointers they vectorize for. The
# sizes of q, k and gate (rows, in whole heads of 64 or so, x hidden_size x itemsize) are
# multiples of it in any real config, so no padding falls inside a group; were one not, the
# model would pack that group by copying: correct, without the saving.
TENSOR_ALIGNMENT = 256


def _copy_in_model_order(
    config: ModelConfig,
    headers: list[SafetensorsHeader],
    device: torch.device,
    scales: list[str],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The copied load of `load_checkpoint`: one allocation, the tensors in `expected_tensors`
    order and then the `scales` (FP8 weights', KV cache's), gathered from the validated shards
    `headers`. Returns the allocation and the views of it; the padding between tensors is
    zeroed."""
    where = {name: header for header in headers for name in header.tensors}
    placed: list[tuple[TensorInfo, int]] = []
    spans: list[FileSpan] = []
    size = 0
    for name in [*expected_tensors(config), *scales]:
        header = where[name]
        info = header.tensors[name]
        at = -(-size // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT
        placed.append((info, at))
        spans.append(FileSpan(header.path, header.data_start + info.begin, info.nbytes, at))
        size = at + info.nbytes
    data = torch.empty(size, dtype=torch.uint8, device=device)
    copy_file_spans_to(spans, data)
    end = 0
    for info, at in placed:  # rare: real tensor sizes are multiples of TENSOR_ALIGNMENT
        if at > end:
            data[end:at].zero_()
        end = at + info.nbytes
    return data, {
        info.name: data[at : at + info.nbytes].view(DTYPES[info.dtype]).view(info.shape)
        for info, at in placed
    }


def _check_tied_head_is_the_embedding(headers: list[SafetensorsHeader], source: str) -> None:
    """Raise WeightsError unless a tied checkpoint's `lm_head.weight` holds the values of
    `model.embed_tokens.weight` (module doc). Compared on the mapped files, a slice of rows at
    a time, so that a head in another dtype costs no copy of the whole matrix."""
    where = {name: header for header in headers for name in header.tensors}
    head = load_from_header(where[LM_HEAD], "cpu")[LM_HEAD]
    embed = load_from_header(where[EMBED_TOKENS], "cpu")[EMBED_TOKENS]
    rows = max(1, (1 << 24) // max(1, embed.shape[1]))
    for start in range(0, embed.shape[0], rows):
        ours, theirs = head[start : start + rows].to(embed.dtype), embed[start : start + rows]
        if torch.equal(ours, theirs):
            continue
        # NaN in both is no difference here (check_finite names it later).
        differs = (ours != theirs) & ~(ours.isnan() & theirs.isnan())
        bad = differs.reshape(len(ours), -1).any(dim=1).nonzero()
        if len(bad):
            raise WeightsError(
                f"{source}: config.json has tie_word_embeddings true, but the checkpoint's "
                f"{LM_HEAD} differs from {EMBED_TOKENS} (first in row {start + int(bad[0])}): "
                "set tie_word_embeddings to false to use it as the output layer, or remove it"
            )


def _all_finite_at_once(data: torch.Tensor, tensors: dict[str, torch.Tensor]) -> bool:
    """True when one float32 sum over the whole allocation `data` is finite, which clears
    every tensor in it: one reduction and one transfer instead of one per tensor (a load
    of Llama 3.2 1B has 146 tensors, and the first launch of each reduction kernel in a
    process costs more than the reduction). Only when every tensor has one float dtype, so
    that the allocation (its padding zeroed) reads as values of that dtype; False also
    when the sum is not finite, and `check_finite` then looks tensor by tensor."""
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) != 1 or not (dtype := dtypes.pop()).is_floating_point:
        return False
    if data.numel() % dtype.itemsize:
        return False
    return bool(torch.isfinite(data.view(dtype).sum(dtype=torch.float32)))


# The largest scale of e4m3 values (FP8 weights, FP8 KV pages): e4m3's largest value (448)
# times it is BF16's largest, which FP32 holds too. Above it the values a scale stands for
# overflow to infinity in the matrix (or K and V) the model computes with. An exporter's
# largest scale, absmax / 448 of a BF16 matrix, is at most this.
LARGEST_E4M3_SCALE = torch.finfo(torch.bfloat16).max / torch.finfo(torch.float8_e4m3fn).max


def check_scale_range(
    tensors: dict[str, torch.Tensor], scales: list[str], source: str, kind: str
) -> None:
    """Raise WeightsError naming the first of `scales` (each an FP8 weight scale or a
    KV-cache scale: `kind`) that is zero, negative or above LARGEST_E4M3_SCALE (one minimum
    and maximum over them all, then a look at each only when they fail): a zero scale
    silences its output channels (or makes its K or V infinite), a negative one flips them,
    and too large a one makes them infinite; the model then answers nonsense with no other
    sign of the damage."""
    if not scales:
        return
    everything = torch.cat([tensors[name].reshape(-1).float() for name in scales])
    lowest, highest = torch.aminmax(everything)
    if bool(lowest > 0) and bool(highest <= LARGEST_E4M3_SCALE):
        return
    for name in scales:
        values = tensors[name].float()
        for value in (float(values.min()), float(values.max())):
            if not 0 < value <= LARGEST_E4M3_SCALE:
                raise WeightsError(
                    f"{source}: tensor {name} holds a scale of {value:g} (expected every "
                    f"{kind} > 0 and at most {LARGEST_E4M3_SCALE:.4g}, where 448, e4m3's "
                    "largest value, times it is still finite: the file is damaged or was "
                    "exported wrongly)"
                )


def check_finite(tensors: dict[str, torch.Tensor], source: str) -> None:
    """Raise WeightsError naming the first tensor that holds a NaN or an infinity.

    One float32 sum per tensor, on the tensors' device, and one transfer of those sums to the
    host: a sum is NaN or infinite whenever an element is. Only a tensor whose sum is not finite
    is then looked at element by element, so that finite values too large for a float32 sum are
    not mistaken for a damaged tensor."""
    floats = [(name, t) for name, t in tensors.items() if t.is_floating_point() and t.numel()]
    if not floats:
        return
    sums = torch.stack([t.sum(dtype=torch.float32) for _, t in floats])
    for index in torch.nonzero(~torch.isfinite(sums)).flatten().tolist():
        name, tensor = floats[index]
        if not bool(torch.isfinite(tensor.float()).all()):  # (no isfinite for FP8)
            raise WeightsError(
                f"{source}: tensor {name} holds NaN or infinite values (expected finite weights: "
                "the file is damaged or was exported wrongly)"
            )
