"""What the workers of ``test_start_methods`` and ``test_persistent_workers`` rebuild from a
pickle: a user's format, dataset view and collates.

A module of their own, importing only what a worker needs anyway (numpy, torch, rangestream):
a ``spawn`` or ``forkserver`` worker imports the module a pickled class lives in, and a test
module would bring pytest, the S3 test kit and botocore into every worker with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rangestream import TemporalArrayStorage
from rangestream.loader import stack_collate
from rangestream.types import StreamWithMetaStorageFormat

__all__ = ["CountsView", "RunFormat", "Tagged", "note_start", "runs_collate", "tagged"]


class RunFormat(StreamWithMetaStorageFormat[dict, dict, np.int32]):
    """Tokens whose record carries one payload (its number) over all its elements."""

    def __init__(self) -> None:
        super().__init__(np.dtype("<i4"))

    def size(self, data: dict) -> int:
        return len(data["tokens"])

    def pack(self, data: dict) -> Any:
        tokens = np.asarray(data["tokens"], dtype=self.stream_dtype)
        payload = str(data["record"]).encode()
        for _ in range(len(tokens)):
            yield data["record"], payload
        return tokens

    def unpack(self, stream: np.ndarray, shards: Any, indexes: Any, payloads: Any) -> dict:
        return {"tokens": stream, "records": [bytes(payload).decode() for payload in payloads]}


def runs_collate(samples: Sequence[dict]) -> dict[str, Any]:
    return {"tokens": stack_collate([s["tokens"] for s in samples]),
            "records": [s["records"] for s in samples]}  # fmt: skip


class CountsView:
    """A user's temporal dataset in the loader's ``TemporalStorage`` protocol: it keeps the
    storage's lazy ``frame_counts`` (which holds the opened index and its lock)."""

    def __init__(self, storage: TemporalArrayStorage) -> None:
        self.storage = storage
        self.frame_counts = storage.frame_counts
        assert len(self.frame_counts) > 0  # opened here, in the main process

    def read_window(self, record: int, start: int, frames: int, fields: Any = None) -> Any:
        return self.storage.read_window(record, start, frames, fields)

    async def aread_window(self, record: int, start: int, frames: int, fields: Any = None) -> Any:
        return await self.storage.aread_window(record, start, frames, fields)


@dataclass(frozen=True)
class Tagged:
    """A collate that also says which process built the batch."""

    inner: Callable[[Sequence[Any]], Any] = stack_collate

    def __call__(self, samples: Sequence[Any]) -> dict[str, Any]:
        return {"batch": self.inner(samples), "pid": os.getpid()}


def tagged(samples: list[Any]) -> dict[str, Any]:
    """The batch and the process that built it (``test_persistent_workers``)."""
    return {"tokens": stack_collate(samples)["tokens"], "pid": os.getpid()}


def note_start(directory: str, worker_id: int) -> None:
    """``worker_init_fn``: one file per worker process started (its pid, its id)."""
    Path(directory, f"{os.getpid()}-{worker_id}").touch()
