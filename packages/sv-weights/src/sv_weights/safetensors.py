"""The safetensors format: parse and validate a header, load tensors zero-copy, write files.

A safetensors file is three parts laid end to end:

    [8 bytes]   N, the header length, an unsigned little-endian 64-bit integer
    [N bytes]   the header: a UTF-8 JSON object
                  {"__metadata__": {str: str},                      (optional)
                   "<tensor name>": {"dtype": "BF16",
                                     "shape": [2048, 8192],
                                     "data_offsets": [begin, end]}, ...}
                it may end in spaces, which writers use to align the data section
    [rest]      the data section: every tensor's raw little-endian bytes, row-major,
                at [begin, end) relative to the start of this section

`read_header` checks everything the header claims against the file before a single data byte
is read, so a truncated or hostile file fails with a `WeightsError` that says what is wrong,
never with a crash deep inside torch. `load_file` then maps the file into memory and builds
each tensor as a view of the mapped pages: nothing is copied on the CPU.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from sv_weights.device_load import FileSpan, copy_file_spans_to
from sv_weights.errors import WeightsError

# A header is JSON text describing tensors; even a 10,000-tensor checkpoint needs about 1 MB.
# The cap stops a corrupt length field from making us allocate gigabytes (the reference
# implementation uses the same 100 MB limit).
MAX_HEADER_BYTES = 100_000_000

METADATA_KEY = "__metadata__"

# safetensors dtype string -> torch dtype. The element size comes from torch itself.
# Optional entries appear only where this torch build has the dtype.
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
for _name, _attr in [
    ("U16", "uint16"),
    ("U32", "uint32"),
    ("U64", "uint64"),
    ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"),
]:
    if hasattr(torch, _attr):
        DTYPES[_name] = getattr(torch, _attr)

DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}

# Float dtypes a model weight may have (checked by the checkpoint validator). FP8 ones are
# not among them: a value in FP8 stands for value * scale, so only the linear weights that a
# checkpoint's quantization_config quantizes, each beside its scales, may be FP8.
FP8_DTYPES = frozenset(name for name in DTYPES if name.startswith("F8_"))
FLOAT_DTYPES = frozenset(name for name in DTYPES if name.startswith(("F", "BF"))) - FP8_DTYPES

# Files are little-endian; so are x86-64 and ARM64 (the only hosts torch ships for today).
if sys.byteorder != "little":  # pragma: no cover - no big-endian host to test on
    raise ImportError(
        "sv_weights reads safetensors files by mapping them: it needs a little-endian host"
    )


def dtype_itemsize(dtype_name: str) -> int:
    """Bytes per element of a safetensors dtype string (e.g. "BF16" -> 2)."""
    return DTYPES[dtype_name].itemsize


@dataclass(frozen=True)
class TensorInfo:
    """One header entry. `begin`/`end` are byte offsets relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header. `data_start` = 8 + `header_len`: where the data section begins."""

    path: Path
    header_len: int
    data_start: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    @property
    def data_len(self) -> int:
        """Size of the data section; validation guarantees the tensors cover it exactly."""
        return max((info.end for info in self.tensors.values()), default=0)


# --------------------------------------------------------------------------------------------
# Reading the header
# --------------------------------------------------------------------------------------------


def read_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse and validate the header of the safetensors file at `path`.

    Checked here, before any data byte is touched: the length field fits the file and the cap;
    the header is UTF-8 JSON, an object, with no duplicate keys; `__metadata__` maps str to str;
    every tensor has a known dtype, a shape of non-negative ints, and offsets whose span equals
    numel * itemsize; the tensors neither overlap nor leave gaps, and cover the data section
    exactly to the end of the file. Any failure raises `WeightsError` naming the file and tensor.
    """
    path = Path(path)
    try:
        with open(path, "rb") as file:
            file_size = os.fstat(file.fileno()).st_size
            header_len, header_text = _read_header_text(file, path, file_size)
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc

    entries = _parse_header_json(header_text, path)
    metadata = _parse_metadata(entries.pop(METADATA_KEY, None), path)
    tensors = {name: _parse_tensor_entry(name, entry, path) for name, entry in entries.items()}
    data_start = 8 + header_len
    _check_data_section_covered(tensors, file_size - data_start, path)
    return SafetensorsHeader(path, header_len, data_start, tensors, metadata)


# A clone made without git-lfs holds this small text file where the weights should be.
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def _read_header_text(file: BinaryIO, path: Path, file_size: int) -> tuple[int, str]:
    if file.read(len(_LFS_POINTER)) == _LFS_POINTER:
        raise WeightsError(
            f"{path}: a Git LFS pointer, not the weights: the repository was cloned without "
            "git-lfs (run `git lfs pull` in it, or download the file)"
        )
    file.seek(0)
    if file_size < 8:
        raise WeightsError(
            f"{path}: file is {file_size} bytes; a safetensors file starts with an 8-byte header length"
        )
    header_len = int.from_bytes(file.read(8), "little")
    if header_len > MAX_HEADER_BYTES:
        raise WeightsError(
            f"{path}: header length field says {header_len} bytes, over the {MAX_HEADER_BYTES}-byte cap "
            "(not a safetensors file, or a corrupt one)"
        )
    if 8 + header_len > file_size:
        raise WeightsError(
            f"{path}: header length field says {header_len} bytes but only {file_size - 8} bytes "
            "follow it (truncated file?)"
        )
    raw = file.read(header_len)
    if len(raw) != header_len:
        raise WeightsError(f"{path}: file shrank while reading the header")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WeightsError(
            f"{path}: header is not valid UTF-8 (byte {exc.start} of the header)"
        ) from exc
    if not text.startswith("{"):
        raise WeightsError(f"{path}: header must be a JSON object starting with '{{'")
    return header_len, text


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(key)
        result[key] = value
    return result


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_header_json(text: str, path: Path) -> dict[str, Any]:
    try:
        parsed = json.loads(
            text, object_pairs_hook=_reject_duplicate_keys, parse_constant=_reject_constant
        )
    except _DuplicateKeyError as exc:
        raise WeightsError(f"{path}: header has the key {exc.key!r} twice") from exc
    except RecursionError as exc:
        raise WeightsError(f"{path}: header JSON is nested too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise WeightsError(f"{path}: header is not valid JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise WeightsError(f"{path}: header must be a JSON object, got {type(parsed).__name__}")
    for key in parsed:
        _require_encodable(key, path, "tensor name")
    return parsed


def _require_encodable(text: str, path: Path, what: str) -> None:
    # JSON "\ud800" escapes decode to lone surrogates, which no UTF-8 file or dict key should hold.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise WeightsError(f"{path}: {what} {text!r} is not valid Unicode") from exc


def _parse_metadata(raw: Any, path: Path) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise WeightsError(
            f"{path}: {METADATA_KEY} must be an object of string values, got {type(raw).__name__}"
        )
    for key, value in raw.items():
        _require_encodable(key, path, f"{METADATA_KEY} key")
        if not isinstance(value, str):
            raise WeightsError(
                f"{path}: {METADATA_KEY}[{key!r}] must be a string, got {type(value).__name__}"
            )
        _require_encodable(value, path, f"{METADATA_KEY}[{key!r}] value")
    return dict(raw)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_tensor_entry(name: str, entry: Any, path: Path) -> TensorInfo:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise WeightsError(
            f"{where}: entry must be an object with dtype, shape, data_offsets; got {type(entry).__name__}"
        )
    expected_keys = {"dtype", "shape", "data_offsets"}
    if set(entry) != expected_keys:
        missing = sorted(expected_keys - set(entry))
        extra = sorted(set(entry) - expected_keys)
        raise WeightsError(
            f"{where}: entry must have exactly dtype, shape, data_offsets"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {extra}" if extra else "")
        )
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WeightsError(
            f"{where}: dtype {dtype!r} is not a known safetensors dtype (expected one of {sorted(DTYPES)})"
        )
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_int(dim) and dim >= 0 for dim in shape):
        raise WeightsError(f"{where}: shape {shape!r} must be a list of non-negative integers")
    # Also for an empty tensor: torch sizes its storage as the product of the other dims.
    if math.prod(dim for dim in shape if dim) * dtype_itemsize(dtype) >= 2**63:
        raise WeightsError(
            f"{where}: shape {shape!r} is past 2^63 bytes, more than any tensor holds"
        )
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise WeightsError(f"{where}: data_offsets {offsets!r} must be a list of two integers")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise WeightsError(f"{where}: data_offsets [{begin}, {end}] must satisfy 0 <= begin <= end")
    info = TensorInfo(name, dtype, tuple(shape), begin, end)
    expected_bytes = info.numel * dtype_itemsize(dtype)
    if info.nbytes != expected_bytes:
        raise WeightsError(
            f"{where}: shape {list(info.shape)} of {dtype} needs {expected_bytes} bytes, "
            f"but data_offsets [{begin}, {end}] span {info.nbytes}"
        )
    return info


def _check_data_section_covered(tensors: dict[str, TensorInfo], data_len: int, path: Path) -> None:
    """The tensors must tile [0, data_len) exactly: no overlap, no gap, nothing after the end."""
    cursor = 0
    previous: TensorInfo | None = None
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin < cursor:
            assert previous is not None
            raise WeightsError(
                f"{path}: tensor {info.name!r} at bytes [{info.begin}, {info.end}) overlaps tensor "
                f"{previous.name!r} at [{previous.begin}, {previous.end})"
            )
        if info.end > data_len:
            raise WeightsError(
                f"{path}: tensor {info.name!r} ends at byte {info.end} of the data section, "
                f"which has only {data_len} bytes (truncated file?)"
            )
        if info.begin > cursor:
            after = f"after tensor {previous.name!r}" if previous else "at the start"
            raise WeightsError(
                f"{path}: data section has {info.begin - cursor} unaccounted bytes {after}: tensor "
                f"{info.name!r} begins at {info.begin}, expected {cursor}"
            )
        cursor = info.end
        if info.nbytes > 0 or previous is None:
            previous = info
    if cursor != data_len:
        raise WeightsError(
            f"{path}: data section is {data_len} bytes but the tensors cover only {cursor} "
            f"({data_len - cursor} trailing bytes unaccounted for)"
        )


# --------------------------------------------------------------------------------------------
# Loading tensors
# --------------------------------------------------------------------------------------------


def load_file(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Load every tensor of a safetensors file, validated first (see `read_header`).

    device="cpu": zero-copy. The file is memory-mapped copy-on-write (MAP_PRIVATE) and each
    tensor is a view of the mapped pages, so loading costs no copy and pages are read from disk
    only when touched. Every returned tensor keeps a reference to the mapping: it stays open as
    long as any of the tensors lives, and closes when the last one is freed. Writing into a
    tensor changes only this process's private copy of that page, never the file. Replacing
    the file by rename (as `save_file` does) is safe; truncating it in place while its tensors
    live is not (touching a vanished page kills the process with SIGBUS, as with any mapping).

    device="cuda[:N]": no host copy of the checkpoint. Several readers copy the data section
    from the page cache into a small shared ring of pinned staging buffers (a few MiB each, never
    the whole file), and one submitter copies each filled buffer asynchronously into one device
    allocation (see `device_load`). The tensors are views of that device allocation. On return
    every copy has finished.

    Any other device: mapped on the CPU as above, then copied with `Tensor.to`.

    A tensor whose offset is not a multiple of its element size (our writer and HF's never make
    one) cannot be viewed in place; it alone is copied into an aligned buffer.
    """
    return load_from_header(read_header(path), device)


def load_from_header(
    header: SafetensorsHeader, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """`load_file` for a header already read (used when checkpoint code has validated shards)."""
    target = target_device(device, str(header.path))
    if target.type == "cuda":
        return _load_via_pinned_buffers(header, target)
    tensors = _load_mapped(header)
    if target.type != "cpu":
        tensors = {name: tensor.to(target) for name, tensor in tensors.items()}
    return tensors


def target_device(device: str | torch.device, source: str) -> torch.device:
    """`device` as a torch device that weights can be loaded onto; `source` starts errors."""
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise WeightsError(f"{source}: {device!r} is not a torch device") from exc
    if target.type == "cuda" and not torch.cuda.is_available():
        raise WeightsError(f"{source}: cannot load onto {target}: CUDA is not available here")
    return target


def _load_mapped(header: SafetensorsHeader) -> dict[str, torch.Tensor]:
    try:
        with open(header.path, "rb") as file:
            if os.fstat(file.fileno()).st_size != header.data_start + header.data_len:
                raise WeightsError(f"{header.path}: file changed size after its header was read")
            # ACCESS_COPY gives a writable private mapping: torch.frombuffer wants a writable
            # buffer, and writes must never reach the file.
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise WeightsError(f"{header.path}: cannot map the file ({exc.strerror or exc})") from exc
    # One uint8 tensor over the whole file; it holds the only reference to `mapping`, and every
    # tensor below is a view of it, so the mapping lives exactly as long as they do.
    file_bytes = torch.frombuffer(mapping, dtype=torch.uint8)
    return _tensors_from_bytes(header, file_bytes, base=header.data_start)


def _load_via_pinned_buffers(
    header: SafetensorsHeader, device: torch.device
) -> dict[str, torch.Tensor]:
    device_bytes = torch.empty(header.data_len, dtype=torch.uint8, device=device)
    copy_file_spans_to([FileSpan(header.path, header.data_start, header.data_len, 0)], device_bytes)
    return _tensors_from_bytes(header, device_bytes, base=0)


def _tensors_from_bytes(
    header: SafetensorsHeader, data: torch.Tensor, base: int
) -> dict[str, torch.Tensor]:
    """View each tensor's bytes, at `base + begin` in the uint8 tensor `data`, as its dtype and shape."""
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.tensors.items():
        dtype = DTYPES[info.dtype]
        if info.numel == 0:
            tensors[name] = torch.empty(info.shape, dtype=dtype, device=data.device)
            continue
        raw = data[base + info.begin : base + info.end]
        if raw.storage_offset() % dtype.itemsize != 0:
            raw = raw.clone()  # misaligned in the file: a fresh allocation is aligned
        if dtype == torch.bool and bool((raw > 1).any()):
            raise WeightsError(
                f"{header.path}: tensor {name!r} is BOOL but holds bytes other than 0 and 1"
            )
        tensors[name] = raw.view(dtype).view(info.shape)
    return tensors


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

# The data section starts at a multiple of this (the header is padded with spaces), and tensors
# are laid out by decreasing element size, so every tensor is aligned to its element size and
# loads as a view.
DATA_ALIGNMENT = 8

# Permissions of a written file: what open() would give under the process umask.
_umask = os.umask(0)
os.umask(_umask)
_NEW_FILE_MODE = 0o666 & ~_umask


def save_file(
    tensors: Mapping[str, torch.Tensor],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `tensors` (any device; copied to the CPU as needed) as a safetensors file.

    The file is written under a temporary name in the same folder and renamed into place, so a
    reader never sees half a file. Tensors that share memory are each written in full.
    """
    path = Path(path)
    entries, ordered = _plan_layout(tensors, path)
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise WeightsError(f"{path}: metadata must map str to str")
        for key, value in metadata.items():
            _require_encodable(key, path, f"{METADATA_KEY} key")
            _require_encodable(value, path, f"{METADATA_KEY}[{key!r}] value")
        entries = {METADATA_KEY: dict(metadata), **entries}
    header = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    header += b" " * (-(8 + len(header)) % DATA_ALIGNMENT)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(len(header).to_bytes(8, "little"))
            file.write(header)
            for tensor in ordered:
                if tensor.numel() > 0:
                    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
                    file.write(flat.view(torch.uint8).numpy().data)
        os.chmod(temp_name, _NEW_FILE_MODE)  # mkstemp makes it owner-only
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def _plan_layout(
    tensors: Mapping[str, torch.Tensor], path: Path
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    for name, tensor in tensors.items():
        if not isinstance(name, str) or name == METADATA_KEY:
            raise WeightsError(f"{path}: tensor name {name!r} is not allowed")
        # (a lone surrogate, e.g. from a file name os.fsdecode made of bytes that are not
        # UTF-8: the header could not be encoded, and the write failed from inside json)
        _require_encodable(name, path, "tensor name")
        if not isinstance(tensor, torch.Tensor):
            raise WeightsError(
                f"{path}: tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor"
            )
        if tensor.dtype not in DTYPE_NAMES:
            raise WeightsError(
                f"{path}: tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store "
                f"(supported: {sorted(str(d) for d in DTYPE_NAMES)})"
            )
    names = sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n))
    entries: dict[str, Any] = {}
    offset = 0
    for name in names:
        tensor = tensors[name]
        nbytes = tensor.numel() * tensor.dtype.itemsize
        entries[name] = {
            "dtype": DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    return entries, [tensors[name] for name in names]
