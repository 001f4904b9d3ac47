"""``Storage.zarr_group()``: zarr-python reads the committed version rangestream wrote."""

from __future__ import annotations

import numpy as np
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage

TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])


def test_the_group_of_the_committed_version_reads_every_shard(location: Location) -> None:
    storage = StreamStorage(
        location.child("ds"),
        StreamNumpyFormat(TOKENS),
        storage_options=location.storage_options,
        chunk_bytes=64,
        block_bytes=2048,
    )
    rng = np.random.default_rng(3)
    written: dict[int, list[np.ndarray]] = {0: [], 2: []}
    with storage.sync_writer() as writer:
        for record in range(12):
            shard = 2 * (record % 2)
            tokens = rng.integers(0, 10_000, int(rng.integers(1, 400)), dtype="<i4")
            writer.append(shard, {"tokens": tokens, "loss_mask": np.ones(len(tokens), "u1")})
            written[shard].append(tokens)
    group = storage.zarr_group()
    for shard, records in written.items():
        rows = group[f"shards/{shard}/stream"][:]  # structured rows stored as bytes
        tokens = rows.reshape(len(rows), -1).view(TOKENS)["tokens"].reshape(-1)
        np.testing.assert_array_equal(tokens, np.concatenate(records))
    assert group[f"shards/{0}/record_ends"][-1] == sum(len(r) for r in written[0])
