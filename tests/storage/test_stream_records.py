"""StreamStorage records: ``read_record(i)`` is one append call, found through record_ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location
from support.streams import SMALL, TOKENS, make_records, write

from rangestream import StreamNumpyFormat, StreamStorage


def test_read_record_returns_each_append_call_in_global_order(location: Location) -> None:
    records = make_records(9, shards=3, records=5, max_len=40)
    records[1][2] = {"tokens": np.empty(0, "<i4"), "loss_mask": np.empty(0, "u1")}  # empty
    records[3] = []  # ... and a shard id after an unwritten one
    records[4] = make_records(10, shards=1, records=2, max_len=9)[0]
    url = location.child("records")
    write(StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=location.storage_options,
                        **SMALL), records, [])  # fmt: skip
    in_order = [r for shard in sorted(records) for r in records[shard]]
    with StreamStorage(url, storage_options=location.storage_options).sync_reader() as reader:
        assert reader.num_records() == len(in_order)
        for i, expected in enumerate(in_order):
            np.testing.assert_array_equal(reader.read_record(i)["tokens"], expected["tokens"])
        np.testing.assert_array_equal(reader.read_record(-1)["tokens"], in_order[-1]["tokens"])
        np.testing.assert_array_equal(
            reader.read_record(-len(in_order))["loss_mask"], in_order[0]["loss_mask"]
        )
        got = reader.read_records([7, 0, -2])
        with pytest.raises(IndexError, match="outside the 17 records"):
            reader.read_record(len(in_order))
        with pytest.raises(IndexError):
            reader.read_record(-len(in_order) - 1)
    for record, i in zip(got, [7, 0, len(in_order) - 2], strict=True):
        np.testing.assert_array_equal(record["tokens"], in_order[i]["tokens"])


def test_a_record_costs_its_range_once_its_shards_record_ends_are_cached(tmp_path: Path) -> None:
    records = {0: [{"tokens": np.arange(n, dtype="<i4"), "loss_mask": np.ones(n, "u1")}
                   for n in (30, 50, 20)]}  # fmt: skip
    write(StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS)), records, [])
    with StreamStorage(tmp_path / "ds").sync_reader() as reader:
        assert reader.total_length == 100  # opened first: its one request is not the record's
        before = reader.stats.copy()
        reader.read_record(1)
        cold = reader.stats - before
        before = reader.stats.copy()
        record = reader.read_record(2)
        warm = reader.stats - before
    np.testing.assert_array_equal(record["tokens"], np.arange(20))
    assert cold.by_key_kind == {"record_ends": 1, "stream": 1}
    assert warm.by_key_kind == {"stream": 1}


def test_record_ends_beyond_the_cache_budget_are_read_per_record(tmp_path: Path) -> None:
    records = {0: [{"tokens": np.arange(n, dtype="<i4") + n, "loss_mask": np.ones(n, "u1")}
                   for n in (3, 5, 2, 4)]}  # fmt: skip
    write(StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS)), records, [])
    storage = StreamStorage(tmp_path / "ds", record_ends_cache_bytes=0)
    with storage.sync_reader() as reader:
        for i in (0, 3, 1):
            before = reader.stats.copy()
            got = reader.read_record(i)["tokens"]
            assert (reader.stats - before).by_key_kind == {"record_ends": 1, "stream": 1}
            np.testing.assert_array_equal(got, records[0][i]["tokens"])


def test_damaged_record_ends_are_refused(tmp_path: Path) -> None:
    from rangestream.errors import CorruptDataError

    path = tmp_path / "ds"
    records = {0: [{"tokens": np.arange(4, dtype="<i4"), "loss_mask": np.ones(4, "u1")}] * 3}
    write(StreamStorage(path, StreamNumpyFormat(TOKENS)), records, [])
    block = next((path / "data").glob("*/shards/0/record_ends/c/0"))
    data = bytearray(block.read_bytes())
    data[8:16] = np.asarray([100], "<i8").tobytes()  # record 1 ends past the stream
    block.write_bytes(bytes(data))
    reader = StreamStorage(path, verify_checksums=False).sync_reader()
    with reader, pytest.raises(CorruptDataError, match="record ends"):
        reader.read_record(0)


def rounds_of(opened: Any, program: Any) -> tuple[int, Any]:
    """Run a read program step by step on the remote executor: its rounds and result."""
    rounds, step = 0, next(program)
    while True:
        rounds += 1
        try:
            step = program.send(opened.remote.execute_sync(step))
        except StopIteration as stop:
            return rounds, stop.value


def test_record_starts_join_the_windows_round_and_a_record_needs_two_only_when_cold(
    tmp_path: Path,
) -> None:
    records = make_records(6, shards=2, records=4, max_len=30)
    write(StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS), **SMALL), records, [])
    with StreamStorage(tmp_path / "ds").sync_reader() as reader:
        opened = reader.opened
        total = reader.total_length
        rounds, windows = rounds_of(opened, opened.read_many_with_starts([(0, total)]))
        assert rounds == 1  # both shards' record ends came with the stream ranges
        sizes = [len(r["tokens"]) for s in sorted(records) for r in records[s]]
        assert windows[0][1].tolist() == np.cumsum([0, *sizes[:-1]]).tolist()
        assert rounds_of(opened, opened.read_records([5]))[0] == 1  # ends cached by now
    with StreamStorage(tmp_path / "ds").sync_reader() as reader:
        assert rounds_of(reader.opened, reader.opened.read_records([5]))[0] == 2
