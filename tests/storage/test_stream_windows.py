"""Runs of windows (``read_many`` of windows at a constant stride) read as one span."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location
from support.streams import SMALL, TOKENS, ShardTagFormat, ground_truth, make_records, write

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.storage.stream.windows import run_of

#: on every server of the S3 matrix (support/s3_matrix.py)
pytestmark = pytest.mark.s3_core


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    shards=st.integers(1, 4),
    length=st.integers(1, 90),
    overlap=st.integers(0, 3),
    count=st.integers(1, 40),
    fraction=st.floats(0, 1),
)
def test_a_run_of_windows_reads_what_each_window_reads_alone(
    location: Location,
    seed: int,
    shards: int,
    length: int,
    overlap: int,
    count: int,
    fraction: float,
) -> None:
    data = make_records(seed, shards, 3, 150)
    tokens, shard_of = ground_truth(data)
    stride = max(1, length - overlap)
    count = max(1, min(count, (len(tokens) - length) // stride + 1))
    if length > len(tokens):
        return
    first = int(fraction * (len(tokens) - (count - 1) * stride - length))
    # examples may repeat these values (only ``fraction`` differs): one dataset each
    url = location.child(f"runs-{seed}-{shards}-{length}-{overlap}-{count}-{uuid.uuid4().hex[:8]}")
    storage = StreamStorage(url, ShardTagFormat(), storage_options=location.storage_options,
                            **SMALL)  # fmt: skip
    write(storage, data, [s for s in range(shards) for _ in range(3)])
    requests = [(first + i * stride, length) for i in range(count)]
    with storage.sync_reader() as reader:
        windows = reader.read_many(requests)
    for (start, _), window in zip(requests, windows, strict=True):
        np.testing.assert_array_equal(window["tokens"], tokens[start : start + length])
        np.testing.assert_array_equal(window["shard"], shard_of[start : start + length])

    async def read_async() -> list[Any]:
        async with storage.async_reader() as reader:
            return await reader.read_many(requests)

    for (start, _), window in zip(requests, asyncio.run(read_async()), strict=True):
        np.testing.assert_array_equal(window["tokens"], tokens[start : start + length])
        np.testing.assert_array_equal(window["shard"], shard_of[start : start + length])


@pytest.mark.parametrize("next_token", [True, False])
def test_a_run_costs_one_request_per_block_and_its_windows_do_not_alias(
    location: Location, next_token: bool
) -> None:
    records = {0: [{"tokens": np.arange(20_000, dtype="<i4"),
                    "loss_mask": np.ones(20_000, dtype="u1")}]}  # fmt: skip
    storage = StreamStorage(location.child("ds"), StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options, chunk_bytes=500,
                            block_bytes=50_000)  # fmt: skip
    write(storage, records, [0])
    length = 65 if next_token else 64
    requests = [(64 * i + 3, length) for i in range(100)]  # 6,400 rows of 5-byte elements
    with storage.sync_reader() as reader:
        block_rows = reader.opened.manifest.arrays["stream"].block_rows
        first_block, last_block = 3 // block_rows, (64 * 99 + 3 + length - 1) // block_rows
        reader.read(0, 1)  # the open and the first block's probe are not the run's
        before = reader.stats.copy()
        windows = reader.read_many(requests)
        spent = reader.stats - before
        assert spent.requests == last_block - first_block + 1 < len(requests)
        # the run's rows, whole inner chunks at both ends and their checksums
        assert spent.bytes <= (64 * 99 + length) * 5 * 1.01 + 2 * 504
        for (start, _), window in zip(requests, windows, strict=True):
            np.testing.assert_array_equal(window["tokens"], np.arange(start, start + length))
        windows[0]["tokens"][-1] = -1  # a window is its own: its neighbour keeps its values
        assert windows[1]["tokens"][0] == 64 + 3
        assert windows[0]["tokens"].flags.writeable


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ([(0, 8)] * 3, None),  # too few to be worth a run
        ([(10 + 8 * i, 8) for i in range(5)], (10, 8, 8, 5)),
        ([(10 + 7 * i, 8) for i in range(5)], (10, 7, 8, 5)),  # overlapping by one
        ([(10 + 9 * i, 8) for i in range(5)], None),  # gaps between windows
        ([(10, 8), (18, 8), (26, 8), (35, 8)], None),  # not one stride
        ([(10, 8), (18, 8), (26, 8), (34, 9)], None),  # not one length
        ([(10 - 8 * i, 8) for i in range(5)], None),  # descending
        ([(np.int64(8 * i), 8) for i in range(5)], None),  # not plain ints: window by window
    ],
)
def test_only_windows_of_one_length_at_one_stride_make_a_run(
    requests: list[tuple[int, int]], expected: tuple[int, int, int, int] | None
) -> None:
    assert run_of(requests) == expected
