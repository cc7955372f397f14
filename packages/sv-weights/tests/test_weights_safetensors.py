"""Our safetensors reader/writer, against the `safetensors` package (the test-only oracle)."""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import safetensors
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_weights import WeightsError, device_load, load_file, read_header, save_file
from sv_weights import safetensors as sv_st

ALL_DTYPES = sorted(sv_st.DTYPES)


def random_tensor(dtype_name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Arbitrary bit patterns (not just small values), valid for the dtype."""
    dtype = sv_st.DTYPES[dtype_name]
    generator = torch.Generator().manual_seed(seed)
    count = 1
    for dim in shape:
        count *= dim
    if dtype == torch.bool:
        return (torch.randint(0, 2, shape, generator=generator) == 1).reshape(shape)
    raw = torch.randint(0, 256, (count * dtype.itemsize,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


def as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_tensors(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype, name
        assert ours[name].shape == theirs[name].shape, name
        assert as_bytes(ours[name]) == as_bytes(theirs[name]), name


def build_file(
    entries: dict[str, Any], data: bytes, *, pad: bytes = b"", raw_header: bytes | None = None
) -> bytes:
    """Hand-assemble a safetensors file: length, header JSON, data."""
    header = raw_header if raw_header is not None else json.dumps(entries).encode()
    header += pad
    return struct.pack("<Q", len(header)) + header + data


def write(tmp_path: Path, content: bytes, name: str = "t.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


# ------------------------------------------------------------------------------------------
# Agreement with the oracle on valid files
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ALL_DTYPES)
def test_oracle_file_loads_identically_for_every_dtype(tmp_path: Path, dtype_name: str) -> None:
    tensors = {
        "matrix": random_tensor(dtype_name, (3, 5), seed=1),
        "scalar": random_tensor(dtype_name, (), seed=2),
        "empty": random_tensor(dtype_name, (0, 4), seed=3),
        "vector": random_tensor(dtype_name, (7,), seed=4),
    }
    path = tmp_path / "oracle.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"k": "v"})
    header = read_header(path)
    assert header.metadata == {"k": "v"}
    with safetensors.safe_open(str(path), framework="pt") as oracle:
        assert sorted(header.tensors) == sorted(oracle.keys())
        for name in oracle.keys():  # noqa: SIM118 - safe_open is not a mapping
            info = header.tensors[name]
            assert info.dtype == dtype_name
            assert list(info.shape) == list(oracle.get_slice(name).get_shape())
    assert_same_tensors(load_file(path), safetensors.torch.load_file(str(path)))


@pytest.mark.parametrize("dtype_name", ALL_DTYPES)
def test_our_file_loads_identically_in_the_oracle(tmp_path: Path, dtype_name: str) -> None:
    tensors = {
        "a": random_tensor(dtype_name, (4, 3), seed=5),
        "b": random_tensor(dtype_name, (2,), seed=6),
    }
    path = tmp_path / "ours.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    assert_same_tensors(safetensors.torch.load_file(str(path)), tensors)
    with safetensors.safe_open(str(path), framework="pt") as oracle:
        assert oracle.metadata() == {"format": "pt"}


tensor_dicts = st.dictionaries(
    keys=st.text(min_size=1, max_size=12).filter(lambda s: s != "__metadata__"),
    values=st.tuples(
        st.sampled_from(ALL_DTYPES),
        st.lists(st.integers(0, 5), max_size=3).map(tuple),
        st.integers(0, 2**31),
    ),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(
    spec=tensor_dicts,
    metadata=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)
def test_round_trips_agree_with_the_oracle(spec: dict[str, Any], metadata: dict[str, str]) -> None:
    tensors = {
        name: random_tensor(dtype, shape, seed) for name, (dtype, shape, seed) in spec.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        ours = Path(tmp) / "ours.safetensors"
        theirs = Path(tmp) / "theirs.safetensors"
        save_file(tensors, ours, metadata=metadata)
        safetensors.torch.save_file(tensors, str(theirs), metadata=metadata or None)
        assert_same_tensors(safetensors.torch.load_file(str(ours)), tensors)
        assert_same_tensors(load_file(theirs), tensors)
        assert_same_tensors(load_file(ours), tensors)
        assert read_header(ours).metadata == metadata
        with safetensors.safe_open(str(ours), framework="pt") as oracle:
            assert (oracle.metadata() or {}) == metadata


def test_writer_aligns_every_tensor_to_its_element_size(tmp_path: Path) -> None:
    tensors = {
        "u8": torch.arange(3, dtype=torch.uint8),
        "f64": torch.arange(3, dtype=torch.float64),
        "bf16": torch.arange(5, dtype=torch.bfloat16),
        "i32": torch.arange(1, dtype=torch.int32),
    }
    path = tmp_path / "aligned.safetensors"
    save_file(tensors, path, metadata={"x": "y"})
    header = read_header(path)
    assert header.data_start % 8 == 0
    for info in header.tensors.values():
        assert info.begin % sv_st.dtype_itemsize(info.dtype) == 0, info
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's owner-only mode
    assert [p.name for p in tmp_path.iterdir()] == ["aligned.safetensors"]  # no temp file left


# ------------------------------------------------------------------------------------------
# Zero-copy loading
# ------------------------------------------------------------------------------------------


def test_cpu_load_is_a_view_of_one_file_mapping(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file(
        {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(10, dtype=torch.int64)}, path
    )
    loaded = load_file(path)
    storages = {t.untyped_storage().data_ptr() for t in loaded.values()}
    assert len(storages) == 1  # both tensors view the same buffer: no per-tensor copy
    assert (
        loaded["a"].untyped_storage().nbytes() == path.stat().st_size
    )  # ... which is the whole file
    # The mapping outlives the loader and its local variables.
    a = loaded["a"]
    del loaded
    assert torch.equal(a, torch.arange(1000, dtype=torch.float32))


def test_writing_a_loaded_tensor_never_changes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(16)}, path)
    before = path.read_bytes()
    loaded = load_file(path)
    loaded["a"].fill_(7.0)
    assert path.read_bytes() == before
    assert torch.equal(load_file(path)["a"], torch.zeros(16))


def test_misaligned_tensor_is_copied_and_still_correct(tmp_path: Path) -> None:
    # One U8 byte first puts the F32 tensor at data offset 1: it cannot be viewed in place.
    values = torch.tensor([1.5, -2.25, 3.0], dtype=torch.float32)
    entries = {
        "byte": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "f32": {"dtype": "F32", "shape": [3], "data_offsets": [1, 13]},
    }
    header = json.dumps(entries).encode()
    header += b" " * (-(8 + len(header)) % 8)
    path = write(tmp_path, build_file({}, b"\x09" + as_bytes(values), raw_header=header))
    loaded = load_file(path)
    assert torch.equal(loaded["f32"], values)
    assert_same_tensors(loaded, safetensors.torch.load_file(str(path)))


def set_ring(monkeypatch: pytest.MonkeyPatch, chunk: int, readers: int, buffers: int) -> None:
    monkeypatch.setattr(device_load, "DEVICE_CHUNK_BYTES", chunk)
    monkeypatch.setattr(device_load, "DEVICE_READERS", readers)
    monkeypatch.setattr(device_load, "DEVICE_BUFFERS", buffers)


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sv-load-")]


@pytest.mark.parametrize(("readers", "buffers"), [(1, 1), (1, 2), (3, 1), (3, 2), (4, 3), (2, 16)])
def test_chunked_device_path_reassembles_the_file_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: int, buffers: int
) -> None:
    """The parallel GPU loader with its staging ring, run on the CPU with chunks smaller than
    any tensor: one reader and several, one buffer and several, more readers than buffers."""
    tensors = {
        f"t{i}": random_tensor(dtype, (i + 3, 5), seed=i) for i, dtype in enumerate(ALL_DTYPES)
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, path)
    set_ring(monkeypatch, 7, readers, buffers)  # odd size: chunks straddle tensors
    loaded = sv_st._load_via_pinned_buffers(read_header(path), torch.device("cpu"))
    assert_same_tensors(loaded, tensors)
    assert not loader_threads()


@pytest.mark.parametrize(("readers", "buffers"), [(1, 1), (3, 2)])
def test_spans_gather_several_files_out_of_order_around_padding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: int, buffers: int
) -> None:
    """Spans from two files, given out of order, with gaps between them and chunks that cut
    through several: every span's bytes land at its offset, in the reader's gather."""
    one, two = tmp_path / "one.bin", tmp_path / "two.bin"
    one.write_bytes(bytes(range(256)) * 4)
    two.write_bytes(bytes(range(255, -1, -1)) * 4)
    spans = [
        device_load.FileSpan(two, 10, 30, 100),
        device_load.FileSpan(one, 0, 5, 0),
        device_load.FileSpan(one, 700, 60, 20),
        device_load.FileSpan(two, 1000, 24, 131),
    ]
    dest = torch.zeros(155, dtype=torch.uint8)
    set_ring(monkeypatch, 7, readers, buffers)
    device_load.copy_file_spans_to(spans, dest)
    for span in spans:
        want = span.path.read_bytes()[span.offset : span.offset + span.size]
        assert bytes(dest[span.dest : span.dest + span.size].tolist()) == want
    assert not loader_threads()
    with pytest.raises(ValueError, match="overlaps another"):
        device_load.copy_file_spans_to([*spans, device_load.FileSpan(one, 0, 2, 3)], dest)


def test_a_failing_copy_is_a_weights_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy failing in the submitter surfaces once, as a WeightsError with the file, after
    every reader has stopped."""

    class Failing(device_load._HostSubmitter):
        def submit(self, buffer: int, src: torch.Tensor, dest: torch.Tensor) -> None:
            if buffer == 1:
                raise RuntimeError("CUDA error: out of memory")
            super().submit(buffer, src, dest)

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.arange(100.0)}, path)
    monkeypatch.setattr(device_load, "_make_submitter", lambda device, buffers: Failing())
    set_ring(monkeypatch, 64, 3, 2)
    with pytest.raises(WeightsError, match=r"w\.safetensors: cannot copy to cpu: CUDA error"):
        sv_st._load_via_pinned_buffers(read_header(path), torch.device("cpu"))
    assert not loader_threads()


def test_a_submitter_that_cannot_start_is_a_weights_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No stream (say, a broken device): a WeightsError before any reader has started."""

    def broken(device: torch.device, buffers: int) -> device_load._HostSubmitter:
        raise RuntimeError("CUDA error: invalid device ordinal")

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.arange(100.0)}, path)
    monkeypatch.setattr(device_load, "_make_submitter", broken)
    set_ring(monkeypatch, 64, 3, 2)
    started = []
    monkeypatch.setattr(device_load._Transfer, "_read", lambda self: started.append(1))
    with pytest.raises(WeightsError, match=r"w\.safetensors: cannot copy to cpu: CUDA error"):
        sv_st._load_via_pinned_buffers(read_header(path), torch.device("cpu"))
    assert not started and not loader_threads()


@pytest.mark.parametrize(("readers", "buffers"), [(1, 1), (3, 1), (3, 2)])
def test_a_file_truncated_during_the_load_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: int, buffers: int
) -> None:
    """Someone truncating the file while readers copy from its mapping: a WeightsError (the
    size check before each chunk), never SIGBUS, and no reader left waiting for a buffer."""
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.arange(1000.0)}, path)
    header = read_header(path)
    original = device_load._MappedSpans.read_into
    calls = []

    def truncating(
        self: device_load._MappedSpans, buffer: torch.Tensor, start: int, size: int
    ) -> None:
        calls.append(start)
        if len(calls) == 3:
            os.truncate(path, header.data_start + 100)
        original(self, buffer, start, size)

    monkeypatch.setattr(device_load._MappedSpans, "read_into", truncating)
    set_ring(monkeypatch, 256, readers, buffers)
    raised: list[BaseException] = []

    def load() -> None:
        try:
            sv_st._load_via_pinned_buffers(header, torch.device("cpu"))
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=load, daemon=True)  # a deadlock fails, not hangs, the test
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the loader deadlocked after a reader failed"
    assert len(raised) == 1 and isinstance(raised[0], WeightsError), raised
    assert re.search(r"w\.safetensors: file ended early", str(raised[0]))
    assert not loader_threads()


def test_a_file_shorter_than_its_header_says_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.arange(1000.0)}, path)
    header = read_header(path)
    os.truncate(path, header.data_start + 100)
    with pytest.raises(WeightsError, match=r"w\.safetensors: file ended early"):
        sv_st._load_via_pinned_buffers(header, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_load_matches_cpu_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = {
        f"t{i}": random_tensor(dtype, (i + 64, 33), seed=i) for i, dtype in enumerate(ALL_DTYPES)
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, path)
    for chunk, readers, buffers in (
        (1 << 10, 3, 2),
        (4099, 2, 16),
        (1 << 10, 4, 1),
        (device_load.DEVICE_CHUNK_BYTES, 1, 1),
    ):
        set_ring(monkeypatch, chunk, readers, buffers)
        on_gpu = load_file(path, device="cuda")
        assert all(t.device.type == "cuda" for t in on_gpu.values())
        assert_same_tensors({k: v.cpu() for k, v in on_gpu.items()}, tensors)
    assert not loader_threads()


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU-only message")
def test_cuda_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(3)}, path)
    with pytest.raises(WeightsError, match="cannot load onto cuda: CUDA is not available"):
        load_file(path, device="cuda")
    with pytest.raises(WeightsError, match="'nonsense' is not a torch device"):
        load_file(path, device="nonsense")


def test_other_devices_get_a_copy(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(3)}, path)
    loaded = load_file(path, device="meta")
    assert loaded["a"].device.type == "meta" and loaded["a"].shape == (3,)


# ------------------------------------------------------------------------------------------
# Every bad input: WeightsError naming the file, the tensor and what was expected
# ------------------------------------------------------------------------------------------

F32_1 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
FOUR = b"\x00\x00\x80\x3f"

BAD_FILES: list[tuple[str, bytes, list[str]]] = [
    ("too short", b"\x01\x02", ["file is 2 bytes", "8-byte header length"]),
    # a clone made without git-lfs: the pointer file in place of the weights
    (
        "lfs pointer",
        b"version https://git-lfs.github.com/spec/v1\noid sha256:4f1c...\nsize 2471645608\n",
        ["a Git LFS pointer", "git lfs pull"],
    ),
    ("length over cap", struct.pack("<Q", 10**9) + b"{}", ["over the 100000000-byte cap"]),
    ("length past end", struct.pack("<Q", 500) + b"{}", ["500 bytes", "only 2 bytes follow"]),
    ("not utf-8", build_file({}, b"", raw_header=b'{"\xff": 1}'), ["not valid UTF-8"]),
    ("not json", build_file({}, b"", raw_header=b"{nope"), ["not valid JSON"]),
    ("not an object", build_file({}, b"", raw_header=b"[1, 2]"), ["starting with '{'"]),
    ("leading space", build_file({}, b"", raw_header=b" {}"), ["starting with '{'"]),
    (
        "duplicate tensor",
        build_file(
            {},
            FOUR,
            raw_header=b'{"w": '
            + json.dumps(F32_1).encode()
            + b', "w": '
            + json.dumps(F32_1).encode()
            + b"}",
        ),
        ["'w' twice"],
    ),
    (
        "duplicate field",
        build_file(
            {},
            FOUR,
            raw_header=b'{"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}}',
        ),
        ["'dtype' twice"],
    ),
    (
        "nan",
        build_file({}, b"", raw_header=b'{"__metadata__": {"a": NaN}}'),
        ["NaN is not valid JSON"],
    ),
    (
        "unknown dtype",
        build_file({"w": {**F32_1, "dtype": "F99"}}, FOUR),
        ["tensor 'w'", "'F99'", "known safetensors dtype"],
    ),
    (  # no bytes, but torch sizes an empty tensor's storage by its other dims
        "empty tensor, a dim past int64",
        build_file({"w": {**F32_1, "shape": [0, 2**64], "data_offsets": [0, 0]}}, b""),
        ["tensor 'w'", "past 2^63 bytes"],
    ),
    (
        "empty tensor, dims whose product is past int64",
        build_file({"w": {**F32_1, "shape": [2**40, 2**40, 0], "data_offsets": [0, 0]}}, b""),
        ["tensor 'w'", "past 2^63 bytes"],
    ),
    (
        "negative dim",
        build_file({"w": {**F32_1, "shape": [-1]}}, FOUR),
        ["tensor 'w'", "non-negative integers"],
    ),
    (
        "float dim",
        build_file({"w": {**F32_1, "shape": [1.0]}}, FOUR),
        ["tensor 'w'", "non-negative integers"],
    ),
    (
        "bool dim",
        build_file({"w": {**F32_1, "shape": [True]}}, FOUR),
        ["tensor 'w'", "non-negative integers"],
    ),
    ("entry not object", build_file({"w": [1]}, FOUR), ["tensor 'w'", "must be an object"]),
    (
        "missing offsets",
        build_file({"w": {"dtype": "F32", "shape": [1]}}, FOUR),
        ["tensor 'w'", "missing ['data_offsets']"],
    ),
    ("extra field", build_file({"w": {**F32_1, "x": 1}}, FOUR), ["tensor 'w'", "unexpected ['x']"]),
    (
        "three offsets",
        build_file({"w": {**F32_1, "data_offsets": [0, 4, 8]}}, FOUR),
        ["tensor 'w'", "two integers"],
    ),
    (
        "reversed offsets",
        build_file({"w": {**F32_1, "data_offsets": [4, 0]}}, FOUR),
        ["tensor 'w'", "begin <= end"],
    ),
    (
        "size mismatch",
        build_file({"w": {**F32_1, "shape": [2]}}, FOUR),
        ["tensor 'w'", "needs 8 bytes", "span 4"],
    ),
    (
        "truncated data",
        build_file({"w": {**F32_1, "shape": [2], "data_offsets": [0, 8]}}, FOUR),
        ["tensor 'w'", "only 4 bytes"],
    ),
    (
        "overlap",
        build_file(
            {
                "a": {**F32_1, "shape": [2], "data_offsets": [0, 8]},
                "b": {**F32_1, "data_offsets": [4, 8]},
            },
            FOUR * 2,
        ),
        ["'b'", "overlaps tensor 'a'"],
    ),
    (
        "gap at start",
        build_file({"w": {**F32_1, "data_offsets": [4, 8]}}, FOUR * 2),
        ["4 unaccounted bytes at the start", "'w'"],
    ),
    (
        "gap between",
        build_file({"a": F32_1, "b": {**F32_1, "data_offsets": [8, 12]}}, FOUR * 3),
        ["4 unaccounted bytes after tensor 'a'", "'b' begins at 8, expected 4"],
    ),
    ("trailing bytes", build_file({"w": F32_1}, FOUR + b"xx"), ["2 trailing bytes"]),
    (
        "metadata not object",
        build_file({"__metadata__": [1]}, b""),
        ["__metadata__ must be an object"],
    ),
    (
        "metadata value",
        build_file({"__metadata__": {"k": 1}}, b""),
        ["__metadata__['k'] must be a string"],
    ),
    (
        "lone surrogate name",
        build_file({}, FOUR, raw_header=b'{"\\ud800": ' + json.dumps(F32_1).encode() + b"}"),
        ["not valid Unicode"],
    ),
    (
        "deep nesting",
        build_file(
            {}, b"", raw_header=b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        ),
        ["header"],
    ),
    (
        "bool byte 2",
        build_file({"w": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}}, b"\x01\x02"),
        ["tensor 'w'", "other than 0 and 1"],
    ),
]


@pytest.mark.parametrize(("case", "content", "fragments"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_file_raises_weights_error_naming_the_problem(
    tmp_path: Path, case: str, content: bytes, fragments: list[str]
) -> None:
    path = write(tmp_path, content)
    with pytest.raises(WeightsError) as caught:
        load_file(path)  # read_header runs first; BOOL content is checked at load
    message = str(caught.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (case, message)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="cannot read the file"):
        read_header(tmp_path / "absent.safetensors")


def test_header_padding_and_empty_file_are_valid(tmp_path: Path) -> None:
    path = write(tmp_path, build_file({"w": F32_1}, FOUR, pad=b"    "))
    assert read_header(path).tensors["w"].shape == (1,)
    assert load_file(path)["w"].item() == 1.0
    empty = write(tmp_path, build_file({}, b""), "empty.safetensors")
    assert load_file(empty) == {}
    assert safetensors.torch.load_file(str(empty)) == {}


@pytest.mark.parametrize(
    ("tensors", "metadata", "fragment"),
    [
        ({"__metadata__": torch.zeros(1)}, None, "'__metadata__' is not allowed"),
        ({"x": [1, 2]}, None, "'x' is a list, not a torch.Tensor"),
        ({"c": torch.zeros(2, dtype=torch.complex64)}, None, "'c' has dtype torch.complex64"),
        ({"x": torch.zeros(1)}, {"k": 1}, "metadata must map str to str"),
        # UTF-8 cannot encode a lone surrogate: a UnicodeEncodeError from inside json
        ({"a\udce9": torch.zeros(1)}, None, "tensor name 'a\\udce9' is not valid Unicode"),
        (
            {"x": torch.zeros(1)},
            {"source": "caf\udce9.gguf"},
            "['source'] value 'caf\\udce9.gguf' is not",
        ),
        ({"x": torch.zeros(1)}, {"\ud800": "v"}, "__metadata__ key '\\ud800' is not valid"),
    ],
)
def test_save_file_rejects_bad_input(
    tmp_path: Path, tensors: Any, metadata: Any, fragment: str
) -> None:
    with pytest.raises(WeightsError) as caught:
        save_file(tensors, tmp_path / "x.safetensors", metadata=metadata)
    assert fragment in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


# ------------------------------------------------------------------------------------------
# Fuzzing: any bytes in, WeightsError or a valid result out
# ------------------------------------------------------------------------------------------


def _parse_or_weights_error(content: bytes) -> dict[str, torch.Tensor] | None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.safetensors"
        path.write_bytes(content)
        try:
            read_header(path)
            loaded = load_file(path)
        except WeightsError:
            return None
        # Our parser accepted it: so must the oracle, with the same tensors.
        assert_same_tensors(loaded, safetensors.torch.load_file(str(path)))
        return {name: tensor.clone() for name, tensor in loaded.items()}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=st.binary(max_size=200))
def test_fuzz_random_bytes(content: bytes) -> None:
    _parse_or_weights_error(content)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=st.binary(max_size=120).map(lambda b: struct.pack("<Q", len(b)) + b))
def test_fuzz_random_headers_with_a_consistent_length(content: bytes) -> None:
    _parse_or_weights_error(content)


def _valid_file() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "v.safetensors")
        safetensors.torch.save_file(
            {
                "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                "b": torch.tensor([True, False]),
                "c": torch.arange(4, dtype=torch.bfloat16),
            },
            path,
            metadata={"format": "pt"},
        )
        return Path(path).read_bytes()


VALID = _valid_file()


@st.composite
def mutated_files(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "flip_data", "truncate", "insert", "delete", "digit"]))
        position = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip_data":  # the header stays valid; BOOL bytes may not
            data_start = 8 + int.from_bytes(VALID[:8], "little")
            if len(data) > data_start:
                data[draw(st.integers(data_start, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "flip" and data:
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[position : position + draw(st.integers(1, 4))]
        elif kind == "digit":  # change a number inside the header: shapes and offsets
            header_end = 8 + int.from_bytes(VALID[:8], "little")
            digits = [i for i in range(8, min(header_end, len(data))) if chr(data[i]).isdigit()]
            if digits:
                data[draw(st.sampled_from(digits))] = ord(str(draw(st.integers(0, 9))))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=mutated_files())
def test_fuzz_mutated_valid_files(content: bytes) -> None:
    _parse_or_weights_error(content)
