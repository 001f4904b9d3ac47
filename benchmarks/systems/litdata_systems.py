"""LitData (pip ``litdata``), the peer whose numbers rangestream has to beat.

Three ways LitData does the jobs, each a system of its own so the table shows them apart:

- ``litdata-window``: ``StreamingDataset.read_window`` / ``aread_window`` over data written
  with ``TemporalArrayLoader`` (range reads, no chunk download). Temporal windows are its
  native job. Token windows: the token stream is stored as records of ``TOKEN_RECORD``
  tokens, a window at any offset is one ``read_window`` (two where it crosses a record
  boundary). Documents: one record per document, read whole with ``read_window``.
- ``litdata-dataset``: the classic path, ``StreamingDataset[i]`` (whole chunks downloaded
  into the cache dir on first touch). Tokens via ``TokensLoader(block_size=2049)``, which
  only serves blocks aligned to multiples of 2049 tokens: the equivalent job reads the block
  containing each window's start. Temporal: whole record, then the window sliced out.
- ``litdata-loader``: ``StreamingDataLoader`` iterating the TokensLoader dataset (2 workers),
  in order (``shuffle=False``) and shuffled (``shuffle=True``: chunks in a random order,
  items shuffled within the chunks a worker holds); windows/s counts the samples it yields.

S3: LitData's S3 client is boto3's, built from ``storage_options`` (passed straight to
``boto3.Session().client("s3", **storage_options)``), so ``endpoint_url`` points it at the
proxy. Its range path uses obstore built from that client's endpoint, which needs
``AWS_ALLOW_HTTP=true`` in the environment for an ``http://`` endpoint.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import (
    LOADER_BATCH,
    LOADER_WORKERS,
    LOADER_WORKLOADS,
    PEER_CHUNK_BYTES,
    TEMPORAL_GROUPS,
    RunConfig,
)
from benchmarks.systems.base import (
    Location,
    Support,
    System,
    Unavailable,
    read_temporal_windows,
    run_lanes,
)
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

# Tokens per record for read_window token windows: one record per LitData chunk (< 4 MiB).
TOKEN_RECORD = (PEER_CHUNK_BYTES - 4096) // TOKEN_DTYPE.itemsize


def _check_litdata() -> None:
    try:
        import litdata  # noqa: F401
    except ImportError as exc:
        raise Unavailable(f"litdata not importable: {exc}") from exc


# ---------------------------------------------------------------- optimize() callables
# Top-level functions (picklable for optimize's worker processes); each re-opens the raw
# files by path rather than capturing the memmaps.


def _token_record(path: str, total: int, i: int) -> dict[str, np.ndarray]:
    tokens = np.memmap(Path(path) / "tokens.i32", TOKEN_DTYPE, "r")
    return {"tokens": np.array(tokens[i * TOKEN_RECORD : min((i + 1) * TOKEN_RECORD, total)])}


def _token_doc(path: str, offsets: np.ndarray, i: int) -> np.ndarray:
    tokens = np.memmap(Path(path) / "tokens.i32", TOKEN_DTYPE, "r")
    return np.array(tokens[int(offsets[i]) : int(offsets[i + 1])])


def _temporal_record(path: str, i: int) -> dict[str, np.ndarray]:
    offsets = np.load(Path(path) / "frame_offsets.npy")
    a, b, total = int(offsets[i]), int(offsets[i + 1]), int(offsets[-1])
    out = {}
    for name, (dtype, trailing) in TEMPORAL_SPECS.items():
        mm = np.memmap(Path(path) / f"{name}.raw", dtype, "r", shape=(total, *trailing))
        out[name] = np.array(mm[a:b])
    return out


def _document_record(path: str, i: int) -> dict[str, np.ndarray]:
    heap = np.memmap(Path(path) / "heap.bin", np.uint8, "r")
    offsets = np.load(Path(path) / "offsets.npy", mmap_mode="r")
    return {"doc": np.array(heap[int(offsets[i]) : int(offsets[i + 1])])}


def _optimize(fn: Any, inputs: list[Any], out_dir: Path, **kwargs: Any) -> None:
    from litdata import optimize

    optimize(
        fn,
        inputs,
        str(out_dir),
        num_workers=1,  # one writer: a deterministic chunk layout
        verbose=False,
        **kwargs,
    )


def _storage_options(location: Location) -> dict[str, Any] | None:
    if location.kind != "s3":
        return None
    ep = location.endpoint
    assert ep is not None
    return {
        "endpoint_url": ep.proxy_url,
        "aws_access_key_id": ep.access_key,
        "aws_secret_access_key": ep.secret_key,
        "region_name": ep.region,
    }


def _input_dir(location: Location) -> str:
    return location.s3_url if location.kind == "s3" else str(location.local_dir)  # type: ignore[return-value]


def _allow_plain_http() -> None:
    """Let LitData's obstore range path talk to the ``http://`` proxy.

    LitData builds its obstore ``S3Store`` with fixed client options and no ``allow_http``,
    so any ``http://`` endpoint fails with reqwest's ``BadScheme`` (real S3 is https, where
    this never arises). It exposes no setting for it; the module-level options dict is the
    only hook, so it is extended here. Nothing else about LitData's requests changes.
    """
    from litdata.streaming import downloader

    opts = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if not isinstance(opts, dict):
        raise Unavailable("cannot enable http:// for LitData's obstore client in this version")
    opts["allow_http"] = "true"


class _LitData(System):
    def check_available(self) -> None:
        _check_litdata()
        _allow_plain_http()

    def close(self) -> None:
        self._ds = None


class LitDataWindow(_LitData):
    """``read_window`` (sync, concurrency 1) and ``aread_window`` (async, 1/16/64)."""

    name = "litdata-window"
    label = "LitData read_window"
    family = "litdata-window"

    def __init__(self) -> None:
        self._ds: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._counts: np.ndarray | None = None

    def supports(self, workload: str, location: str) -> Support | None:
        levels = (1, 16, 64)
        if workload == "temporal":
            return Support(
                concurrency=levels,
                note="c=1: read_window (sync); c>1: that many concurrent aread_window calls; "
                "TemporalArrayLoader(field_groups=[[clock, valid, pose]])",
            )
        if workload.startswith("tokens"):
            return Support(
                concurrency=levels,
                note=f"token stream stored as TemporalArrayLoader records of {TOKEN_RECORD:,} "
                "tokens; a window = read_window of 2049 frames (2 calls across a record "
                "boundary); c>1: concurrent aread_window",
            )
        if workload == "documents":
            return Support(
                concurrency=levels,
                note="one TemporalArrayLoader record per document (uint8 frames), read whole "
                "with read_window; a batch = its documents' calls gathered",
            )
        return None

    def prepare(self, data: DatasetData, out_dir: Path, config: RunConfig) -> None:
        from litdata import TemporalArrayLoader

        if isinstance(data, TokensData):
            n = -(-data.total // TOKEN_RECORD)
            fn = functools.partial(_token_record, str(data.path), data.total)
            loader = TemporalArrayLoader()
        elif isinstance(data, TemporalData):
            n = len(data.frame_counts)
            fn = functools.partial(_temporal_record, str(data.path))
            loader = TemporalArrayLoader(field_groups=[list(g) for g in TEMPORAL_GROUPS])
        else:
            assert isinstance(data, DocumentsData)
            n = data.count
            fn = functools.partial(_document_record, str(data.path))
            loader = TemporalArrayLoader()
        _optimize(fn, list(range(n)), out_dir, chunk_bytes=PEER_CHUNK_BYTES, item_loader=loader)

    def open(self, data: DatasetData, location: Location) -> None:
        from litdata import StreamingDataset, TemporalArrayLoader

        self._ds = StreamingDataset(
            _input_dir(location),
            cache_dir=str(location.cache_dir),
            item_loader=TemporalArrayLoader(),
            storage_options=_storage_options(location),
        )
        self._counts = np.asarray(self._ds.frame_counts, dtype=np.int64)
        self._loop = asyncio.new_event_loop()

    # one window, sync or async ------------------------------------------------------

    def _token_parts(self, start: int, length: int) -> list[tuple[int, int, int]]:
        parts = []
        while length > 0:
            rec, off = divmod(start, TOKEN_RECORD)
            n = min(length, TOKEN_RECORD - off)
            parts.append((rec, off, n))
            start, length = start + n, length - n
        return parts

    def _window_sync(self, windows: WindowSet, i: int) -> Payload:
        ds = self._ds
        if windows.dataset == "tokens":
            assert windows.starts is not None
            parts = [
                ds.read_window(r, o, n, ["tokens"])["tokens"]
                for r, o, n in self._token_parts(int(windows.starts[i]), windows.length)
            ]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            return ds.read_window(
                int(windows.records[i]), int(windows.starts[i]), windows.frames,
                list(windows.fields),
            )  # fmt: skip
        assert windows.batches is not None and self._counts is not None
        return [
            ds.read_window(j, 0, int(self._counts[j]), ["doc"])["doc"].tobytes()
            for j in windows.batches[i].tolist()
        ]

    async def _window_async(self, windows: WindowSet, i: int) -> Payload:
        ds = self._ds
        if windows.dataset == "tokens":
            assert windows.starts is not None
            got = await asyncio.gather(
                *(
                    ds.aread_window(r, o, n, ["tokens"])
                    for r, o, n in self._token_parts(int(windows.starts[i]), windows.length)
                )
            )
            parts = [g["tokens"] for g in got]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            return await ds.aread_window(
                int(windows.records[i]), int(windows.starts[i]), windows.frames,
                list(windows.fields),
            )  # fmt: skip
        assert windows.batches is not None and self._counts is not None
        got = await asyncio.gather(
            *(
                ds.aread_window(j, 0, int(self._counts[j]), ["doc"])
                for j in windows.batches[i].tolist()
            )
        )
        return [g["doc"].tobytes() for g in got]

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        return _as_numpy(self._window_sync(windows, i))

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        if concurrency == 1:
            if windows.dataset == "temporal":  # the loop raw-memmap's temporal read runs
                assert self._ds is not None
                return read_temporal_windows(self._ds.read_window, windows, ids)
            return sum(_nbytes(self._window_sync(windows, i)) for i in ids.tolist())
        assert self._loop is not None
        return self._loop.run_until_complete(self._read_async(windows, ids, concurrency))

    async def _read_async(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        async def one(i: int) -> int:
            return _nbytes(await self._window_async(windows, i))

        return await run_lanes(ids.tolist(), concurrency, one)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        self._ds = None


class LitDataDataset(_LitData):
    """``StreamingDataset[i]``: whole chunks cached locally, then items decoded from them."""

    name = "litdata-dataset"
    label = "LitData StreamingDataset[i]"
    family = "litdata-dataset"

    def __init__(self) -> None:
        self._ds: Any = None
        self._block = 0

    def supports(self, workload: str, location: str) -> Support | None:
        if workload.startswith("tokens"):
            return Support(
                exact=False,
                note="TokensLoader(block_size=2049) serves only blocks aligned to 2049 tokens: "
                "reads the block holding each window's start; whole chunks are downloaded "
                "into the cache on first touch",
            )
        if workload == "temporal":
            return Support(
                exact=True,
                note="ds[record] (whole record; whole chunk downloaded on first touch), then "
                "the 64-frame window of features + pose copied out",
            )
        if workload == "documents":
            return Support(note="ds[doc] per document of the batch (whole chunk downloaded)")
        return None

    def prepare(self, data: DatasetData, out_dir: Path, config: RunConfig) -> None:
        from litdata import TokensLoader

        if isinstance(data, TokensData):
            offsets = np.concatenate([[0], np.cumsum(data.doc_lengths)])
            block = data.window_tokens
            per_chunk = max(1, PEER_CHUNK_BYTES // (block * TOKEN_DTYPE.itemsize))
            _optimize(
                functools.partial(_token_doc, str(data.path), offsets),
                list(range(len(data.doc_lengths))),
                out_dir,
                chunk_size=block * per_chunk,
                item_loader=TokensLoader(),
            )
        elif isinstance(data, TemporalData):
            _optimize(
                functools.partial(_temporal_record, str(data.path)),
                list(range(len(data.frame_counts))),
                out_dir,
                chunk_bytes=PEER_CHUNK_BYTES,
            )
        else:
            assert isinstance(data, DocumentsData)
            _optimize(
                functools.partial(_document_record, str(data.path)),
                list(range(data.count)),
                out_dir,
                chunk_bytes=PEER_CHUNK_BYTES,
            )

    def _make_dataset(self, data: DatasetData, location: Location) -> Any:
        from litdata import StreamingDataset, TokensLoader

        loader = (
            TokensLoader(block_size=data.window_tokens) if isinstance(data, TokensData) else None
        )
        return StreamingDataset(
            _input_dir(location),
            cache_dir=str(location.cache_dir),
            item_loader=loader,
            storage_options=_storage_options(location),
        )

    def open(self, data: DatasetData, location: Location) -> None:
        self._ds = self._make_dataset(data, location)
        if isinstance(data, TokensData):
            self._block = data.window_tokens
            self._layout_blocks(location.local_dir / "index.json")

    def _layout_blocks(self, index_json: Path) -> None:
        """Where TokensLoader's blocks lie in the token stream.

        optimize() packs whole documents into chunks of at most ``chunk_size`` tokens and
        TokensLoader cuts each chunk into whole blocks, dropping each chunk's remainder; so
        block ``b`` is not at token ``b * 2049``. Read from the dataset's own index.json
        (the prepared copy; the S3 copy is byte-identical).
        """
        dims = np.array([c["dim"] for c in json.loads(index_json.read_text())["chunks"]])
        self._chunk_token_start = np.concatenate([[0], np.cumsum(dims)[:-1]])
        self._chunk_blocks = dims // self._block
        self._chunk_first_block = np.concatenate([[0], np.cumsum(self._chunk_blocks)[:-1]])

    def _block_of(self, windows: WindowSet, i: int) -> int:
        """The block holding the window's first token (the last whole block of its chunk)."""
        assert windows.starts is not None
        s = int(windows.starts[i])
        c = int(np.searchsorted(self._chunk_token_start, s, side="right")) - 1
        within = min(
            (s - int(self._chunk_token_start[c])) // self._block, self._chunk_blocks[c] - 1
        )
        return int(self._chunk_first_block[c] + within)

    def _block_tokens(self, b: int) -> tuple[int, int]:
        c = int(np.searchsorted(self._chunk_first_block, b, side="right")) - 1
        start = (
            int(self._chunk_token_start[c]) + (b - int(self._chunk_first_block[c])) * self._block
        )
        return start, start + self._block

    def truth(self, data: DatasetData, windows: WindowSet, i: int) -> Payload:
        if isinstance(data, TokensData):
            a, b = self._block_tokens(self._block_of(windows, i))
            return np.array(data.tokens[a:b])
        return super().truth(data, windows, i)

    def _window(self, windows: WindowSet, i: int) -> Payload:
        ds = self._ds
        if windows.dataset == "tokens":
            return _as_numpy(ds[self._block_of(windows, i)])
        if windows.dataset == "temporal":
            assert windows.records is not None and windows.starts is not None
            rec = ds[int(windows.records[i])]
            s = int(windows.starts[i])
            return {f: np.array(_as_numpy(rec[f])[s : s + windows.frames]) for f in windows.fields}
        assert windows.batches is not None
        return [_as_numpy(ds[j]["doc"]).tobytes() for j in windows.batches[i].tolist()]

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        return self._window(windows, i)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        return sum(_nbytes(self._window(windows, i)) for i in ids.tolist())


class LitDataLoader(LitDataDataset):
    """``StreamingDataLoader`` over the TokensLoader dataset: the training-loop path."""

    name = "litdata-loader"
    label = f"LitData StreamingDataLoader ({LOADER_WORKERS} workers)"

    def __init__(self) -> None:
        super().__init__()
        self._iter: Any = None
        self._rows: deque[np.ndarray] = deque()
        self._data: DatasetData | None = None
        self._location: Location | None = None

    def supports(self, workload: str, location: str) -> Support | None:
        if workload not in ("tokens-sequential", *LOADER_WORKLOADS):
            return None
        shuffled = workload in LOADER_WORKLOADS
        check = (
            "the check finds each row checked in the token stream"
            if shuffled
            else "the check compares the dataset's blocks, not the order"
        )
        return Support(
            own_concurrency=True,
            any_order=shuffled,
            exact=False,
            note=f"StreamingDataLoader(batch_size={LOADER_BATCH}, num_workers={LOADER_WORKERS}, "
            f"shuffle={shuffled}) over TokensLoader(2049) blocks in its own order, iterated "
            f"across repeats (epochs restart); {check}",
        )

    def open(self, data: DatasetData, location: Location) -> None:
        """Open, then take the loader's first batch: the open is timed with it, so the
        "first window" of this row is the time to first batch a training loop sees (as for
        rangestream's loader row)."""
        super().open(data, location)
        self._data, self._location = data, location
        self._rows.appendleft(self._next_row())

    def _next_row(self) -> np.ndarray:
        from litdata import StreamingDataLoader

        while not self._rows:
            if self._iter is None:
                assert self._data is not None and self._location is not None
                loader = StreamingDataLoader(
                    self._make_dataset(self._data, self._location),
                    batch_size=LOADER_BATCH,
                    num_workers=LOADER_WORKERS,
                    shuffle=self.workload in LOADER_WORKLOADS,
                )
                self._iter = iter(loader)
            try:
                batch = next(self._iter)
            except StopIteration:
                self._iter = None
                continue
            self._rows.extend(_as_numpy(batch))
        return self._rows.popleft()

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        """Shuffled: the loader's next row (found in the stream by the check); in order:
        the dataset's block for window ``i``."""
        if self.workload in LOADER_WORKLOADS:
            return self._next_row()
        return super().fetch(windows, i)

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        return sum(int(self._next_row().nbytes) for _ in range(len(ids)))

    def close(self) -> None:
        self._iter = None
        self._rows.clear()
        super().close()


def _as_numpy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _as_numpy(v) for k, v in x.items()}
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        return x.numpy()
    return x


def _nbytes(p: Any) -> int:
    if isinstance(p, dict):
        return sum(int(_as_numpy(v).nbytes) for v in p.values())
    if isinstance(p, list):
        return sum(len(x) for x in p)
    return int(_as_numpy(p).nbytes)
