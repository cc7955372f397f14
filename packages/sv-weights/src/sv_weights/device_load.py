"""Copying a file's bytes onto a GPU: parallel readers feed one submitter through a pinned ring.

One thread copying from the page cache manages a few GB/s; the PCIe link takes about 55. So
DEVICE_READERS threads copy the file, chunk by chunk, into a shared ring of DEVICE_BUFFERS
pinned staging buffers, and one thread, the submitter (the caller's), starts each buffer's copy to
the GPU and hands the buffer back to the readers once that copy has finished:

    page cache --memmove, 8 readers--> pinned ring (16 x 4 MiB) --DMA, 1 submitter--> GPU

Each choice here was measured on the H200 host (2026-11-30, BENCHMARKS.md runs 43-45):

- Readers make no CUDA calls; the submitter makes all of them. When every reader started its
  own copies and waited on its own events, CUDA calls from 8 threads queued behind the driver's
  lock and the host copies stalled with them: 29-30 GB/s, against 39-50 GB/s for the same
  readers feeding one submitter. With one caller, torch's `copy_` and events are as fast as
  direct runtime calls were, so no ctypes is needed.
- Readers `memmove` from a read-only mapping of the file rather than `preadv` into the buffer:
  10-15% faster in the same runs. The per-chunk size check in `_MappedSpans.read_into` keeps
  a file truncated by someone else a clear error (touching a vanished page would be SIGBUS).
- The destination need not follow the file: it is described by spans (file range -> offset
  in the destination), and each reader gathers its chunk of the destination from the spans
  that fall in it. A checkpoint is laid out so in the model's order, not the file's (see
  `checkpoint.load_checkpoint`), at the readers' cost of a memmove per span, while the
  submitter, whose Python time per chunk bounds the rate, still makes one copy per chunk.
- Buffers are small and the ring is 64 MiB, so it stays in the CPU's last-level cache: readers
  write to cache and the DMA reads from it. 8 MiB buffers were slower; 24 buffers were no faster
  and pin half as much again. 2 MiB buffers halve the rate: the submitter's Python time per
  chunk then dominates.

On a CPU destination the same pipeline runs with unpinned buffers and synchronous copies (the
tests exercise the chunking, the ring and the error paths that way).
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import queue
import threading
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from sv_weights.errors import WeightsError

DEVICE_CHUNK_BYTES = 4 * 1024 * 1024
DEVICE_READERS = min(8, os.cpu_count() or 1)
DEVICE_BUFFERS = 16


@dataclass(frozen=True)
class FileSpan:
    """`size` bytes of the file `path` from byte `offset` on, bound for byte `dest` of a
    destination."""

    path: Path
    offset: int
    size: int
    dest: int


def copy_file_spans_to(spans: Sequence[FileSpan], dest: torch.Tensor) -> None:
    """Fill the 1-D uint8 tensor `dest` with the spans' file bytes, each at its `dest` offset.

    Spans may come from several files and in any order, but must not overlap in `dest`; bytes
    of `dest` that no span covers (padding) are left with unspecified values. The readers
    gather each chunk of `dest` from its spans on the host, so the submitter still makes one
    copy per chunk however the spans cut it. On return every copy has finished. A reader's or
    a copy's failure raises WeightsError naming the file, after every thread has stopped and
    every started copy has finished.
    """
    total = dest.numel()
    if total == 0:
        return
    chunk = max(1, min(DEVICE_CHUNK_BYTES, total))
    num_chunks = -(-total // chunk)
    ring = torch.empty(
        (max(1, min(DEVICE_BUFFERS, num_chunks)), chunk),
        dtype=torch.uint8,
        pin_memory=dest.device.type == "cuda",  # from torch's caching host allocator: reused
    )
    source = _MappedSpans(spans, total)
    try:
        _Transfer(source, ring, dest, readers=max(1, min(DEVICE_READERS, num_chunks))).run()
    finally:
        source.close()


class _MappedFile:
    """A file mapped read-only for the readers to copy from; it must hold at least `end` bytes."""

    def __init__(self, path: Path, end: int) -> None:
        self.path, self._end = path, end
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise WeightsError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
        try:
            self.check_size()
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        except BaseException as exc:
            os.close(self._fd)
            if isinstance(exc, OSError):
                raise WeightsError(f"{path}: cannot map the file ({exc.strerror or exc})") from exc
            raise
        # A read-only view of the mapping, for its address (ctypes wants a writable buffer).
        self._view: npt.NDArray[np.uint8] | None = np.frombuffer(self._map, dtype=np.uint8)
        self.address = self._view.ctypes.data

    def check_size(self) -> None:
        if os.fstat(self._fd).st_size < self._end:
            raise WeightsError(
                f"{self.path}: file ended early (it changed after its header was read)"
            )

    def close(self) -> None:
        self._view = None  # the mapping cannot close while a view exports its buffer
        self._map.close()
        os.close(self._fd)


class _MappedSpans:
    """The spans of a `copy_file_spans_to`, their files mapped, sorted by destination offset."""

    def __init__(self, spans: Sequence[FileSpan], total: int) -> None:
        self._spans = sorted((s for s in spans if s.size), key=lambda s: s.dest)
        self._starts = [s.dest for s in self._spans]
        end = 0
        for span in self._spans:
            if span.dest < end or span.dest + span.size > total or span.offset < 0:
                raise ValueError(f"span {span} overlaps another or falls outside {total} bytes")
            end = span.dest + span.size
        paths = list(dict.fromkeys(s.path for s in self._spans))
        # What errors name: the file, or the folder of a checkpoint's shards.
        self.name = (
            str(paths[0])
            if len(paths) == 1
            else f"{os.path.commonpath(paths)} ({len(paths)} files)"
        )
        self._files: dict[Path, _MappedFile] = {}
        try:
            for path in paths:
                file_end = max(s.offset + s.size for s in self._spans if s.path == path)
                self._files[path] = _MappedFile(path, file_end)
        except BaseException:
            self.close()
            raise

    def read_into(self, buffer: torch.Tensor, start: int, size: int) -> None:
        """Copy bytes [start, start + size) of the destination into the host tensor `buffer`."""
        end = start + size
        index = max(0, bisect.bisect_right(self._starts, start) - 1)
        while index < len(self._spans) and self._spans[index].dest < end:
            span = self._spans[index]
            index += 1
            lo, hi = max(start, span.dest), min(end, span.dest + span.size)
            if lo >= hi:
                continue
            file = self._files[span.path]
            file.check_size()  # a file truncated meanwhile: an error, not SIGBUS on its pages
            ctypes.memmove(  # releases the GIL
                buffer.data_ptr() + lo - start, file.address + span.offset + lo - span.dest, hi - lo
            )

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()


class _Submitter(Protocol):
    def active(self) -> AbstractContextManager[object]:
        """Entered around all of a transfer's `submit` calls."""

    def submit(self, buffer: int, src: torch.Tensor, dest: torch.Tensor) -> None:
        """Start copying `src` (staging buffer `buffer`'s bytes) into `dest`."""

    def finished(self) -> list[int]:
        """The buffers whose copies have finished since the last call, without blocking."""

    def wait_oldest(self) -> int | None:
        """Block until the oldest running copy has finished; its buffer (None: none runs)."""

    def close(self) -> None:
        """Wait for every copy started here."""


class _HostSubmitter:
    """A CPU destination: each copy is done when `submit` returns."""

    def __init__(self) -> None:
        self._done: list[int] = []

    def active(self) -> AbstractContextManager[object]:
        return nullcontext()

    def submit(self, buffer: int, src: torch.Tensor, dest: torch.Tensor) -> None:
        dest.copy_(src)
        self._done.append(buffer)

    def finished(self) -> list[int]:
        done, self._done = self._done, []
        return done

    def wait_oldest(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class _CudaSubmitter:
    """Copies on one side stream, in order, each followed by its buffer's event.

    One event per buffer, made once and re-recorded (a buffer is submitted again only after its
    copy has finished): creating an event per copy cost the submitter, whose Python time per
    chunk competes with the readers for the GIL, 7-9% of the load's rate (runs 51-52)."""

    def __init__(self, device: torch.device, buffers: int) -> None:
        self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._events = [torch.cuda.Event() for _ in range(buffers)]  # type: ignore[no-untyped-call]
        self._running: deque[tuple[int, torch.cuda.Event]] = deque()

    def active(self) -> AbstractContextManager[object]:
        return torch.cuda.stream(self._stream)  # once, not per copy: it costs a few µs

    def submit(self, buffer: int, src: torch.Tensor, dest: torch.Tensor) -> None:
        dest.copy_(src, non_blocking=True)  # on the side stream (`active`)
        event = self._events[buffer]
        event.record(self._stream)
        self._running.append((buffer, event))

    def finished(self) -> list[int]:
        done = []
        while self._running and self._running[0][1].query():  # type: ignore[no-untyped-call]
            done.append(self._running.popleft()[0])
        return done

    def wait_oldest(self) -> int | None:
        if not self._running:
            return None
        buffer, event = self._running.popleft()
        event.synchronize()
        return buffer

    def close(self) -> None:
        self._stream.synchronize()
        self._running.clear()


def _make_submitter(device: torch.device, buffers: int) -> _Submitter:
    return _CudaSubmitter(device, buffers) if device.type == "cuda" else _HostSubmitter()


# A filled buffer on its way to the submitter: (buffer, start, size); None: a reader has stopped.
_Filled = tuple[int, int, int] | None


class _Transfer:
    """One `copy_file_range_to`: the readers' threads and the submitter's loop."""

    def __init__(
        self, source: _MappedSpans, ring: torch.Tensor, dest: torch.Tensor, readers: int
    ) -> None:
        self._source, self._ring, self._dest, self._readers = source, ring, dest, readers
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for buffer in range(ring.shape[0]):
            self._free.put(buffer)
        self._filled: queue.SimpleQueue[_Filled] = queue.SimpleQueue()
        self._chunks = iter(range(-(-dest.numel() // ring.shape[1])))
        self._chunks_lock = threading.Lock()
        self._stop = threading.Event()  # set on the first failure: readers take no more chunks
        self._errors: list[BaseException] = []

    def run(self) -> None:
        # Every thread is joined before this returns or raises: the caller unmaps the file next.
        threads: list[threading.Thread] = []
        submitter: _Submitter | None = None
        try:
            submitter = _make_submitter(self._dest.device, self._ring.shape[0])
            for r in range(self._readers):
                thread = threading.Thread(target=self._read, name=f"sv-load-{r}", daemon=True)
                thread.start()
                threads.append(thread)
            with submitter.active():
                self._submit_all(submitter)
        except BaseException as exc:
            self._stop.set()
            for _ in threads:  # wake readers waiting for a buffer; they see the stop and leave
                self._free.put(0)
            if isinstance(exc, RuntimeError) and not isinstance(exc, WeightsError):
                raise self._copy_error(exc) from exc
            raise
        finally:
            for thread in threads:
                thread.join()
            if submitter is not None:
                try:
                    submitter.close()
                except RuntimeError as exc:
                    if not self._errors:
                        raise self._copy_error(exc) from exc
        if self._errors:
            raise self._errors[0]

    def _copy_error(self, exc: BaseException) -> WeightsError:
        return WeightsError(f"{self._source.name}: cannot copy to {self._dest.device}: {exc}")

    def _submit_all(self, submitter: _Submitter) -> None:
        stopped = 0
        while stopped < self._readers:
            for buffer in submitter.finished():
                self._free.put(buffer)
            item = self._next_filled(submitter)
            if item is None:
                stopped += 1
                continue
            buffer, start, size = item
            if self._stop.is_set():  # a reader failed: let the others drain, copy nothing more
                self._free.put(buffer)
                continue
            submitter.submit(buffer, self._ring[buffer, :size], self._dest[start : start + size])

    def _next_filled(self, submitter: _Submitter) -> _Filled:
        """The next filled buffer; while none is ready, hand back buffers as their copies finish."""
        while True:
            try:
                return self._filled.get_nowait()
            except queue.Empty:
                pass
            buffer = submitter.wait_oldest()
            if buffer is None:  # nothing in flight: every busy buffer is with a reader
                return self._filled.get()
            self._free.put(buffer)

    def _read(self) -> None:
        chunk = self._ring.shape[1]
        total = self._dest.numel()
        buffer: int | None = None  # the buffer this reader holds, if any
        try:
            while not self._stop.is_set():
                with self._chunks_lock:
                    index = next(self._chunks, None)
                if index is None:
                    break
                buffer = self._free.get()
                if self._stop.is_set():
                    break
                start = index * chunk
                size = min(chunk, total - start)
                self._source.read_into(self._ring[buffer], start, size)
                self._filled.put((buffer, start, size))
                buffer = None
        except BaseException as exc:
            self._errors.append(exc)
            self._stop.set()
        finally:
            if buffer is not None:  # hand it back, or a reader waiting for a buffer never wakes
                self._free.put(buffer)
            self._filled.put(None)
