"""In-memory stand-ins for the dataset and storage contracts the loader builds on.

They have the exact shape of ``rangestream.dataset.StreamDataset`` / ``DocumentDataset`` and
of a temporal storage, are backed by numpy arrays, pickle cleanly (for the spawn and
forkserver start methods) and record what the loader did to them: which process opened a
reader, how many reads were started and how many were in flight at once. Every sample
carries its own position and the reading process id, so tests can check order, coverage and
process placement against independently computed expectations.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rangestream.loader import (
    BatchIterableDataset,
    BatchOptions,
    IndexedSource,
    StatefulDataLoader,
)


@dataclass
class ReadStats:
    """Counters of the reads made in *this* process (workers keep their own copies)."""

    opened: int = 0
    started: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    opened_pids: list[int] = field(default_factory=list)
    read_many_sizes: list[int] = field(default_factory=list)
    read_many_running: int = 0  # async read_many calls running now, and at most
    max_read_many_running: int = 0


def _delay(position: int, base: float) -> float:
    # Uneven delays make reads finish out of submission order.
    return base * ((position * 7919) % 5) / 4


class FakeStreamStorage:
    """A token stream ``0, 1, ..., num_tokens - 1`` (so a window's content names its start)."""

    def __init__(self, num_tokens: int, kind: str = "stream") -> None:
        self.kind = kind
        self.tokens = np.arange(num_tokens, dtype=np.int64)


class FakeDocumentStorage:
    """Document ``i`` holds ``1 + i % 4`` tokens, all equal to ``i``."""

    kind = "document"

    def __init__(self, num_documents: int) -> None:
        self.lengths = 1 + np.arange(num_documents, dtype=np.int64) % 4


class _FakeIndexed(ABC):
    """Shared reader machinery of the fake datasets."""

    delay: float
    fail_at: int | None
    stats: ReadStats

    @abstractmethod
    def num_samples(self) -> int:
        """Samples the readers index."""

    @abstractmethod
    def sample(self, position: int) -> Any:
        """The sample at ``position``."""

    def sync_reader(self) -> FakeSyncReader:
        return FakeSyncReader(self)

    def async_reader(self) -> FakeAsyncReader:
        return FakeAsyncReader(self)

    def __getstate__(self) -> dict[str, Any]:
        # Counters are per process: a worker starts from zero.
        state = self.__dict__.copy()
        state["stats"] = ReadStats()
        return state


class FakeSyncReader:
    def __init__(self, dataset: _FakeIndexed) -> None:
        self.dataset = dataset

    def __enter__(self) -> FakeSyncReader:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __len__(self) -> int:
        return self.dataset.num_samples()

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            return [self.dataset.sample(i) for i in range(*key.indices(len(self)))]
        return self.dataset.sample(key)


class FakeAsyncReader:
    """Refuses use from any process or event loop other than the one that entered it."""

    def __init__(self, dataset: _FakeIndexed) -> None:
        self.dataset = dataset
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> FakeAsyncReader:
        self._pid = os.getpid()
        self._loop = asyncio.get_running_loop()
        self.dataset.stats.opened += 1
        self.dataset.stats.opened_pids.append(self._pid)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._pid = None

    def __len__(self) -> int:
        return self.dataset.num_samples()

    def __getitem__(self, position: int) -> Any:
        return self._read(position)

    async def read_many(self, positions: list[int]) -> list[Any]:
        stats = self.dataset.stats
        stats.read_many_sizes.append(len(positions))
        stats.read_many_running += 1
        stats.max_read_many_running = max(stats.max_read_many_running, stats.read_many_running)
        try:
            return list(await asyncio.gather(*(self._read(p) for p in positions)))
        finally:
            stats.read_many_running -= 1

    async def _read(self, position: int) -> Any:
        if self._pid != os.getpid() or asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("fake reader used outside the process and loop that opened it")
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} outside [0, {len(self)})")
        stats = self.dataset.stats
        stats.started += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            await asyncio.sleep(_delay(position, self.dataset.delay))
            if position == self.dataset.fail_at:
                raise OSError(f"fake read of position {position} failed")
        finally:
            stats.in_flight -= 1
        return self.dataset.sample(position)


class FakeStreamDataset(_FakeIndexed):
    """Same constructor and readers as ``rangestream.dataset.StreamDataset``."""

    def __init__(
        self,
        storage: FakeStreamStorage,
        sequence_length: int,
        *,
        stride: int | None = None,
        next_token: bool = False,
        boundaries: bool = False,
        delay: float = 0.0,
        fail_at: int | None = None,
        span_bytes: int | None = None,
    ) -> None:
        if boundaries:
            raise NotImplementedError("fake windows have no records")
        self.storage = storage
        self.sequence_length = sequence_length
        self.stride = sequence_length if stride is None else stride
        self.next_token = next_token
        # what StreamDataset reports; None (unknown) keeps the loader to one step per run
        self.sample_span_bytes = span_bytes
        self.delay = delay
        self.fail_at = fail_at
        self.stats = ReadStats()

    def num_samples(self) -> int:
        width = self.sequence_length + int(self.next_token)
        total = len(self.storage.tokens)
        return 0 if total < width else (total - width) // self.stride + 1

    def sample(self, position: int) -> dict[str, np.ndarray]:
        start = position * self.stride
        width = self.sequence_length + int(self.next_token)
        return {
            "tokens": self.storage.tokens[start : start + width].copy(),
            "position": np.int64(position),
            "pid": np.int64(os.getpid()),
        }


class FakeDocumentDataset(_FakeIndexed):
    """Same constructor and readers as ``rangestream.dataset.DocumentDataset``."""

    def __init__(self, storage: FakeDocumentStorage, *, keys: list[str] | None = None) -> None:
        if keys is not None:
            raise NotImplementedError("fake documents are arrays, without keys")
        self.storage = storage
        self.delay = 0.0
        self.fail_at = None
        self.stats = ReadStats()

    def num_samples(self) -> int:
        return len(self.storage.lengths)

    def sample(self, position: int) -> dict[str, Any]:
        return {
            "tokens": np.full(int(self.storage.lengths[position]), position, dtype=np.int32),
            "position": np.int64(position),
        }


class FakeTemporalStorage:
    """Record ``r`` has ``frame_counts[r]`` frames; frame ``f`` holds ``(r, f)``."""

    kind = "temporal"

    def __init__(self, frame_counts: list[int], delay: float = 0.0) -> None:
        self.frame_counts = np.asarray(frame_counts, dtype=np.int64)
        self.delay = delay

    def read_window(
        self, record: int, start: int, frames: int, fields: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        if not 0 <= start <= self.frame_counts[record] - frames:
            raise IndexError(
                f"window [{start}, {start + frames}) outside record {record} of "
                f"{self.frame_counts[record]} frames"
            )
        window = {
            "frame": np.arange(start, start + frames, dtype=np.int64),
            "record": np.full(frames, record, dtype=np.int64),
        }
        return window if fields is None else {name: window[name] for name in fields}

    async def aread_window(
        self, record: int, start: int, frames: int, fields: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        await asyncio.sleep(_delay(record + start, self.delay))
        return self.read_window(record, start, frames, fields)


def positions_of(batch: dict[str, Any]) -> list[int]:
    """Positions of the samples of a collated batch."""
    return [int(p) for p in batch["position"]]


def run_training_with_checkpoints(
    checkpoint_path: str,
    num_tokens: int,
    sequence_length: int,
    batch_size: int,
    num_workers: int,
    seed: int,
    pause: float,
) -> None:
    """A training loop that checkpoints after every batch; runs until it is killed.

    The checkpoint holds the loader state and every batch seen so far, written atomically
    (write then rename), as a real trainer would persist model and loader together.
    """
    dataset = indexed_batches(
        FakeStreamDataset(FakeStreamStorage(num_tokens), sequence_length),
        batch_size=batch_size,
        seed=seed,
        rank=0,
        world_size=1,
        drop_last=False,
    )
    loader = StatefulDataLoader(dataset, num_workers=num_workers)
    seen: list[list[int]] = []
    while True:
        for batch in loader:
            seen.append(positions_of(batch))
            temporary = f"{checkpoint_path}.tmp"
            with open(temporary, "w") as handle:
                json.dump({"state": loader.state_dict(), "batches": seen}, handle)
            os.replace(temporary, checkpoint_path)
            time.sleep(pause)


def indexed_batches(
    dataset: Any, *, shuffle: str | bool = True, seed: int = 0, **options: Any
) -> BatchIterableDataset:
    """The loader's dataset over an indexed (fake or real) dataset."""
    return BatchIterableDataset(
        IndexedSource(dataset, shuffle=shuffle, seed=seed), BatchOptions(**options)
    )
