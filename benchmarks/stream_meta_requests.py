"""Requests, rounds and payload bytes per window of ``StreamWithMetaStorage``.

Run: ``python -m benchmarks.stream_meta_requests``. Writes about 2.2M tokens in 4 shards,
paragraph runs of 20..200 tokens each with a 12..124-byte payload, and reads 2048-token
windows: the first window of each shard (cold), random windows inside one shard and
sequential windows. Counts come from the reader's exact ``IOStats``; rounds are the
batches of requests a read program issues one after another.
"""

from __future__ import annotations

import collections
import tempfile
from collections.abc import Generator
from typing import Any

import numpy as np

from rangestream import StreamWithMetaStorage
from rangestream.types import StreamWithMetaStorageFormat

WINDOW = 2048
STORED_HEAP_CHUNK = 1024 + 4  # default chunk_bytes plus its crc32c


class Paragraphs(StreamWithMetaStorageFormat[dict, tuple, np.int32]):
    """Tokens with one payload per paragraph run."""

    def __init__(self) -> None:
        super().__init__(np.dtype("<i4"))

    def size(self, data: dict) -> int:
        return len(data["tokens"])

    def pack(self, data: dict) -> Generator[tuple[Any, bytes | None], None, np.ndarray]:
        for paragraph, length in enumerate(data["lengths"]):
            yield paragraph, data["payloads"][paragraph]
            for _ in range(length - 1):
                yield paragraph, None
        return data["tokens"]

    def unpack(self, stream: Any, shards: Any, index: Any, payloads: Any) -> tuple:
        return stream, payloads


def record(rng: np.random.Generator) -> dict:
    lengths = rng.integers(20, 200, rng.integers(5, 30))
    payloads = [
        rng.integers(0, 256, 12 + 4 * int(rng.integers(0, 29)), np.uint8).tobytes() for _ in lengths
    ]
    tokens = rng.integers(0, 50_000, int(lengths.sum())).astype("<i4")
    return {"tokens": tokens, "lengths": lengths.tolist(), "payloads": payloads}


def counted_rounds(program: Generator, rounds: list[int]) -> Generator:
    """The same read program, counting the rounds of requests it yields."""
    try:
        requests = next(program)
        while True:
            rounds[0] += 1
            requests = program.send((yield requests))
    except StopIteration as stop:
        return stop.value


def measure(reader: Any, starts: list[int]) -> list[tuple[tuple, int, int]]:
    rows = []
    for start in starts:
        before = reader.stats.copy()
        rounds = [0]
        program = counted_rounds(reader.opened.read(start, WINDOW), rounds)
        _, payloads = reader.opened.reader.run_sync(program)
        spent = reader.stats - before
        kinds = (*sorted(spent.by_key_kind.items()), ("rounds", rounds[0]))
        heap = spent.bytes_by_key_kind.get("payload_heap", 0)
        rows.append((kinds, heap, sum(len(p) for p in payloads)))
    return rows


def main() -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as directory:
        storage = StreamWithMetaStorage(directory, Paragraphs())
        with storage.sync_writer() as writer:
            for shard in range(4):
                for _ in range(300):
                    writer.append(shard, record(rng))
        with storage.sync_reader() as reader:
            bounds = np.cumsum([0] + [reader.length(s) for s in range(4)])
            candidates = rng.integers(0, reader.total_length - WINDOW, 4000)
            inside = [
                int(s)
                for s in candidates
                if np.searchsorted(bounds, s, "right")
                == np.searchsorted(bounds, s + WINDOW - 1, "right")
            ]
            print(f"{reader.total_length:,} tokens in {reader.num_shards} shards")
            cases = {
                "cold: first window of each shard": measure(
                    reader, [int(bounds[k]) + 5000 for k in range(4)]
                ),
                "random windows inside one shard": measure(reader, inside[:1000]),
                "sequential windows": measure(
                    reader, list(range(10 * WINDOW, 510 * WINDOW, WINDOW))
                ),
            }
        for name, rows in cases.items():
            print(f"{name}: {len(rows)} windows")
            for kinds, count in collections.Counter(r[0] for r in rows).most_common():
                print(f"  {count:5d} x {dict(kinds)}")
            ratios = [fetched / referenced for _, fetched, referenced in rows if referenced]
            excess = max(fetched - 1.1 * referenced for _, fetched, referenced in rows)
            print(
                f"  heap bytes fetched / referenced: mean {np.mean(ratios):.3f}, "
                f"max {max(ratios):.3f}; max(fetched - 1.1 x referenced) = {excess:.0f} B "
                f"(gap allowed: two stored heap chunks = {2 * STORED_HEAP_CHUNK} B)"
            )


if __name__ == "__main__":
    main()
