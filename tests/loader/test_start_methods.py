"""Every dataset and loader kind through workers started by ``fork``, ``spawn`` and
``forkserver``: the batches are exactly those of the same loader without workers.

``spawn`` and ``forkserver`` workers get the dataset by pickle (``fork`` workers inherit
it), after the main process has opened and read the storage (its reference run, and the
head start on local disk): every open file, mapping, lock, event loop or S3 client must stay
behind, and what a worker needs (the opened version, its indexes) is read again there. Each
case runs once without workers (the reference, shared by the three start methods) and once
per start method with two workers, which must both have built batches. The block shuffles'
order depends on the number of workers (not on how they start): there every sample comes
exactly once, as without workers, and the batches equal those of ``fork`` workers.

Costs: a ``spawn`` loader starts two interpreters that import torch (2-3 s on an idle
machine), so the datasets are written once per module and small, the forkserver preloads
what a training script would have imported, and the S3 cases are one per object graph that
differs there.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from rangestream import (
    DocumentPickleFormat,
    DocumentStorage,
    StreamNumpyFormat,
    StreamStorage,
    StreamWithMetaStorage,
    TemporalArrayStorage,
    TemporalRecords,
    train_test_split,
)
from rangestream.loader import (
    BatchOptions,
    Pad,
    PadCollate,
    StatefulDataLoader,
    TemporalWindowSource,
    VarlenCollate,
    stack_collate,
)
from testkit import S3Endpoint

# what the workers rebuild from a pickle lives in a light module: see worker_parts
from .worker_parts import CountsView, RunFormat, Tagged, runs_collate

METHODS = ["fork", "spawn", "forkserver"]
TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])
SMALL = {"chunk_bytes": 64, "block_bytes": 1024}  # windows cross chunks and blocks
SEQUENCE = 16
BATCH = 4


def plain(value: Any) -> Any:
    """A batch as plain Python values, compared exactly (dtypes included)."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.tolist())
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tolist())
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


# -- the datasets, written once per module -------------------------------------------------------


def write_stream(url: str, options: dict[str, Any], first: int, records: int) -> StreamStorage:
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options, **SMALL)
    rng = np.random.default_rng(first)
    position = first
    with storage.sync_writer() as writer:
        for record in range(records):
            n = int(rng.integers(5, 60))
            tokens = np.arange(position, position + n, dtype="<i4")
            writer.append(
                record % 2, {"tokens": tokens, "loss_mask": (tokens % 3 > 0).astype("u1")}
            )
            position += n
    return storage


def write_runs(url: str, options: dict[str, Any]) -> StreamWithMetaStorage:
    storage = StreamWithMetaStorage(url, RunFormat(), storage_options=options, **SMALL)
    with storage.sync_writer() as writer:
        for record in range(100):
            writer.append(record % 2, {"tokens": np.arange(20 * record, 20 * record + 17),
                                       "record": record})  # fmt: skip
    return storage


def write_documents(url: str, options: dict[str, Any]) -> DocumentStorage:
    storage = DocumentStorage(url, DocumentPickleFormat(), storage_options=options, **SMALL)
    with storage.sync_writer() as writer:
        for number in range(240):
            writer.append(number % 3, {"x": np.arange(number % 17 + 1), "id": number})
    return storage


def write_temporal(url: str, options: dict[str, Any]) -> TemporalArrayStorage:
    storage = TemporalArrayStorage(url, [["frame", "pose"]], storage_options=options,
                                   chunk_bytes=256, block_bytes=4096)  # fmt: skip
    rng = np.random.default_rng(5)
    with storage.sync_writer() as writer:
        for record in range(80):
            frames = int(rng.integers(4, 40))
            writer.append(record % 2, {
                "frame": np.arange(frames, dtype="<i4") + 1000 * record,
                "pose": rng.standard_normal((frames, 3)).astype("<f4"),
                "image": rng.integers(0, 255, (frames, 2, 2), dtype="u1"),
            })  # fmt: skip
    return storage


@dataclass
class Data:
    """One storage place's datasets."""

    stream: StreamStorage
    other_stream: StreamStorage
    runs: StreamWithMetaStorage
    documents: DocumentStorage
    temporal: TemporalArrayStorage


def write_all(base: str, options: dict[str, Any]) -> Data:
    return Data(
        stream=write_stream(f"{base}/stream", options, 0, 110),
        other_stream=write_stream(f"{base}/other", options, 1_000_000, 50),
        runs=write_runs(f"{base}/runs", options),
        documents=write_documents(f"{base}/documents", options),
        temporal=write_temporal(f"{base}/temporal", options),
    )


@pytest.fixture(scope="module", autouse=True)
def forkserver_preloads_what_a_training_script_imports() -> Iterator[None]:
    """The forkserver imports what its main module imports before it forks a worker (a
    training script's: torch, rangestream); under pytest that module is pytest's, so each
    worker would import torch afresh. Preloading them keeps what is tested (the dataset
    pickled to the worker, opened there) and saves those imports. It takes effect if this
    module is the first to start the forkserver in the session."""
    multiprocessing.set_forkserver_preload(["torch", "rangestream.loader"])
    yield
    multiprocessing.set_forkserver_preload(["__main__"])  # the default, for later servers


@pytest.fixture(scope="module")
def local_data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    return write_all(str(tmp_path_factory.mktemp("start-methods")), {})


@pytest.fixture(scope="module")
def s3_data(s3_server: S3Endpoint, s3_bucket: str) -> Data:
    base = f"s3://{s3_bucket}/start-methods-{uuid.uuid4().hex[:8]}"
    return write_all(base, s3_server.storage_options)


# -- the cases: every dataset and loader kind ----------------------------------------------------

Build = Callable[[Data, dict[str, Any]], StatefulDataLoader]


def _loader(pick: Callable[[Data], Any], collate: Callable[..., Any] | None = None,
            **options: Any) -> Build:  # fmt: skip
    def build(data: Data, process: dict[str, Any]) -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            pick(data), Tagged(collate or stack_collate), batch_size=BATCH, rank=0,
            world_size=1, shuffle_seed=3, **options, **process,
        )  # fmt: skip

    return build


def _unmapped(data: Data) -> StreamStorage:
    return StreamStorage(data.stream.url, StreamNumpyFormat(TOKENS), mapped=False)


def _split(data: Data) -> TemporalRecords:
    train, _test = train_test_split(data.temporal, [0.75, 0.25], seed=1)
    return train


def _mixture(**options: Any) -> Build:
    def build(data: Data, process: dict[str, Any]) -> StatefulDataLoader:
        return StatefulDataLoader.from_storages(
            {data.stream: 0.7, data.other_stream: 0.3}, Tagged(), sequence_length=SEQUENCE,
            names={data.stream: "web", data.other_stream: "code"}, batch_size=BATCH, rank=0,
            world_size=1, shuffle_seed=3, **options, **process,
        )  # fmt: skip

    return build


def _counts_view(data: Data, process: dict[str, Any]) -> StatefulDataLoader:
    source = TemporalWindowSource(CountsView(data.temporal), 6, fields=["frame", "image"],
                                  seed=3, samples_per_epoch=100)  # fmt: skip
    options = BatchOptions(batch_size=BATCH, rank=0, world_size=1, collate_fn=Tagged())
    return StatefulDataLoader.from_source(source, options, **process)


@dataclass(frozen=True)
class Case:
    """A loader to build; ``block``: block-shuffled, whose order depends on the number of
    workers (every sample exactly once, and the same batches whatever starts the workers)."""

    build: Build
    block: bool = False


RECORD_PADS = PadCollate({"frame": Pad(), "pose": Pad(), "image": Pad()})
DOCUMENT_PADS = PadCollate({"x": Pad()})
LOCAL: dict[str, Case] = {
    "stream-window-shuffle": Case(_loader(lambda d: d.stream, sequence_length=SEQUENCE)),
    "stream-in-order": Case(_loader(lambda d: d.stream, sequence_length=SEQUENCE,
                                    shuffle=False)),
    "stream-block-shuffle": Case(_loader(lambda d: d.stream, sequence_length=SEQUENCE,
                                         shuffle="block", run_windows=4, buffer_runs=3),
                                 block=True),
    # read with pread, not mapped blocks; overlapping windows of stored dtype
    "stream-unmapped-stride-next-token": Case(_loader(_unmapped, sequence_length=SEQUENCE,
                                                      stride=11, next_token=True,
                                                      token_dtype=None)),
    "stream-boundaries": Case(_loader(lambda d: d.stream, VarlenCollate("tokens", "loss_mask"),
                                      sequence_length=SEQUENCE, boundaries=True)),
    "stream-with-meta": Case(_loader(lambda d: d.runs, runs_collate, sequence_length=SEQUENCE)),
    "documents": Case(_loader(lambda d: d.documents, DOCUMENT_PADS)),
    "temporal-windows": Case(_loader(lambda d: d.temporal, sequence_length=6,
                                     samples_per_epoch=100)),
    "temporal-records": Case(_loader(lambda d: TemporalRecords(d.temporal), RECORD_PADS)),
    "temporal-split-windows": Case(_loader(_split, sequence_length=6, fields=["pose"],
                                           samples_per_epoch=100)),
    "temporal-frame-counts-view": Case(_counts_view),
    "mixture": Case(_mixture()),
}  # fmt: skip
#: Over S3, one case per object graph that differs there (the S3 client, and the block
#: shuffles: the default over object storage, whose runs are read whole).
S3: dict[str, Case] = {
    "stream-boundaries": Case(_loader(lambda d: d.stream, VarlenCollate("tokens", "loss_mask"),
                                      sequence_length=SEQUENCE, boundaries=True,
                                      run_windows=4, buffer_runs=3), block=True),
    "documents": Case(_loader(lambda d: d.documents, DOCUMENT_PADS, run_windows=8,
                              buffer_runs=2), block=True),
    "temporal-windows": Case(_loader(lambda d: d.temporal, sequence_length=6,
                                     samples_per_epoch=100)),
    "mixture": Case(_mixture(), block=True),
}  # fmt: skip


def one_epoch(build: Build, data: Data, **process: Any) -> tuple[list[Any], set[int]]:
    """The batches of one epoch as plain values, and the processes that built them."""
    loader = build(data, process)
    batches, pids = [], set()
    for batch in loader:
        batches.append(plain(batch["batch"]))
        pids.add(batch["pid"])
    return batches, pids


def samples_of(batches: list[Any]) -> list[Any]:
    """Each sample of the batches, named by what it holds (documents by their id, windows
    by their tokens), sorted: the epoch's samples as a multiset."""
    found = []
    for batch in batches:
        if "id" in batch:
            found.extend(batch["id"][2])
        elif "input_ids" in batch:  # VarlenCollate's
            found.extend(tuple(row) for row in batch["input_ids"][2])
        else:
            found.extend(tuple(row) for row in batch["tokens"][2])
    return sorted(found)


_REFERENCES: dict[tuple[str, str, str], list[Any]] = {}


def reference(place: str, name: str, data: Data, **process: Any) -> list[Any]:
    """The case's batches with these process options (read once, shared by the tests)."""
    key = (place, name, str(process))
    if key not in _REFERENCES:
        case = (LOCAL if place == "local" else S3)[name]
        batches, pids = one_epoch(case.build, data, **process)
        assert len(batches) >= 20
        if not process:
            assert pids == {os.getpid()}
        _REFERENCES[key] = batches
    return _REFERENCES[key]


def check(place: str, name: str, data: Data, method: str) -> None:
    case = (LOCAL if place == "local" else S3)[name]
    without_workers = reference(place, name, data, num_workers=0)
    got, pids = one_epoch(case.build, data, num_workers=2, multiprocessing_context=method)
    workers = pids - {os.getpid()}
    assert len(workers) == 2, f"batches came from {pids}, the main process is {os.getpid()}"
    if not case.block:
        assert got == without_workers
        return
    assert samples_of(got) == samples_of(without_workers)  # exactly once
    assert len(got) == len(without_workers)
    assert got == reference(place, name, data, num_workers=2, multiprocessing_context="fork")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(LOCAL))
def test_every_local_kind_loads_the_same_batches_with_every_start_method(
    local_data: Data, name: str, method: str
) -> None:
    check("local", name, local_data, method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(S3))
def test_every_kind_over_s3_loads_the_same_batches_with_every_start_method(
    s3_data: Data, name: str, method: str
) -> None:
    check("s3", name, s3_data, method)
