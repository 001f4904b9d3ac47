"""Deterministic workload generators and the window sets every system reads.

All systems read the same windows: the window lists are generated once per data key with
fixed seeds and saved next to the raw data, and the raw files double as the ground truth
against which every system's first windows are checked.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import (
    DATASET_OF_WORKLOAD,
    TEMPORAL_FIELDS,
    TEMPORAL_WINDOW_FIELDS,
    DataSizes,
    RunConfig,
)

TOKEN_DTYPE = np.dtype("<i4")
VOCAB = 50257
TEMPORAL_SPECS: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {
    "features": (np.dtype("<f4"), (256,)),
    "clock": (np.dtype("<f8"), ()),
    "valid": (np.dtype("bool"), ()),
    "pose": (np.dtype("<f4"), (7,)),
}

Payload = np.ndarray | dict[str, np.ndarray] | list[bytes]


def named_rng(seed: int, stream: str) -> np.random.Generator:
    """One independent, named random stream per purpose so adding one never shifts another."""
    return np.random.default_rng([seed, *stream.encode()])


# --------------------------------------------------------------------------- generation


def generate(config: RunConfig) -> Path:
    """Generate (or reuse) the raw data and window lists of ``config``; return the data dir."""
    root = config.data_dir
    manifest = root / "manifest.json"
    key = config.data_key()
    if manifest.exists() and json.loads(manifest.read_text()).get("key") == key:
        return root
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    sizes = config.sizes
    _generate_tokens(root / "tokens", sizes, config.seed)
    _generate_temporal(root / "temporal", sizes, config.seed)
    _generate_documents(root / "documents", sizes, config.seed)
    manifest.write_text(json.dumps({"key": key, "sizes": config.to_json()["sizes"]}, indent=1))
    return root


def _generate_tokens(out: Path, sizes: DataSizes, seed: int) -> None:
    out.mkdir(parents=True)
    rng = named_rng(seed, "tokens")
    mean = (sizes.token_doc_min + sizes.token_doc_max) / 2
    lengths = rng.integers(
        sizes.token_doc_min, sizes.token_doc_max + 1, size=int(sizes.token_total / mean * 1.2) + 8
    )
    cut = int(np.searchsorted(np.cumsum(lengths), sizes.token_total)) + 1
    lengths = lengths[:cut].astype(np.int64)
    total = int(lengths.sum())
    tokens = rng.integers(0, VOCAB, size=total, dtype=np.int32).astype(TOKEN_DTYPE)
    tokens.tofile(out / "tokens.i32")
    np.save(out / "doc_lengths.npy", lengths)
    w = sizes.window_tokens
    starts = named_rng(seed, "tokens-random-windows").integers(
        0, total - w + 1, sizes.random_windows
    )
    np.save(out / "windows_random.npy", starts.astype(np.int64))
    np.save(out / "windows_sequential.npy", np.arange(0, total - w + 1, sizes.window_stride))


def _generate_temporal(out: Path, sizes: DataSizes, seed: int) -> None:
    out.mkdir(parents=True)
    rng = named_rng(seed, "temporal")
    counts = rng.integers(
        sizes.temporal_frames_min, sizes.temporal_frames_max + 1, sizes.temporal_records
    ).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    total = int(offsets[-1])
    files = {name: open(out / f"{name}.raw", "wb") for name in TEMPORAL_FIELDS}  # noqa: SIM115
    try:
        t0 = 0.0
        for n in counts:
            n = int(n)
            files["features"].write(rng.standard_normal((n, 256), dtype=np.float32).tobytes())
            files["clock"].write((t0 + np.arange(n, dtype=np.float64) / 30.0).tobytes())
            files["valid"].write((rng.random(n) > 0.05).tobytes())
            files["pose"].write(rng.standard_normal((n, 7), dtype=np.float32).tobytes())
            t0 += n / 30.0 + 1.0
    finally:
        for f in files.values():
            f.close()
    np.save(out / "frame_counts.npy", counts)
    np.save(out / "frame_offsets.npy", offsets)
    frames = sizes.temporal_window_frames
    wr = named_rng(seed, "temporal-windows")
    records = wr.integers(0, sizes.temporal_records, sizes.temporal_windows)
    starts = (wr.random(sizes.temporal_windows) * (counts[records] - frames + 1)).astype(np.int64)
    np.save(out / "window_records.npy", records.astype(np.int64))
    np.save(out / "window_starts.npy", starts)
    assert total == int(offsets[-1])


def _generate_documents(out: Path, sizes: DataSizes, seed: int) -> None:
    out.mkdir(parents=True)
    rng = named_rng(seed, "documents")
    lo, hi = np.log(sizes.document_bytes_min), np.log(sizes.document_bytes_max)
    doc_sizes = np.exp(rng.uniform(lo, hi, sizes.documents)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64)
    rng.integers(0, 256, size=int(offsets[-1]), dtype=np.uint8).tofile(out / "heap.bin")
    np.save(out / "offsets.npy", offsets)
    batches = named_rng(seed, "documents-batches").integers(
        0, sizes.documents, (sizes.document_batches, sizes.document_batch)
    )
    np.save(out / "batches.npy", batches.astype(np.int64))


# --------------------------------------------------------------------------- loaded data


@dataclass
class TokensData:
    """The token stream: one raw int32 file, documents concatenated."""

    path: Path
    tokens: np.memmap
    doc_lengths: np.ndarray
    window_tokens: int

    @property
    def total(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class TemporalData:
    """Temporal records: one raw file per field, records concatenated along frames."""

    path: Path
    fields: dict[str, np.memmap]
    frame_counts: np.ndarray
    frame_offsets: np.ndarray
    window_frames: int

    def record(self, index: int) -> dict[str, np.ndarray]:
        a, b = int(self.frame_offsets[index]), int(self.frame_offsets[index + 1])
        return {name: np.array(arr[a:b]) for name, arr in self.fields.items()}


@dataclass
class DocumentsData:
    """Variable-size byte documents: one heap file plus int64 offsets (n + 1)."""

    path: Path
    heap: np.memmap
    offsets: np.ndarray

    @property
    def count(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def document(self, index: int) -> bytes:
        return bytes(self.heap[int(self.offsets[index]) : int(self.offsets[index + 1])])


DatasetData = TokensData | TemporalData | DocumentsData


def load_dataset(data_dir: Path, name: str, sizes: DataSizes) -> DatasetData:
    """Open one generated dataset read-only (memmaps: cheap, shared page cache)."""
    d = data_dir / name
    if name == "tokens":
        return TokensData(
            path=d,
            tokens=np.memmap(d / "tokens.i32", dtype=TOKEN_DTYPE, mode="r"),
            doc_lengths=np.load(d / "doc_lengths.npy"),
            window_tokens=sizes.window_tokens,
        )
    if name == "temporal":
        counts = np.load(d / "frame_counts.npy")
        total = int(counts.sum())
        fields = {}
        for fname, (dtype, trailing) in TEMPORAL_SPECS.items():
            fields[fname] = np.memmap(
                d / f"{fname}.raw", dtype=dtype, mode="r", shape=(total, *trailing)
            )
        return TemporalData(
            path=d,
            fields=fields,
            frame_counts=counts,
            frame_offsets=np.load(d / "frame_offsets.npy"),
            window_frames=sizes.temporal_window_frames,
        )
    if name == "documents":
        return DocumentsData(
            path=d,
            heap=np.memmap(d / "heap.bin", dtype=np.uint8, mode="r"),
            offsets=np.load(d / "offsets.npy"),
        )
    raise ValueError(f"unknown dataset {name!r}")


@dataclass
class WindowSet:
    """The windows of one workload, identical for every system.

    ``count`` windows are addressed by id 0..count-1; the fields used depend on the dataset:
    token ``starts``; temporal ``records`` + ``starts`` (``frames`` long, ``fields``);
    document ``batches`` (rows of document indices, one ``read_many`` call each).
    """

    workload: str
    dataset: str
    count: int
    payload_bytes: np.ndarray  # bytes each window returns to the caller
    starts: np.ndarray | None = None
    length: int = 0
    records: np.ndarray | None = None
    frames: int = 0
    fields: tuple[str, ...] = ()
    batches: np.ndarray | None = None
    doc_sizes: np.ndarray | None = None  # bytes of each document in ``batches``


def _row_bytes(name: str) -> int:
    dtype, trailing = TEMPORAL_SPECS[name]
    return int(dtype.itemsize * int(np.prod(trailing, dtype=np.int64)))


def load_windows(data_dir: Path, workload: str, sizes: DataSizes) -> WindowSet:
    """Load the window list of ``workload`` (generated by :func:`generate`)."""
    dataset = DATASET_OF_WORKLOAD[workload]
    d = data_dir / dataset
    if dataset == "tokens":
        order = workload.split("-", 1)[1]
        # a shuffled epoch reads the sequential windows, in the order the loader chooses
        starts = np.load(d / f"windows_{'sequential' if order == 'shuffled' else order}.npy")
        w = sizes.window_tokens
        return WindowSet(
            workload=workload,
            dataset=dataset,
            count=len(starts),
            payload_bytes=np.full(len(starts), w * TOKEN_DTYPE.itemsize, dtype=np.int64),
            starts=starts,
            length=w,
        )
    if dataset == "temporal":
        records = np.load(d / "window_records.npy")
        starts = np.load(d / "window_starts.npy")
        per_frame = sum(_row_bytes(f) for f in TEMPORAL_WINDOW_FIELDS)
        return WindowSet(
            workload=workload,
            dataset=dataset,
            count=len(starts),
            payload_bytes=np.full(
                len(starts), per_frame * sizes.temporal_window_frames, dtype=np.int64
            ),
            starts=starts,
            records=records,
            frames=sizes.temporal_window_frames,
            fields=TEMPORAL_WINDOW_FIELDS,
        )
    batches = np.load(d / "batches.npy")
    offsets = np.load(d / "offsets.npy")
    doc_sizes = (offsets[1:] - offsets[:-1])[batches]
    return WindowSet(
        workload=workload,
        dataset=dataset,
        count=len(batches),
        payload_bytes=doc_sizes.sum(axis=1),
        batches=batches,
        doc_sizes=doc_sizes,
    )


def ground_truth(data: DatasetData, windows: WindowSet, i: int) -> Payload:
    """What window ``i`` must return, read straight from the raw files."""
    if isinstance(data, TokensData):
        assert windows.starts is not None
        s = int(windows.starts[i])
        return np.array(data.tokens[s : s + windows.length])
    if isinstance(data, TemporalData):
        assert windows.records is not None and windows.starts is not None
        base = int(data.frame_offsets[int(windows.records[i])]) + int(windows.starts[i])
        return {f: np.array(data.fields[f][base : base + windows.frames]) for f in windows.fields}
    assert windows.batches is not None
    return [data.document(int(j)) for j in windows.batches[i]]


def in_token_stream(data: TokensData, row: np.ndarray, starts: np.ndarray | None) -> bool:
    """Whether ``row`` is a contiguous slice of the token stream, starting at one of
    ``starts`` when given: the check of a window returned in an order of the system's own."""
    row = np.asarray(row)
    if row.dtype != TOKEN_DTYPE or row.ndim != 1 or not 0 < len(row) <= data.total:
        return False
    candidates = np.flatnonzero(data.tokens[: data.total - len(row) + 1] == row[0])
    if starts is not None:
        candidates = np.intersect1d(candidates, starts)
    return any(np.array_equal(data.tokens[c : c + len(row)], row) for c in candidates.tolist())


def payload_equal(a: Payload, b: Payload) -> bool:
    """Exact equality of two payloads (dtype, shape and bytes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(payload_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(bytes(x) == bytes(y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return False
