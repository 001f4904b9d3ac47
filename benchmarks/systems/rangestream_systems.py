"""rangestream's systems: sync and async readers, and the StatefulDataLoader.

- ``rangestream-sync``: ``StreamStorage.sync_reader().read`` (tokens),
  ``TemporalArrayStorage.read_window`` (temporal), ``DocumentStorage`` ``read_many`` (documents);
  one call per window.
- ``rangestream-dataset``: the seed's own calls as the reference documents write them, on
  local disk: ``StreamDataset(storage, sequence_length=2049, stride=1).sync_reader()[i]``
  (window ``i`` starts at token ``i``) for tokens, ``storage.read_window(record, start=...,
  frames=..., fields=[...])`` for temporal windows.
- ``rangestream-async``: the same through ``async_reader()`` / ``aread_window`` with
  ``concurrency`` windows in flight on one reader and one event loop.
- ``rangestream-loader``: ``StatefulDataLoader.from_storage`` (2 workers, batches of 8,
  ``next_token=True``), beside LitData's ``StreamingDataLoader``: sequential order
  (``shuffle=False``) and a shuffled epoch (``shuffle=True``, the per-window shuffle).

Hooks for the next loader rows (see benchmarks/README.md): ``RangestreamLoader`` builds its
loader in :meth:`RangestreamLoader.make_loader` from :meth:`RangestreamLoader.loader_options`;
the block-shuffle row (``rangestream-loader-block``) overrides ``loader_options`` and the
mixed row (``rangestream-loader-mixed``) overrides ``make_loader``.

Datasets are written with the library's defaults, except that temporal blocks are bounded
at ``OBJECT_BYTES`` (the library's default there is 16 MiB). ``block_bytes`` (4 MiB by
default elsewhere) bounds the whole stored object (data, crc and chunk index), so every
object stays at or below ``OBJECT_BYTES``, the size above which SeaweedFS splits objects
into pieces and range GETs into them slow down (real S3 does not), as the peers' chunks
are bounded too; the report lists the largest uploaded object per prefix so this stays
visible. With 4 MiB temporal blocks, the padding that keeps records inside blocks is about
11% of the rows (disk only: reads never fetch it).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import (
    LOADER_BATCH,
    LOADER_WORKERS,
    LOADER_WORKLOADS,
    OBJECT_BYTES,
    TEMPORAL_GROUPS,
    RunConfig,
)
from benchmarks.systems.base import (
    Location,
    Support,
    System,
    Unavailable,
    payload_nbytes,
    read_temporal_windows,
    run_lanes,
)
from benchmarks.workloads import (
    TOKEN_DTYPE,
    DatasetData,
    DocumentsData,
    Payload,
    TemporalData,
    TokensData,
    WindowSet,
)

SHARDS = 4  # writer partitions; contiguous runs of documents/records keep the global order
TOKEN_FIELD = "tokens"
TOKEN_ROW = np.dtype([(TOKEN_FIELD, TOKEN_DTYPE)])  # StreamNumpyFormat takes structured dtypes


def stored_ids(ids: np.ndarray) -> np.ndarray:
    """The loader's int64 token ids (its model-ready default, timed as users get them) back
    in the stored dtype, so the check compares them with the stored truth and the bytes
    count as the stored payload's; a value that does not survive the cast stays int64 and
    fails the check."""
    stored = ids.astype(TOKEN_DTYPE)
    return stored if np.array_equal(stored, ids) else ids


def _rangestream() -> Any:
    try:
        import rangestream
    except Exception as exc:  # any import failure: the row says why
        raise Unavailable(f"import rangestream failed: {type(exc).__name__}: {exc}") from exc
    return rangestream


def _storage_kwargs(location: Location, max_concurrency: int = 64) -> dict[str, Any]:
    if location.kind != "s3":
        return {}
    ep = location.endpoint
    assert ep is not None
    return {
        "storage_options": {
            "key": ep.access_key,
            "secret": ep.secret_key,
            # no pool size forced: the library sizes its connection pools from the request
            # cap (``io/request_cap.py``), as a user running it with these options gets
            "client_kwargs": {"endpoint_url": ep.proxy_url, "region_name": ep.region},
        },
        "max_concurrency": max_concurrency,
    }


def _url(location: Location) -> str:
    """The dataset written by ``prepare`` (in ``<prepared>/ds``, uploaded as ``<s3_url>/ds``)."""
    if location.kind == "s3":
        return f"{location.s3_url}/ds"
    return str(location.local_dir / "ds")


def _contiguous_shards(n: int) -> list[tuple[int, int, int]]:
    """(shard, first, stop) covering 0..n in order, so shard order = global order."""
    bounds = np.linspace(0, n, SHARDS + 1).astype(int)
    return [(k, int(bounds[k]), int(bounds[k + 1])) for k in range(SHARDS)]


class _Rangestream(System):
    family = "rangestream"

    def __init__(self) -> None:
        self._storage: Any = None
        self._reader: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def check_available(self) -> None:
        _rangestream()

    # ---------------------------------------------------------------- prepare (write)

    def prepare(self, data: DatasetData, out_dir: Path, config: RunConfig) -> None:
        rs = _rangestream()
        url = str(out_dir / "ds")  # uploaded unchanged: s3://.../rangestream/<dataset>/ds
        if isinstance(data, TokensData):
            storage = rs.StreamStorage(url, rs.StreamNumpyFormat(TOKEN_ROW))
            ends = np.cumsum(data.doc_lengths)
            starts = ends - data.doc_lengths
            with storage.sync_writer() as w:
                for shard, a, b in _contiguous_shards(len(data.doc_lengths)):
                    for d in range(a, b):
                        doc = np.array(data.tokens[int(starts[d]) : int(ends[d])])
                        w.append(shard, {TOKEN_FIELD: doc})
        elif isinstance(data, TemporalData):
            storage = rs.TemporalArrayStorage(
                url,
                field_groups=[list(g) for g in TEMPORAL_GROUPS],
                block_bytes=OBJECT_BYTES,  # the library's 16 MiB would be SeaweedFS pieces
            )
            with storage.sync_writer() as w:
                for shard, a, b in _contiguous_shards(len(data.frame_counts)):
                    for r in range(a, b):
                        w.append(shard, data.record(r))
        else:
            assert isinstance(data, DocumentsData)
            storage = rs.DocumentStorage(url, rs.DocumentPickleFormat())
            with storage.sync_writer() as w:
                for shard, a, b in _contiguous_shards(data.count):
                    for d in range(a, b):
                        w.append(shard, data.document(d))

    def _make_storage(self, data: DatasetData, location: Location, concurrency: int) -> Any:
        rs = _rangestream()
        url, kw = _url(location), _storage_kwargs(location, concurrency)
        if isinstance(data, TokensData):
            return rs.StreamStorage(url, rs.StreamNumpyFormat(TOKEN_ROW), **kw)
        if isinstance(data, TemporalData):
            return rs.TemporalArrayStorage(url, **kw)
        return rs.DocumentStorage(url, rs.DocumentPickleFormat(), **kw)

    def close(self) -> None:
        for obj in (self._reader, self._storage):
            closer = getattr(obj, "close", None)
            if callable(closer):
                closer()
        self._reader = self._storage = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None


class RangestreamSync(_Rangestream):
    """Sync readers: ``StreamStorage.sync_reader().read``, ``read_window``, ``read_many``."""

    name = "rangestream-sync"
    label = "rangestream sync"

    def supports(self, workload: str, location: str) -> Support | None:
        return Support(concurrency=(1,), note="sync reader, one call per window")

    def open(self, data: DatasetData, location: Location) -> None:
        self._storage = self._make_storage(data, location, 16)
        if not isinstance(data, TemporalData):
            self._reader = self._storage.sync_reader()

    def _window(self, windows: WindowSet, i: int) -> Payload:
        if windows.dataset == "tokens":
            assert windows.starts is not None
            got = self._reader.read(int(windows.starts[i]), windows.length)
            # a view of a buffer private to this read, as LitData's read_window returns:
            # writable, and nothing else refers to it, so no second copy
            return np.asarray(got[TOKEN_FIELD])
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            return self._storage.read_window(
                int(windows.records[i]), int(windows.starts[i]), windows.frames,
                list(windows.fields),
            )  # fmt: skip
        assert windows.batches is not None
        return list(self._reader.read_many(windows.batches[i].tolist()))

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        return self._window(windows, i)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        if windows.dataset == "temporal":  # the loop raw-memmap's temporal read runs
            return read_temporal_windows(self._storage.read_window, windows, ids)
        if windows.dataset == "tokens":  # likewise: starts converted at once, as raw-memmap
            assert windows.starts is not None
            read, length, total = self._reader.read, windows.length, 0
            for start in windows.starts[ids].tolist():
                total += read(start, length)[TOKEN_FIELD].nbytes
            return total
        return sum(payload_nbytes(self._window(windows, i)) for i in ids.tolist())


class RangestreamDataset(_Rangestream):
    """The seed's own calls, as the reference documents write them, on local disk.

    - tokens: ``with StreamDataset(storage, sequence_length=2049, stride=1).sync_reader() as
      reader: reader[i]``. With ``stride=1`` item ``i`` is the window that starts at token
      ``i``, so every workload window is one item, read exactly as a training script
      indexes a dataset;
    - temporal: ``storage.read_window(record, start=s, frames=f, fields=[...])`` on the
      ``TemporalArrayStorage`` itself, keyword arguments as in the reference.

    The rows sit beside ``rangestream-sync`` (the reader calls) so the cost of the call path
    users write is visible on its own.
    """

    name = "rangestream-dataset"
    label = "rangestream seed calls: StreamDataset[i], read_window"

    def supports(self, workload: str, location: str) -> Support | None:
        if location != "local":
            return None
        if workload == "temporal":
            return Support(
                concurrency=(1,),
                note="storage.read_window(record, start=s, frames=f, fields=[...]) on the "
                "TemporalArrayStorage, one call per window (the reference's call form)",
            )
        if not workload.startswith("tokens"):
            return None
        return Support(
            concurrency=(1,),
            note="with StreamDataset(storage, sequence_length=2049, stride=1).sync_reader() "
            "as reader: reader[i], item i = the window starting at token i; one item per window",
        )

    def open(self, data: DatasetData, location: Location) -> None:
        rs = _rangestream()
        self._storage = self._make_storage(data, location, 16)
        if isinstance(data, TemporalData):
            return
        assert isinstance(data, TokensData)
        dataset = rs.StreamDataset(self._storage, sequence_length=data.window_tokens, stride=1)
        self._reader = dataset.sync_reader().__enter__()

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        assert windows.starts is not None
        if windows.dataset == "temporal":
            assert windows.records is not None
            return self._storage.read_window(
                int(windows.records[i]), start=int(windows.starts[i]), frames=windows.frames,
                fields=list(windows.fields),
            )  # fmt: skip
        return np.asarray(self._reader[int(windows.starts[i])][TOKEN_FIELD])

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        # raw-memmap's loop: window arguments converted at once, then one call per window
        assert windows.starts is not None
        total = 0
        if windows.dataset == "temporal":
            assert windows.records is not None
            read_window, frames, fields = (
                self._storage.read_window,
                windows.frames,
                list(windows.fields),
            )
            records, starts = windows.records[ids].tolist(), windows.starts[ids].tolist()
            for record, start in zip(records, starts, strict=True):
                got = read_window(record, start=start, frames=frames, fields=fields)
                for array in got.values():
                    total += array.nbytes
            return total
        reader = self._reader
        for start in windows.starts[ids].tolist():
            total += reader[start][TOKEN_FIELD].nbytes
        return total

    def close(self) -> None:
        if self._reader is not None:
            self._reader.__exit__(None, None, None)
            self._reader = None
        super().close()


class RangestreamAsync(_Rangestream):
    """Async readers with ``concurrency`` windows in flight on one reader and loop."""

    name = "rangestream-async"
    label = "rangestream async"

    def supports(self, workload: str, location: str) -> Support | None:
        return Support(
            concurrency=(1, 16, 64),
            note="async reader; c = windows in flight (concurrent read / aread_window / "
            "read_many calls on one reader)",
        )

    def open(self, data: DatasetData, location: Location) -> None:
        self._loop = asyncio.new_event_loop()
        self._storage = self._make_storage(data, location, 64)
        if not isinstance(data, TemporalData):
            self._reader = self._loop.run_until_complete(self._storage.async_reader().__aenter__())

    async def _window(self, windows: WindowSet, i: int) -> Payload:
        if windows.dataset == "tokens":
            assert windows.starts is not None
            got = await self._reader.read(int(windows.starts[i]), windows.length)
            return np.asarray(got[TOKEN_FIELD])  # private to this read (see the sync one)
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            return await self._storage.aread_window(
                int(windows.records[i]), int(windows.starts[i]), windows.frames,
                list(windows.fields),
            )  # fmt: skip
        assert windows.batches is not None
        return list(await self._reader.read_many(windows.batches[i].tolist()))

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        assert self._loop is not None
        return self._loop.run_until_complete(self._window(windows, i))

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        assert self._loop is not None
        return self._loop.run_until_complete(self._read_many(windows, ids, concurrency))

    async def _read_many(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        async def one(i: int) -> int:
            return payload_nbytes(await self._window(windows, i))

        return await run_lanes(ids.tolist(), concurrency, one)

    def close(self) -> None:
        if self._loop is not None and self._reader is not None:
            self._loop.run_until_complete(self._reader.__aexit__(None, None, None))
            self._reader = None
        if self._loop is not None and self._storage is not None:
            aclose = getattr(self._storage, "aclose", None)
            if callable(aclose):
                self._loop.run_until_complete(aclose())
        if self._loop is not None:
            # as asyncio.run does: the loop's shared S3 clients close with its async generators
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        super().close()


def collate_with_io_stats(samples: list[Any]) -> tuple[Any, int, Any]:
    """Stack the windows and attach this worker's I/O totals so far (as ``cli/demo.py``).

    Workers are separate processes: this is how their exact request and byte counts reach
    the measuring process for the local rows, where no proxy counts them.
    """
    from rangestream.io import process_io_stats
    from rangestream.loader import stack_collate

    return stack_collate(samples), os.getpid(), process_io_stats()


class RangestreamLoader(_Rangestream):
    """``StatefulDataLoader.from_storage``: the training-loop path, beside LitData's loader.

    On the sequential workload ``shuffle=False``, so loader row ``k`` is window ``k`` and
    the rows are checked byte for byte; on the shuffled workload ``shuffle=True`` (the
    per-window shuffle) and each row checked is found among the workload's windows. The open
    is timed with the first *batch* out of the loader (workers started, first reads done),
    which is the time to first batch a training loop sees. No cache directory: local disk
    used is 0.

    :class:`RangestreamBlockLoader` overrides :meth:`loader_options` (the
    ``from_storage`` arguments) for ``shuffle="block"``; :meth:`make_loader` is the hook for
    a mixture of sources.
    """

    name = "rangestream-loader"
    label = f"rangestream StatefulDataLoader ({LOADER_WORKERS} workers)"

    def __init__(self) -> None:
        super().__init__()
        self._iter: Any = None
        self._loader: Any = None
        self._rows: deque[np.ndarray] = deque()
        self._next_index = 0
        self._io: dict[int, Any] = {}
        self._epoch_started: float | None = None  # iter() of an epoch after the first
        self._later_first_batches: list[float] = []

    def supports(self, workload: str, location: str) -> Support | None:
        if workload not in ("tokens-sequential", *LOADER_WORKLOADS):
            return None
        shuffled = workload in LOADER_WORKLOADS
        return Support(
            own_concurrency=True,
            any_order=shuffled,
            note=f"StatefulDataLoader.from_storage(sequence_length=2048, next_token=True, "
            f"batch_size={LOADER_BATCH}, num_workers={LOADER_WORKERS}, "
            f"shuffle={'window' if shuffled else False!r}), iterated across repeats "
            "(one loader, an epoch per pass, workers kept); no local cache",
        )

    def open(self, data: DatasetData, location: Location) -> None:
        assert isinstance(data, TokensData)
        self._storage = self._make_storage(data, location, 16)
        self._sequence_length = data.window_tokens - 1
        self._iter = self._loader = None  # a loader over this storage, made at first use
        self._rows.clear()
        self._next_index = 0
        self._later_first_batches = []
        self._next_row(peek=True)  # first batch: part of the timed open

    def loader_options(self) -> dict[str, Any]:
        """``from_storage``'s arguments for the current workload (hook: the shuffle)."""
        return {
            "sequence_length": self._sequence_length,
            "batch_size": LOADER_BATCH,
            "num_workers": LOADER_WORKERS,
            # explicit: ``True`` would take the storage's default (the block shuffle
            # over object storage), and this row is the per-window shuffle
            "shuffle": "window" if self.workload in LOADER_WORKLOADS else False,
            "next_token": True,
        }

    def make_loader(self) -> Any:
        """A fresh loader over the opened storage (hook: a mixture of sources)."""
        from rangestream import StatefulDataLoader

        return StatefulDataLoader.from_storage(
            self._storage, collate_with_io_stats, **self.loader_options()
        )

    def _next_row(self, *, peek: bool = False) -> np.ndarray:
        while not self._rows:
            if self._iter is None:
                # one loader for the whole run, a new epoch per pass, as a training loop
                # iterates it (its workers persist across epochs, the default)
                if self._loader is None:
                    self._loader = self.make_loader()
                else:  # a later epoch: its first batch is timed as a training loop sees it
                    self._epoch_started = time.perf_counter()
                self._iter = iter(self._loader)
                self._next_index = 0
            try:
                batch, pid, io = next(self._iter)
            except StopIteration:
                self._iter = None
                continue
            if self._epoch_started is not None:
                self._later_first_batches.append(time.perf_counter() - self._epoch_started)
                self._epoch_started = None
            self._io[pid] = io
            self._rows.extend(stored_ids(np.asarray(batch[TOKEN_FIELD])))
        if peek:
            return self._rows[0]
        self._next_index += 1
        return self._rows.popleft()

    def later_epoch_first_batches(self) -> list[float]:
        return list(self._later_first_batches)

    def io_counters(self) -> dict[str, float] | None:
        """Requests and bytes the workers reported (latest snapshot per worker process)."""
        return {
            "requests": float(sum(s.requests for s in self._io.values())),
            "response_bytes": float(sum(s.bytes for s in self._io.values())),
        }

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        """Window ``i`` from the loader's stream when it is next, else from a reader.

        The first fetch (timed with the open) comes out of the loader; the verification of
        later windows uses a sync reader on the same storage, so it neither consumes nor
        reorders the loader's stream. Shuffled, every fetch is the loader's next row (the
        harness finds it among the windows).
        """
        if self.workload in LOADER_WORKLOADS or (i == self._next_index and self._iter is not None):
            return np.array(self._next_row())
        assert windows.starts is not None
        if self._reader is None:
            self._reader = self._storage.sync_reader()
        return np.array(self._reader.read(int(windows.starts[i]), windows.length)[TOKEN_FIELD])

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        return sum(int(self._next_row().nbytes) for _ in range(len(ids)))

    def close(self) -> None:
        self._iter = self._loader = None  # ends the workers
        self._rows.clear()
        self._io.clear()
        super().close()


class RangestreamBlockLoader(RangestreamLoader):
    """The block shuffle (``shuffle="block"``, its data-chosen runs and ``K``) on the
    shuffled workload: runs of about 4 MiB read whole and mixed in a buffer of runs, the
    default over object storage, beside the per-window shuffle of ``rangestream-loader``."""

    name = "rangestream-loader-block"
    label = f"rangestream StatefulDataLoader, block shuffle ({LOADER_WORKERS} workers)"

    def supports(self, workload: str, location: str) -> Support | None:
        if workload not in LOADER_WORKLOADS:
            return None
        return Support(
            own_concurrency=True,
            any_order=True,
            note=f"StatefulDataLoader.from_storage(sequence_length=2048, next_token=True, "
            f"batch_size={LOADER_BATCH}, num_workers={LOADER_WORKERS}, shuffle='block') "
            "(runs of about 4 MiB, K=8 runs per buffer), iterated across repeats (one loader, "
            "an epoch per pass, workers kept); no local cache",
        )

    def loader_options(self) -> dict[str, Any]:
        return {**super().loader_options(), "shuffle": "block"}


class RangestreamMixedLoader(RangestreamLoader):
    """A weighted mixture through the one loader: ``from_storages`` over two sources.

    Both sources are the workload's stored stream, opened twice under two names with
    weights 0.7 and 0.3, so that every emitted window is still checked against the raw
    tokens; each source runs its own shuffle (the storages' default: the block shuffle over
    object storage, the per-window shuffle on local disk). Beside ``rangestream-loader`` and
    ``rangestream-loader-block`` it shows what mixing costs in throughput and requests.
    """

    name = "rangestream-loader-mixed"
    label = f"rangestream StatefulDataLoader, mixture of 2 sources ({LOADER_WORKERS} workers)"
    WEIGHTS = (0.7, 0.3)

    def supports(self, workload: str, location: str) -> Support | None:
        if workload not in LOADER_WORKLOADS:
            return None
        return Support(
            own_concurrency=True,
            any_order=True,
            note=f"StatefulDataLoader.from_storages({{a: {self.WEIGHTS[0]}, b: "
            f"{self.WEIGHTS[1]}}}, sequence_length=2048, next_token=True, "
            f"batch_size={LOADER_BATCH}, num_workers={LOADER_WORKERS}), a and b the same "
            "stored stream opened twice; each source's default shuffle; no local cache",
        )

    def open(self, data: DatasetData, location: Location) -> None:
        self._second = self._make_storage(data, location, 16)
        super().open(data, location)

    def make_loader(self) -> Any:
        from rangestream import StatefulDataLoader

        options = self.loader_options()
        del options["shuffle"]  # each source's default
        weights = dict(zip((self._storage, self._second), self.WEIGHTS, strict=True))
        return StatefulDataLoader.from_storages(
            weights,
            collate_with_io_stats,
            names={self._storage: "a", self._second: "b"},
            **options,
        )

    def close(self) -> None:
        closer = getattr(self._second, "close", None)
        if callable(closer):
            closer()
        super().close()
