"""The physical limit on local disk: numpy memmap slicing and ``os.pread`` of the raw bytes.

Both read the generated raw files (the same bytes every other system stores in its own
format) and return owned, writable arrays, as the libraries do; no format, index or
checksum stands between the caller and the page cache. Every local ratio in the report is
taken against the memmap row.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from benchmarks.config import TEMPORAL_WINDOW_FIELDS
from benchmarks.systems.base import Location, Support, System
from benchmarks.workloads import (
    TEMPORAL_SPECS,
    TOKEN_DTYPE,
    DatasetData,
    DocumentsData,
    Payload,
    TemporalData,
    TokensData,
    WindowSet,
)

_NOTE_SYNC = "sync, one process; page cache warm"


class RawMemmap(System):
    """Slices of a numpy memmap of the raw file, copied out (``np.array(mm[a:b])``)."""

    name = "raw-memmap"
    label = "raw numpy memmap (local)"
    family = "raw"

    def __init__(self) -> None:
        self._data: DatasetData | None = None
        self._maps: dict[str, np.memmap] = {}
        self._offsets: np.ndarray | None = None

    def supports(self, workload: str, location: str) -> Support | None:
        return Support(concurrency=(1,), note=_NOTE_SYNC) if location == "local" else None

    def open(self, data: DatasetData, location: Location) -> None:
        self._data = data
        if isinstance(data, TokensData):
            self._maps = {"tokens": np.memmap(data.path / "tokens.i32", TOKEN_DTYPE, "r")}
        elif isinstance(data, TemporalData):
            total = int(data.frame_counts.sum())
            for f in TEMPORAL_WINDOW_FIELDS:
                dtype, trailing = TEMPORAL_SPECS[f]
                self._maps[f] = np.memmap(
                    data.path / f"{f}.raw", dtype, "r", shape=(total, *trailing)
                )
            self._offsets = data.frame_offsets
        else:
            self._maps = {"heap": np.memmap(data.path / "heap.bin", np.uint8, "r")}
            self._offsets = np.load(data.path / "offsets.npy")

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        if windows.dataset == "tokens":
            assert windows.starts is not None
            s = int(windows.starts[i])
            return np.array(self._maps["tokens"][s : s + windows.length])
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            assert self._offsets is not None
            base = int(self._offsets[int(windows.records[i])]) + int(windows.starts[i])
            return {
                f: np.array(self._maps[f][base : base + windows.frames]) for f in windows.fields
            }
        assert windows.batches is not None and self._offsets is not None
        heap, off = self._maps["heap"], self._offsets
        return [heap[int(off[j]) : int(off[j + 1])].tobytes() for j in windows.batches[i]]

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        total = 0
        if windows.dataset == "tokens":
            assert windows.starts is not None
            mm, w = self._maps["tokens"], windows.length
            for s in windows.starts[ids].tolist():
                total += np.array(mm[s : s + w]).nbytes
            return total
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            assert self._offsets is not None
            bases = self._offsets[windows.records[ids]] + windows.starts[ids]
            maps = [self._maps[f] for f in windows.fields]
            n = windows.frames
            for b in bases.tolist():
                for mm in maps:
                    total += np.array(mm[b : b + n]).nbytes
            return total
        assert windows.batches is not None and self._offsets is not None
        heap, off = self._maps["heap"], self._offsets
        for row in windows.batches[ids].tolist():
            for j in row:
                total += len(heap[off[j] : off[j + 1]].tobytes())
        return total

    def close(self) -> None:
        self._maps = {}


def _pread_into(fd: int, out: np.ndarray, offset: int) -> None:
    """Read ``out.nbytes`` bytes at ``offset`` straight into ``out`` (no intermediate copy)."""
    if os.preadv(fd, [memoryview(out).cast("B")], offset) != out.nbytes:
        raise OSError(f"short read at offset {offset}")


class RawPread(System):
    """``os.preadv`` of the exact byte ranges into owned arrays (one call per field/doc)."""

    name = "raw-pread"
    label = "raw os.preadv (local)"
    family = "raw"

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._offsets: np.ndarray | None = None

    def supports(self, workload: str, location: str) -> Support | None:
        return Support(concurrency=(1,), note=_NOTE_SYNC) if location == "local" else None

    def open(self, data: DatasetData, location: Location) -> None:
        names: dict[str, Path]
        if isinstance(data, TokensData):
            names = {"tokens": data.path / "tokens.i32"}
        elif isinstance(data, TemporalData):
            names = {f: data.path / f"{f}.raw" for f in TEMPORAL_WINDOW_FIELDS}
            self._offsets = data.frame_offsets
        else:
            assert isinstance(data, DocumentsData)
            names = {"heap": data.path / "heap.bin"}
            self._offsets = np.load(data.path / "offsets.npy")
        self._fds = {k: os.open(p, os.O_RDONLY) for k, p in names.items()}

    def _window(self, windows: WindowSet, i: int) -> Payload:
        if windows.dataset == "tokens":
            assert windows.starts is not None
            out = np.empty(windows.length, TOKEN_DTYPE)
            _pread_into(self._fds["tokens"], out, int(windows.starts[i]) * TOKEN_DTYPE.itemsize)
            return out
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            assert self._offsets is not None
            base = int(self._offsets[int(windows.records[i])]) + int(windows.starts[i])
            out = {}
            for f in windows.fields:
                dtype, trailing = TEMPORAL_SPECS[f]
                arr = np.empty((windows.frames, *trailing), dtype)
                _pread_into(self._fds[f], arr, base * (arr.nbytes // windows.frames))
                out[f] = arr
            return out
        assert windows.batches is not None and self._offsets is not None
        fd, off = self._fds["heap"], self._offsets
        return [os.pread(fd, int(off[j + 1] - off[j]), int(off[j])) for j in windows.batches[i]]

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        return self._window(windows, i)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        total = 0
        if windows.dataset == "tokens":
            assert windows.starts is not None
            fd, item, w = self._fds["tokens"], TOKEN_DTYPE.itemsize, windows.length
            for s in windows.starts[ids].tolist():
                out = np.empty(w, TOKEN_DTYPE)
                _pread_into(fd, out, s * item)
                total += out.nbytes
            return total
        for i in ids.tolist():
            p = self._window(windows, i)
            total += sum(v.nbytes for v in p.values()) if isinstance(p, dict) else sum(map(len, p))
        return total

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
