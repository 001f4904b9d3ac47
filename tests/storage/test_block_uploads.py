"""Block uploads: spilled pieces cost one put each and come back in append order."""

from __future__ import annotations

from typing import Any

import numpy as np
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from testkit import LatencyProxy

BYTES = np.dtype([("b", "u1")])


def bytes_storage(location: Location, **options: Any) -> StreamStorage:
    return StreamStorage(location.child("ds"), StreamNumpyFormat(BYTES),
                         storage_options=location.storage_options, **options)  # fmt: skip


def test_spilled_pieces_cost_a_put_each_and_a_get_each_when_their_block_is_assembled(
    s3_url: Location, s3_proxy: LatencyProxy
) -> None:
    options = s3_proxy.merge_storage_options(s3_url.storage_options)
    storage = bytes_storage(Location(s3_url.url, options))
    record = {"b": np.arange(92, dtype="u1")}  # 92 bytes of stream + 8 of record_ends
    session = storage.parallel_write()
    s3_proxy.reset_stats()
    with session.sync_writer(part_id="w", max_buffered_bytes=250) as writer:
        writer.append(0, record)
        writer.append(1, record)
        assert writer.buffered_bytes == 200
        writer.append(2, record)  # 300 > 250: shard 0 (least recent) spills 2 pieces
        assert writer.buffered_bytes == 200
        writer.append(0, record)  # 300 again: shard 1 spills, 0 was just appended
        assert writer.buffered_bytes == 200
    stats = s3_proxy.stats()
    # at close, shards 0 and 1 read back their pieces; the spill prefix is listed and
    # its pieces deleted in one batch
    assert stats.method("GET") == 4 + 1 and stats.method("POST") == 1
    # 3 shards x (2 blocks, 2 array documents, 1 group) + 4 pieces + the part manifest
    assert stats.method("PUT") == 3 * 5 + 4 + 1
    session.commit()
    with storage.sync_reader() as reader:
        assert reader.read(0, 184)["b"].tolist() == list(range(92)) * 2
        assert reader.read(184, 184)["b"].tolist() == list(range(92)) * 2
        assert [reader.num_records(s) for s in range(3)] == [2, 1, 1]
    assert not any("/spill/" in key for key in _keys(storage))


def _keys(storage: StreamStorage) -> list[str]:
    from rangestream.io.process import run_blocking

    store = storage.new_write_store()

    async def listing() -> list[str]:
        try:
            return await store.list("")
        finally:
            await store.aclose()

    return run_blocking(listing())


def test_blocks_filled_across_many_spills_hold_the_rows_in_append_order(
    location: Location,
) -> None:
    rng = np.random.default_rng(1)
    storage = bytes_storage(location, chunk_bytes=16, block_bytes=512)  # 480-row blocks
    appended: dict[int, list[np.ndarray]] = {shard: [] for shard in range(6)}
    with storage.sync_writer() as writer:
        writer.max_buffered_bytes = 300  # a budget far below one block per shard
        for _ in range(400):
            shard = int(rng.integers(0, 6))
            values = rng.integers(0, 256, int(rng.integers(1, 40))).astype("u1")
            writer.append(shard, {"b": values})
            appended[shard].append(values)
            assert writer.buffered_bytes <= 300
    truth = np.concatenate([np.concatenate(appended[s]) for s in range(6)])
    with storage.sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(0, len(truth))["b"], truth)
    assert not any("/spill/" in key for key in _keys(storage))
