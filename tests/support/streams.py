"""Stream records for the stream storage tests: random records, and a writer that
interleaves their shards."""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream import StreamStorage
from rangestream.types import StreamStorageFormat

TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])
SMALL = {"chunk_bytes": 40, "block_bytes": 400}  # many blocks and chunks from little data


def make_records(seed: int, shards: int, records: int, max_len: int) -> dict[int, list[Any]]:
    rng = np.random.default_rng(seed)
    return {
        shard: [
            {
                "tokens": rng.integers(0, 50_000, n, dtype="<i4"),
                "loss_mask": rng.integers(0, 2, n, dtype="u1"),
            }
            for n in rng.integers(1, max_len, records)
        ]
        for shard in range(shards)
    }


def write(storage: StreamStorage, records: dict[int, list[Any]], order: list[int]) -> None:
    with storage.sync_writer() as writer:
        cursors = dict.fromkeys(records, 0)
        for shard in order:  # interleave shards in the order given
            if cursors[shard] < len(records[shard]):
                writer.append(shard, records[shard][cursors[shard]])
                cursors[shard] += 1
        for shard, recs in records.items():
            for record in recs[cursors[shard] :]:
                writer.append(shard, record)


def ground_truth(records: dict[int, list[Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Global element order is shard by shard; also returns each element's shard."""
    tokens = np.concatenate([r["tokens"] for s in sorted(records) for r in records[s]])
    shards = np.concatenate(
        [np.full(len(r["tokens"]), s) for s in sorted(records) for r in records[s]]
    )
    return tokens, shards


class ShardTagFormat(StreamStorageFormat[dict, dict, np.int32]):
    """A custom format that records which shard each element came from."""

    def __init__(self) -> None:
        super().__init__(np.dtype("<i4"))

    def pack(self, data: dict) -> np.ndarray:
        return np.asarray(data["tokens"], dtype=self.stream_dtype)

    def unpack(self, stream: np.ndarray, shard_lengths: np.ndarray, shards: np.ndarray) -> dict:
        shard_ids = np.concatenate(
            [np.full(n, s, dtype=np.int64) for n, s in zip(shard_lengths, shards, strict=True)]
            or [np.empty(0, np.int64)]
        )
        return {"tokens": stream, "shard": shard_ids}
