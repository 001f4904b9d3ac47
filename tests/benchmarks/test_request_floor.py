"""The request model of ``benchmarks/request_floor.py`` against requests counted on S3.

The model says a window costs one GET per stored object it touches and an in-order stretch
one range per object; these tests read a small stream with tiny blocks over SeaweedFS and
compare the requests the library made (its own exact counters) with the model's figure for
the same windows, so the issue-30 analysis rests on counts, not on reasoning alone.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from support.s3 import S3Location

from benchmarks.request_floor import (
    fixed_object_ends,
    in_order_epoch,
    objects_touched,
    random_gets,
    rangestream_object_ends,
    whole_objects_epoch,
)
from benchmarks.systems.s3torch_systems import OBJECT_TOKENS, _Rows
from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.io import process_io_stats
from rangestream.loader import stack_collate

TOKENS = np.dtype([("tokens", "<i4")])
# 64 tokens (256 B) per inner chunk, 16 chunks (1024 tokens) per block (one object)
LAYOUT = {"chunk_bytes": 256, "block_bytes": 16 * (256 + 4 + 16) + 4}
SHARDS = (2500, 1700)  # blocks end at 1024, 2048 (shard 0), 2500 (shard end), 3524


def write(location: S3Location) -> StreamStorage:
    storage = StreamStorage(location.url, StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options, **LAYOUT)  # fmt: skip
    start = 0
    with storage.sync_writer() as writer:
        for shard, size in enumerate(SHARDS):
            writer.append(shard, {"tokens": np.arange(start, start + size, dtype="<i4")})
            start += size
    return storage


def test_the_object_ends_are_the_block_and_shard_ends(s3_url: S3Location) -> None:
    write(s3_url)
    ends, total = rangestream_object_ends(s3_url.url, s3_url.storage_options)
    assert ends.tolist() == [1024, 2048, 2500, 3524] and total == sum(SHARDS)
    assert fixed_object_ends(10, 4).tolist() == [4, 8]


def test_a_random_window_costs_the_objects_it_touches_as_counted(s3_url: S3Location) -> None:
    storage = write(s3_url)
    ends, _ = rangestream_object_ends(s3_url.url, s3_url.storage_options)
    # inside one block across inner chunks; straddling a block end; a shard end; two ends
    starts = np.array([100, 1000, 2040, 2490, 3500, 1020], dtype=np.int64)
    lengths = [129, 40, 9, 20, 30, 1100]
    counted = []
    with storage.sync_reader() as reader:
        for start, length in zip(starts.tolist(), lengths, strict=True):
            before = reader.stats
            got = reader.read(start, length)["tokens"]
            counted.append((reader.stats - before).requests)
            np.testing.assert_array_equal(got, np.arange(start, start + length))
    model = [int(random_gets(ends, starts[i : i + 1], n)[0]) for i, n in enumerate(lengths)]
    assert counted == model == [1, 2, 2, 2, 2, 3]


def collate_with_io(samples: list[Any]) -> tuple[Any, int, Any]:
    return stack_collate(samples), os.getpid(), process_io_stats()


def test_an_in_order_epoch_costs_objects_plus_stretch_boundaries_as_counted(
    s3_url: S3Location,
) -> None:
    storage = write(s3_url)
    ends, total = rangestream_object_ends(s3_url.url, s3_url.storage_options)
    # windows of 17 tokens at stride 16 (next_token); prefetch 64 gives stretches of
    # 64 // (2 * 4) = 8 steps of 4 windows
    loader = StatefulDataLoader.from_storage(
        storage, collate_with_io, sequence_length=16, next_token=True, batch_size=4,
        num_workers=2, shuffle=False, prefetch=64,
    )  # fmt: skip
    by_process: dict[int, Any] = {}
    windows = []
    for batch, pid, stats in loader:
        windows.append(batch["tokens"].numpy())
        by_process[pid] = stats
    rows = np.concatenate(windows)
    np.testing.assert_array_equal(rows, rows[:, :1] + np.arange(17))
    assert os.getpid() not in by_process  # over S3 every read is a worker's
    counted = sum(stats.by_key_kind.get("stream", 0) for stats in by_process.values())
    model = in_order_epoch(ends, total, length=17, stride=16, batch=4, workers=2,
                           stretch_steps=8)  # fmt: skip
    assert model.windows == len(rows) == 260  # (4200 - 17) // 16 + 1 = 262, 65 batches
    # 2 lead-in batches + 63 steps in 8 stretches: 10 reads over 5 objects; each of the 9
    # boundaries between reads lies in an object both reads touch, read once more
    assert model.stretches == 10
    assert counted == model.gets == 5 + 9


def test_whole_objects_emit_only_the_windows_inside_one_object() -> None:
    total = 3 * OBJECT_TOKENS + 5000
    tokens = np.arange(total, dtype="<i4")
    bodies = [(k, tokens[a : a + OBJECT_TOKENS].tobytes())
              for k, a in enumerate(range(0, total, OBJECT_TOKENS))]  # fmt: skip
    emitted = sum(1 for _ in _Rows(bodies, 2048, 2049))
    epoch = whole_objects_epoch(total, 2049, 2048, workers=2)
    assert epoch.windows == emitted and epoch.gets == 4 + 2
    # every window in storage order, the ones straddling the 3 object ends among them
    assert (total - 2049) // 2048 + 1 == emitted + 3


def test_objects_touched_counts_each_object_a_range_reaches() -> None:
    ends = np.array([10, 20, 30])
    first, stop = np.array([0, 9, 10, 5, 29]), np.array([10, 11, 20, 31, 40])
    assert objects_touched(ends, first, stop).tolist() == [1, 2, 1, 4, 2]
