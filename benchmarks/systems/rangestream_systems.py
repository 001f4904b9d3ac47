"""rangestream's own systems — SKELETON, to be completed and checked by the library's lead.

# ---------------------------------------------------------------------------------------
# Status: written against the public API as it stood when the harness was built
# (StreamStorage / TemporalArrayStorage / DocumentStorage readers). It has NOT been run
# against a finished library. The harness verifies every system's first windows byte for
# byte against the raw files, so a wrong adapter shows up as "exact ✗ MISMATCH" or as an
# error row, never as a plausible figure. If ``import rangestream`` fails, every row says
# "unavailable" with the import error.
#
# What the lead has to do:
#   1. Check ``_write_*`` (prepare): dataset layout options (block/chunk sizes, shards).
#   2. Check the read paths (sync: one call per window; async: ``concurrency`` windows in
#      flight on one reader and one event loop).
#   3. Fill in ``RangestreamLoader`` (StatefulDataLoader.from_storage); it reports itself
#      unavailable until then.
# ---------------------------------------------------------------------------------------

Objects must stay at or below ``OBJECT_BYTES`` (4 MiB) on the S3 server: SeaweedFS stores
larger objects as 4 MiB pieces and range GETs into them are several times slower, which real
S3 does not do. A Zarr block of 4 MiB of data plus its chunk index would be just over, so the
blocks here are written with ``PEER_CHUNK_BYTES`` of data. The report lists the largest
uploaded object per prefix so this stays visible.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import PEER_CHUNK_BYTES, TEMPORAL_GROUPS, RunConfig
from benchmarks.systems.base import (
    Location,
    Support,
    System,
    Unavailable,
    payload_nbytes,
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
            "client_kwargs": {"endpoint_url": ep.proxy_url, "region_name": ep.region},
            # s3fs allows 10 connections by default (ARCHITECTURE.md)
            "config_kwargs": {"max_pool_connections": max(64, max_concurrency)},
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
            storage = rs.StreamStorage(
                url, rs.StreamNumpyFormat(TOKEN_ROW), block_bytes=PEER_CHUNK_BYTES
            )
            ends = np.cumsum(data.doc_lengths)
            starts = ends - data.doc_lengths
            with storage.sync_writer() as w:
                for shard, a, b in _contiguous_shards(len(data.doc_lengths)):
                    for d in range(a, b):
                        doc = np.array(data.tokens[int(starts[d]) : int(ends[d])])
                        w.append(shard, {TOKEN_FIELD: doc})
        elif isinstance(data, TemporalData):
            storage = rs.TemporalArrayStorage(
                url, field_groups=[list(g) for g in TEMPORAL_GROUPS], block_bytes=PEER_CHUNK_BYTES
            )
            with storage.sync_writer() as w:
                for shard, a, b in _contiguous_shards(len(data.frame_counts)):
                    for r in range(a, b):
                        w.append(shard, data.record(r))
        else:
            assert isinstance(data, DocumentsData)
            storage = rs.DocumentStorage(
                url, rs.DocumentPickleFormat(), block_bytes=PEER_CHUNK_BYTES
            )
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
            return np.array(got[TOKEN_FIELD])  # unpack returns views of the window's rows
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
        return sum(payload_nbytes(self._window(windows, i)) for i in ids.tolist())


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
            return np.array(got[TOKEN_FIELD])
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
        super().close()


class RangestreamLoader(_Rangestream):
    """``StatefulDataLoader.from_storage`` — NOT WRITTEN: for the lead (reports unavailable)."""

    name = "rangestream-loader"
    label = "rangestream StatefulDataLoader"

    def check_available(self) -> None:
        _rangestream()
        raise Unavailable("benchmark adapter for the DataLoader not written yet")

    def supports(self, workload: str, location: str) -> Support | None:
        return None

    def open(self, data: DatasetData, location: Location) -> None:
        raise NotImplementedError

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        raise NotImplementedError

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        raise NotImplementedError
