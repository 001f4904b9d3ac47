"""MosaicML Streaming (pip ``mosaicml-streaming``), run in its own virtualenv.

MosaicML reads whole samples out of MDS shards that it downloads whole into its local
cache; it has no windows across samples and no range reads. The closest honest equivalents:

- tokens: the stream cut into fixed samples of 2049 tokens (``ndarray:int32:2049``, the way
  its text examples pre-concatenate tokens); a window reads the sample holding its start
  (aligned, like LitData's TokensLoader). Sequential order also through its DataLoader.
- temporal: one sample per record; the window is sliced out of the whole record. ``valid``
  is stored as uint8 (MDS ndarrays have no bool) and viewed back as bool.
- documents: one ``bytes`` sample per document; a batch reads its documents one by one.

S3: MosaicML's boto3 client takes its endpoint from ``S3_ENDPOINT_URL`` (set by the harness
for S3 workers) and credentials from the usual ``AWS_*`` variables.

Import note: ``import streaming`` imports ``streaming.vision``, which imports torchvision;
PyPI's torchvision cannot import beside the CPU build of torch (its ``_C.so`` links
``libtorch_cuda``). The vision datasets are never used here, so an empty module is put in
their place before the import instead of installing a CUDA torch (5.5 GB) for them.
"""

from __future__ import annotations

import sys
import types
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import LOADER_WORKLOADS, PEER_CHUNK_BYTES, RunConfig
from benchmarks.systems.base import Location, Support, System, Unavailable, payload_nbytes
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

LOADER_WORKERS = 2
LOADER_BATCH = 8


def _import_streaming() -> Any:
    if "streaming" not in sys.modules:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    try:
        import streaming
    except ImportError as exc:
        raise Unavailable(f"mosaicml-streaming not importable: {exc}") from exc
    return streaming


class MosaicDataset(System):
    """``StreamingDataset[i]`` (``get_item``): whole shards downloaded, then samples decoded."""

    name = "mosaic-dataset"
    label = "MosaicML StreamingDataset[i]"
    family = "mosaic"

    def __init__(self) -> None:
        self._ds: Any = None
        self._block = 0
        self._samples = 0

    def check_available(self) -> None:
        _import_streaming()

    def supports(self, workload: str, location: str) -> Support | None:
        if workload.startswith("tokens"):
            return Support(
                exact=False,
                note="MDS samples of 2049 tokens (no windows across samples): reads the "
                "sample holding each window's start; whole shards downloaded on first touch",
            )
        if workload == "temporal":
            return Support(
                note="one MDS sample per record: whole record read (whole shard downloaded on "
                "first touch), 64-frame window of features + pose sliced out"
            )
        if workload == "documents":
            return Support(note="one MDS bytes sample per document, read one by one")
        return None

    def prepare(self, data: DatasetData, out_dir: Path, config: RunConfig) -> None:
        streaming = _import_streaming()
        if isinstance(data, TokensData):
            w = data.window_tokens
            columns = {"tokens": f"ndarray:int32:{w}"}
            with streaming.MDSWriter(
                out=str(out_dir), columns=columns, size_limit=PEER_CHUNK_BYTES
            ) as writer:
                for k in range(data.total // w):
                    writer.write({"tokens": np.array(data.tokens[k * w : (k + 1) * w])})
        elif isinstance(data, TemporalData):
            columns = {
                "features": "ndarray:float32",
                "clock": "ndarray:float64",
                "valid": "ndarray:uint8",
                "pose": "ndarray:float32",
            }
            with streaming.MDSWriter(
                out=str(out_dir), columns=columns, size_limit=PEER_CHUNK_BYTES
            ) as writer:
                for i in range(len(data.frame_counts)):
                    rec = data.record(i)
                    rec["valid"] = rec["valid"].view(np.uint8)
                    writer.write(rec)
        else:
            assert isinstance(data, DocumentsData)
            with streaming.MDSWriter(
                out=str(out_dir), columns={"doc": "bytes"}, size_limit=PEER_CHUNK_BYTES
            ) as writer:
                for i in range(data.count):
                    writer.write({"doc": data.document(i)})

    def _make_dataset(self, location: Location, batch_size: int) -> Any:
        streaming = _import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        shuffle = self.workload in LOADER_WORKLOADS  # its default algorithm, py1e
        if location.kind == "s3":
            return streaming.StreamingDataset(
                remote=location.s3_url,
                local=str(location.cache_dir / "mds"),
                shuffle=shuffle,
                batch_size=batch_size,
            )
        return streaming.StreamingDataset(
            local=str(location.local_dir), shuffle=shuffle, batch_size=batch_size
        )

    _batch_size = 1  # MosaicML partitions by batch; the loader's dataset must match its batch

    def open(self, data: DatasetData, location: Location) -> None:
        self._ds = self._make_dataset(location, self._batch_size)
        self._samples = len(self._ds)
        if isinstance(data, TokensData):
            self._block = data.window_tokens

    def _sample_of(self, windows: WindowSet, i: int) -> int:
        assert windows.starts is not None
        return min(int(windows.starts[i]) // self._block, self._samples - 1)

    def truth(self, data: DatasetData, windows: WindowSet, i: int) -> Payload:
        if isinstance(data, TokensData):
            k = self._sample_of(windows, i)
            return np.array(data.tokens[k * self._block : (k + 1) * self._block])
        return super().truth(data, windows, i)

    def _window(self, windows: WindowSet, i: int) -> Payload:
        ds = self._ds
        if windows.dataset == "tokens":
            return np.asarray(ds[self._sample_of(windows, i)]["tokens"], dtype=TOKEN_DTYPE)
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            rec = ds[int(windows.records[i])]
            s = int(windows.starts[i])
            out = {}
            for f in windows.fields:
                dtype, _trailing = TEMPORAL_SPECS[f]
                arr = rec[f][s : s + windows.frames]
                out[f] = np.array(arr.view(np.bool_) if dtype == np.bool_ else arr)
            return out
        assert windows.batches is not None
        return [bytes(ds[j]["doc"]) for j in windows.batches[i].tolist()]

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        return self._window(windows, i)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        return sum(payload_nbytes(self._window(windows, i)) for i in ids.tolist())

    def close(self) -> None:
        self._ds = None


class MosaicLoader(MosaicDataset):
    """MosaicML's ``StreamingDataLoader`` over the token samples: the training-loop path."""

    name = "mosaic-loader"
    label = f"MosaicML StreamingDataLoader ({LOADER_WORKERS} workers)"
    _batch_size = LOADER_BATCH

    def __init__(self) -> None:
        super().__init__()
        self._iter: Any = None
        self._rows: deque[np.ndarray] = deque()
        self._location: Location | None = None

    def supports(self, workload: str, location: str) -> Support | None:
        if workload not in ("tokens-sequential", *LOADER_WORKLOADS):
            return None
        shuffled = workload in LOADER_WORKLOADS
        check = (
            "the check finds each row checked in the token stream"
            if shuffled
            else "the check compares the dataset's samples, not the order"
        )
        return Support(
            own_concurrency=True,
            any_order=shuffled,
            exact=False,
            note=f"StreamingDataLoader(batch_size={LOADER_BATCH}, num_workers={LOADER_WORKERS}) "
            f"over the 2049-token samples in its own order (shuffle={shuffled}"
            f"{', py1e' if shuffled else ''}), iterated across repeats; {check}",
        )

    def open(self, data: DatasetData, location: Location) -> None:
        super().open(data, location)
        self._location = location

    def _next_row(self) -> np.ndarray:
        streaming = _import_streaming()
        while not self._rows:
            if self._iter is None:
                assert self._location is not None
                loader = streaming.StreamingDataLoader(
                    self._ds, batch_size=LOADER_BATCH, num_workers=LOADER_WORKERS
                )
                self._iter = iter(loader)
            try:
                batch = next(self._iter)
            except StopIteration:
                self._iter = None
                continue
            tokens = batch["tokens"]
            self._rows.extend(tokens.numpy() if hasattr(tokens, "numpy") else tokens)
        return self._rows.popleft()

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        """Shuffled: the loader's next row (found in the stream by the check); in order:
        the dataset's sample for window ``i``."""
        if self.workload in LOADER_WORKLOADS:
            return np.asarray(self._next_row(), dtype=TOKEN_DTYPE)
        return super().fetch(windows, i)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        return sum(int(self._next_row().nbytes) for _ in range(len(ids)))

    def close(self) -> None:
        self._iter = None
        self._rows.clear()
        super().close()
