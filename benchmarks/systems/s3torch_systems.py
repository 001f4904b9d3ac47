"""Amazon's S3 Connector for PyTorch (``s3torchconnector``, on the AWS CRT client).

The loader AWS recommends for training from S3, in its documented configurations over the
same SeaweedFS server and latency proxy as every other row (endpoint, ``force_path_style``
through ``S3ClientConfig``; keys from the ``AWS_*`` environment the harness sets):

- ``s3torch-map``: ``S3MapDataset.from_prefix`` (one listing gives every object's size, so
  no HEAD per item) with range-based reads
  (``S3ReaderConstructor.range_based(buffer_size=0)``: one range GET per ``read``, no 8 MiB
  read-ahead, the documented setting for sparse partial reads). A window is application
  code on top of it: seek to the window in its object and read it (two reads where a window
  crosses an object). Random windows at ``c`` in flight from ``c`` threads (the CRT client
  releases the GIL); on ``tokens-shuffled`` under ``DataLoader(shuffle=True)`` with the
  same batch and worker count as the other loaders.
- ``s3torch-iterable``: ``S3IterableDataset.from_prefix`` with its default sequential
  reader (whole objects, streamed) under a DataLoader, sharded over its workers
  (``enable_sharding=True``) on ``tokens-sequential``; each worker cuts the workload's
  windows out of its objects (windows that cross into another worker's object are not
  emitted, about 1 in 512 here, so the row is an equivalent job, checked on the map path).

The data: the raw int32 token stream cut into objects of ``OBJECT_BYTES`` (4 MiB, 1 Mi
tokens), the plain layout such a loader reads; no index object is needed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from benchmarks.config import (
    LOADER_BATCH,
    LOADER_WORKERS,
    LOADER_WORKLOADS,
    OBJECT_BYTES,
    RunConfig,
)
from benchmarks.systems.base import Location, Support, System, Unavailable
from benchmarks.workloads import TOKEN_DTYPE, DatasetData, Payload, TokensData, WindowSet

OBJECT_TOKENS = OBJECT_BYTES // TOKEN_DTYPE.itemsize


def _object_name(k: int) -> str:
    return f"tokens-{k:05d}.bin"


def _s3t() -> Any:
    try:
        import s3torchconnector
    except Exception as exc:  # any import failure: the row says why
        raise Unavailable(f"import s3torchconnector failed: {type(exc).__name__}: {exc}") from exc
    return s3torchconnector


class TokenWindows:
    """Map-style windows over ``S3MapDataset`` items (one item per object).

    Item ``i`` is the window at ``starts[i]``: its object's reader, ``seek`` and ``read``
    (range-based: one range GET per read). Picklable, so DataLoader workers each open their
    own client, as the connector's documentation has it.
    """

    def __init__(self, objects: Any, starts: np.ndarray, length: int) -> None:
        self.objects, self.starts, self.length = objects, starts, length

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> np.ndarray:
        start, out = int(self.starts[i]), bytearray()
        stop = start + self.length
        while start < stop:
            k, offset = divmod(start, OBJECT_TOKENS)
            n = min(stop - start, OBJECT_TOKENS - offset)
            reader = self.objects[k]
            reader.seek(offset * TOKEN_DTYPE.itemsize)
            out += reader.read(n * TOKEN_DTYPE.itemsize)
            start += n
        return np.frombuffer(out, TOKEN_DTYPE)


def _windows_of_object(reader: Any) -> tuple[int, bytes]:
    """The iterable dataset's transform: the object's index and its whole body."""
    return int(Path(reader.key).stem.rsplit("-", 1)[1]), reader.read()


class _Rows(IterableDataset):  # type: ignore[type-arg]
    """Sequential rows from the iterable dataset: the windows inside each object."""

    def __init__(self, objects: Any, stride: int, length: int) -> None:
        self.objects, self.stride, self.length = objects, stride, length

    def __iter__(self) -> Any:
        for k, body in self.objects:
            tokens = np.frombuffer(body, TOKEN_DTYPE)
            base = k * OBJECT_TOKENS
            first = -(-base // self.stride) * self.stride  # the first window start inside
            for s in range(first - base, len(tokens) - self.length + 1, self.stride):
                yield tokens[s : s + self.length].copy()


class _S3Torch(System):
    family = "s3torch"

    def __init__(self) -> None:
        self._map: TokenWindows | None = None
        self._iter: Any = None
        self._loader: DataLoader | None = None
        self._loader_windows: WindowSet | None = None
        self._rows: deque[np.ndarray] = deque()
        self._windows: WindowSet | None = None
        self._location: Location | None = None
        self._pool: ThreadPoolExecutor | None = None

    def check_available(self) -> None:
        _s3t()

    def _row_from(self, make_loader: Callable[[], DataLoader], windows: WindowSet) -> np.ndarray:
        """The next row out of the loader's epochs (one loader, iterated again when an epoch
        ends, as a training loop does): a repeat may outlast an epoch."""
        if self._loader_windows is not windows:  # a loader reads one workload's windows
            self._iter = self._loader = None
            self._loader_windows = windows
        while not self._rows:
            if self._iter is None:
                if self._loader is None:
                    self._loader = make_loader()
                self._iter = iter(self._loader)
            try:
                batch = next(self._iter)
            except StopIteration:
                self._iter = None
                continue
            self._rows.extend(batch.numpy())
        return self._rows.popleft()

    def prepare(self, data: DatasetData, out_dir: Path, config: RunConfig) -> None:
        if not isinstance(data, TokensData):
            return
        for k, a in enumerate(range(0, data.total, OBJECT_TOKENS)):
            (out_dir / _object_name(k)).write_bytes(data.tokens[a : a + OBJECT_TOKENS].tobytes())

    def _prefix(self, location: Location) -> str:
        """The objects' prefix: listed once at open, which gives the readers the objects'
        sizes (``from_objects`` would make a HEAD per item: 2 requests per window)."""
        return f"{location.s3_url}/tokens-"

    def _client_kwargs(self, location: Location) -> dict[str, Any]:
        s3t = _s3t()
        ep = location.endpoint
        assert ep is not None
        return {
            "region": ep.region,
            "endpoint": ep.proxy_url,
            "s3client_config": s3t.S3ClientConfig(force_path_style=True),
        }

    def open(self, data: DatasetData, location: Location) -> None:
        assert isinstance(data, TokensData)
        s3t = _s3t()
        self._location = location
        objects = s3t.S3MapDataset.from_prefix(
            self._prefix(location),
            reader_constructor=s3t.S3ReaderConstructor.range_based(buffer_size=0),
            **self._client_kwargs(location),
        )
        self._data = data
        self._map_objects = objects

    def _windows_map(self, windows: WindowSet) -> TokenWindows:
        if self._map is None or self._windows is not windows:
            assert windows.starts is not None
            self._map = TokenWindows(self._map_objects, windows.starts, windows.length)
            self._windows = windows
        return self._map

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        return self._windows_map(windows)[i]

    def close(self) -> None:
        self._iter = self._loader = self._loader_windows = None
        self._rows.clear()
        self._map = self._windows = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class S3TorchMap(_S3Torch):
    """``S3MapDataset`` with range-based reads: random windows, and a shuffled DataLoader."""

    name = "s3torch-map"
    label = "s3torchconnector S3MapDataset, range reads"

    def supports(self, workload: str, location: str) -> Support | None:
        if location != "s3" or workload not in ("tokens-random", *LOADER_WORKLOADS):
            return None
        reads = "S3MapDataset, S3ReaderConstructor.range_based(buffer_size=0), seek + read"
        if workload in LOADER_WORKLOADS:
            return Support(
                own_concurrency=True,
                any_order=True,
                note=f"{reads} per window under DataLoader(batch_size={LOADER_BATCH}, "
                f"num_workers={LOADER_WORKERS}, shuffle=True), iterated across repeats",
            )
        return Support(
            concurrency=(1, 16, 64),
            note=f"{reads} per window; c = windows in flight from c threads",
        )

    def _next_row(self, windows: WindowSet) -> np.ndarray:
        return self._row_from(
            lambda: DataLoader(
                self._windows_map(windows),
                batch_size=LOADER_BATCH,
                num_workers=LOADER_WORKERS,
                shuffle=True,
            ),
            windows,
        )

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        if self.workload in LOADER_WORKLOADS:
            return self._next_row(windows)
        return super().fetch(windows, i)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        if self.workload in LOADER_WORKLOADS:
            return sum(int(self._next_row(windows).nbytes) for _ in range(len(ids)))
        items = self._windows_map(windows)
        if concurrency <= 1:
            return sum(int(items[i].nbytes) for i in ids.tolist())
        if self._pool is None or self._pool._max_workers != concurrency:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = ThreadPoolExecutor(concurrency)
        return sum(int(w.nbytes) for w in self._pool.map(items.__getitem__, ids.tolist()))


class S3TorchIterable(_S3Torch):
    """``S3IterableDataset`` (sequential reader) under a DataLoader: tokens in order."""

    name = "s3torch-iterable"
    label = f"s3torchconnector S3IterableDataset ({LOADER_WORKERS} workers)"

    def supports(self, workload: str, location: str) -> Support | None:
        if location != "s3" or workload != "tokens-sequential":
            return None
        return Support(
            own_concurrency=True,
            exact=False,
            note=f"S3IterableDataset.from_prefix (sequential reader, enable_sharding=True) "
            f"under DataLoader(batch_size={LOADER_BATCH}, num_workers={LOADER_WORKERS}); each "
            "worker cuts the workload's windows out of its whole objects (windows crossing "
            "into another worker's object are not emitted); checked on the map-style path",
        )

    def _next_row(self, windows: WindowSet) -> np.ndarray:
        def make_loader() -> DataLoader:
            assert self._location is not None and windows.starts is not None
            objects = _s3t().S3IterableDataset.from_prefix(
                self._prefix(self._location),
                transform=_windows_of_object,
                enable_sharding=True,
                **self._client_kwargs(self._location),
            )
            stride = int(windows.starts[1] - windows.starts[0])
            rows = _Rows(objects, stride, windows.length)
            return DataLoader(rows, batch_size=LOADER_BATCH, num_workers=LOADER_WORKERS)

        return self._row_from(make_loader, windows)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        return sum(int(self._next_row(windows).nbytes) for _ in range(len(ids)))
