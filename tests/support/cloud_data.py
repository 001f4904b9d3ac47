"""Data for the GCS/Azure dataset tests, and the writer process of their commit race.

Kept apart from the test modules (and light to import: numpy and the storage, no torch)
because spawned writer processes import the module their target lives in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import CommitConflictError
from rangestream.io.conditional_writes import ConditionalWritesUnsupportedError

__all__ = ["SMALL", "TOKENS", "append_in_rounds", "write_stream"]

TOKENS = np.dtype([("t", "<i4")])
SMALL = {"chunk_bytes": 1024, "block_bytes": 16384}


def write_stream(url: str, options: dict[str, Any], tokens: np.ndarray) -> StreamStorage:
    """``tokens`` as a two-shard stream (a third, then the rest), replacing what was there."""
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options, **SMALL)
    third = len(tokens) // 3
    with storage.sync_writer(overwrite=True) as writer:
        writer.append(0, {"t": tokens[:third]})
        writer.append(1, {"t": tokens[third:]})
    return storage


def append_in_rounds(url: str, options: dict[str, Any], worker: int, rounds: int,
                     barrier: Any, results: Any) -> None:  # fmt: skip
    """One writer process: each round, append a record of its own; all commit at once.

    Puts ``(value, outcome)`` per round: "committed", "conflict", "refused: <message>" or
    "error: <repr>" (any other exception, so the test names it).
    """
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)
    for round_number in range(rounds):
        value = 1000 * (round_number + 1) + worker
        session = storage.parallel_write(mode="append")
        with session.sync_writer() as writer:
            writer.append(0, {"t": np.full(4, value, dtype="<i4")})
        barrier.wait()
        try:
            session.commit()
            outcome = "committed"
        except ConditionalWritesUnsupportedError as error:
            outcome = f"refused: {error}"
        except CommitConflictError:
            outcome = "conflict"
        except Exception as error:
            outcome = f"error: {error!r}"
        results.put((value, outcome))
        barrier.wait()
