"""The root manifest, format version 2: few shards listed in the root, many in a binary table.

Up to ``INLINE_SHARDS`` shards the root lists every shard (one request opens the dataset);
beyond, it holds their count and totals and the rows are read from ``index/shards``, checked
against those totals. ``inherited`` (an appended version's shards under earlier commits)
is parsed as untrusted and checked against the shard ids, listed or read from the table.
Version 1 roots are read as before; a newer version is refused with a message that says what
to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rangestream.errors import CorruptDataError, MetadataError
from rangestream.io.local import LocalStore
from rangestream.io.range_reader import RangeReader
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import Manifest, read_shard_table
from rangestream.layout.manifest_parsing import parse_attributes
from rangestream.layout.shard_table import INLINE_SHARDS

COMMIT = "0123456789abcdef0123456789abcdef"
INT64 = np.dtype("<i8")


def arrays() -> dict[str, ArrayLayout]:
    return {
        "stream": ArrayLayout(np.dtype("<i4"), (), 256, 1024),
        "record_ends": ArrayLayout(INT64, (), 128, 1024),
    }


def manifest(shards: int, seed: int = 0) -> Manifest:
    rng = np.random.default_rng(seed)
    ids = np.cumsum(rng.integers(1, 4, shards)) - 1  # increasing, with gaps
    lengths = {
        "stream": rng.integers(0, 5000, shards).astype(np.int64),
        "record_ends": rng.integers(0, 50, shards).astype(np.int64),
    }
    return Manifest("stream", COMMIT, {"stream_dtype": "<i4"}, arrays(), ids, lengths)


def attributes_of(value: Manifest) -> dict[str, Any]:
    return json.loads(json.dumps(value.to_attributes()))  # as a reader receives them


def store_table(root: Path, value: Manifest) -> LocalStore:
    """``index/shards`` of ``value`` written as the commit writes it (blocks of its layout)."""
    store = LocalStore(str(root))
    layout = value.table_layout
    rows = value.table_rows()
    for block in range(layout.num_blocks(len(rows))):
        data = rows[block * layout.block_rows : (block + 1) * layout.block_rows]
        encoded = encode_block(layout, np.ascontiguousarray(data).view(np.uint8))
        store.put_sync(layout.block_key(value.table_key, block), encoded)
    return store


def read_table(store: LocalStore, value: Manifest) -> tuple[Manifest, int]:
    reader = RangeReader(store)
    done = RemoteExecutor(reader, verify=True).run_sync(read_shard_table(value, store.describe))
    return done, reader.stats.requests


def test_a_root_lists_up_to_inline_shards_and_beyond_holds_only_their_count_and_totals() -> None:
    small, large = manifest(INLINE_SHARDS), manifest(INLINE_SHARDS + 1)
    listed = attributes_of(small)["shards"]
    assert listed["count"] == INLINE_SHARDS
    assert listed["ids"] == small.shard_ids.tolist()
    assert listed["lengths"]["stream"] == small.lengths["stream"].tolist()
    counted = attributes_of(large)["shards"]
    assert set(counted) == {"count", "totals", "columns", "table"}
    assert counted["count"] == INLINE_SHARDS + 1
    assert counted["totals"] == {
        "stream": int(large.lengths["stream"].sum()),
        "record_ends": int(large.lengths["record_ends"].sum()),
    }
    assert counted["columns"] == ["shard_id", "stream", "record_ends"]


def test_a_listed_root_parses_complete_and_a_counted_one_needs_its_table() -> None:
    small = parse_attributes(attributes_of(manifest(10)), "root")
    assert small.complete and small.num_shards == 10
    np.testing.assert_array_equal(small.shard_ids, manifest(10).shard_ids)
    large = parse_attributes(attributes_of(manifest(3000)), "root")
    assert not large.complete and large.num_shards == 3000
    assert large.totals["stream"] == int(manifest(3000).lengths["stream"].sum())
    with pytest.raises(MetadataError, match="shard table has not been read"):
        large.shard_ids  # noqa: B018 - the property is what is tested


def test_reading_the_table_completes_the_manifest_with_one_request_per_block(
    tmp_path: Path,
) -> None:
    written = manifest(3000)
    store = store_table(tmp_path, written)
    parsed = parse_attributes(attributes_of(written), "root")
    done, requests = read_table(store, parsed)
    assert requests == written.table_layout.num_blocks(3000) == 1
    np.testing.assert_array_equal(done.shard_ids, written.shard_ids)
    for name in ("stream", "record_ends"):
        np.testing.assert_array_equal(done.lengths[name], written.lengths[name])
    assert done.to_attributes() == written.to_attributes()


def test_a_table_that_disagrees_with_the_root_totals_is_refused(tmp_path: Path) -> None:
    written = manifest(2000)
    root = attributes_of(written)
    root["shards"]["totals"]["stream"] += 1  # or, equally, a table from another write
    store = store_table(tmp_path, written)
    with pytest.raises(CorruptDataError, match="stream lengths add up to"):
        read_table(store, parse_attributes(root, "root"))


def test_a_table_whose_ids_do_not_increase_is_refused(tmp_path: Path) -> None:
    written = manifest(2000)
    ids = written.shard_ids.copy()
    ids[5], ids[6] = ids[6], ids[5]
    swapped = Manifest(
        "stream", COMMIT, written.schema, written.arrays, ids, written.lengths, written.extra
    )
    store = store_table(tmp_path, swapped)
    with pytest.raises(CorruptDataError, match="strictly increasing"):
        read_table(store, parse_attributes(attributes_of(written), "root"))


def test_a_version_1_root_is_read_as_before() -> None:
    old = attributes_of(manifest(5))
    old["format_version"] = 1
    del old["shards"]["count"]
    parsed = parse_attributes(old, "root")
    assert parsed.complete and parsed.format_version == 1
    np.testing.assert_array_equal(parsed.lengths["stream"], manifest(5).lengths["stream"])


def test_a_newer_format_is_refused_with_what_to_do() -> None:
    newer = attributes_of(manifest(5))
    newer["format_version"] = 3
    with pytest.raises(MetadataError, match=r"reads versions 1, 2.*newer rangestream"):
        parse_attributes(newer, "root")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(count=INLINE_SHARDS), "must be an integer in"),
        (lambda s: s.update(count=True), "must be an integer in"),
        (lambda s: s.update(columns=["shard_id", "record_ends", "stream"]), "shards.columns"),
        (lambda s: s["totals"].update(stream=-1), "out of range"),
        (lambda s: s["table"].update(dtype="<i4"), "int64 rows"),
        (lambda s: s["table"].update(row_shape=[2]), "int64 rows"),
    ],
)
def test_a_counted_root_that_misdescribes_its_table_is_refused(change: Any, message: str) -> None:
    root = attributes_of(manifest(INLINE_SHARDS + 5))
    change(root["shards"])
    with pytest.raises(MetadataError, match=message):
        parse_attributes(root, "root")


def test_a_listed_root_whose_count_differs_from_its_ids_is_refused() -> None:
    root = attributes_of(manifest(7))
    root["shards"]["count"] = 8
    with pytest.raises(MetadataError, match="differs from the 7 shard ids"):
        parse_attributes(root, "root")


def test_arrays_of_one_block_are_stored_with_a_block_of_their_own_size_from_version_2() -> None:
    value = manifest(3)
    full = value.arrays["stream"]  # 256-row chunks, 1024-row blocks
    assert value.stored_layout("stream", 1).block_rows == 256
    assert value.stored_layout("stream", 257).block_rows == 512
    assert value.stored_layout("stream", 1024) == full
    assert value.stored_layout("stream", 1025) == full  # several blocks: the regular grid
    old = parse_attributes({**attributes_of(value), "format_version": 1}, "root")
    assert old.stored_layout("stream", 1) == full  # version 1 wrote full chunk indexes
    sparse = ArrayLayout(np.dtype("<i4"), (), 256, 1024, dense_chunks=False)
    assert sparse.stored_for(1) == sparse  # chunk indexes read by size: never shrunk


# -- inherited shards (appends) ------------------------------------------------------------

OWN, OLD, OLDER = "a" * 32, "b" * 32, "c" * 32


def appended(inherited: dict[str, list[int]]) -> Manifest:
    layout = ArrayLayout(np.dtype("u1"), (), 64, 1024)
    ids = np.asarray([0, 1, 4], dtype=np.int64)
    lengths = {"payload_heap": np.asarray([5, 6, 7]), "payload_offsets": np.asarray([2, 2, 2])}
    arrays = {"payload_heap": layout, "payload_offsets": ArrayLayout(np.dtype("<i8"), (), 8, 64)}
    return Manifest("document", OWN, {}, arrays, ids, lengths, {}, inherited)


def attributes(inherited: dict[str, list[int]]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(appended(inherited).to_attributes())))


def test_a_manifest_without_inherited_shards_writes_none() -> None:
    written = attributes({})
    assert written["format_version"] == 2 and "inherited" not in written
    assert parse_attributes(written, "root").array_key(4, "payload_heap") == (
        f"data/{OWN}/shards/4/payload_heap"
    )


def test_inherited_shards_are_read_under_their_commit() -> None:
    written = attributes({OLD: [0], OLDER: [1]})
    assert written["format_version"] == 2 and written["inherited"] == {OLD: [0], OLDER: [1]}
    parsed = parse_attributes(written, "root")
    assert parsed.array_key(0, "payload_heap") == f"data/{OLD}/shards/0/payload_heap"
    assert parsed.array_key(1, "payload_offsets") == f"data/{OLDER}/shards/1/payload_offsets"
    assert parsed.array_key(4, "payload_heap") == f"data/{OWN}/shards/4/payload_heap"
    assert parsed.commits == [OWN, OLD, OLDER]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a.update(format_version=1), "format_version 2"),
        (lambda a: a.update(format_version=3), "not supported"),
        (lambda a: a.update(inherited={OWN: [0]}), "earlier commit"),
        (lambda a: a.update(inherited={"../../etc": [0]}), "earlier commit"),
        (lambda a: a.update(inherited={OLD: [2]}), "distinct shards"),
        (lambda a: a.update(inherited={OLD: [0], OLDER: [0]}), "distinct shards"),
        (lambda a: a.update(inherited={OLD: [0, 0]}), "distinct shards"),
        (lambda a: a.update(inherited={OLD: "0"}), "64-bit integers"),
        (lambda a: a.update(inherited=[OLD]), "bad inherited"),
        (lambda a: a["extra"].update(previous_inherited=["x"]), "previous_inherited"),
    ],
)
def test_a_malformed_inherited_map_is_refused(change: Any, match: str) -> None:
    written = attributes({OLD: [0]})
    change(written)
    with pytest.raises(MetadataError, match=match):
        parse_attributes(written, "root")


def test_inherited_shards_of_a_table_are_checked_against_the_rows_read(tmp_path: Path) -> None:
    value = manifest(INLINE_SHARDS + 5)
    ids = value.shard_ids.tolist()
    grown = Manifest(
        value.kind, COMMIT, value.schema, value.arrays, value.shard_ids, value.lengths, {},
        {OLD: ids[:3], OLDER: ids[3:5]},
    )  # fmt: skip
    written = attributes_of(grown)
    assert "ids" not in written["shards"] and written["inherited"] == {
        OLD: ids[:3],
        OLDER: ids[3:5],
    }
    store = store_table(tmp_path, grown)
    parsed, _ = read_table(store, parse_attributes(written, "root"))
    assert parsed.array_key(ids[4], "stream") == f"data/{OLDER}/shards/{ids[4]}/stream"
    assert parsed.array_key(ids[5], "stream") == f"data/{COMMIT}/shards/{ids[5]}/stream"
    written["inherited"] = {OLD: [ids[-1] + 1]}  # not a shard of this version
    with pytest.raises(CorruptDataError, match="distinct shards of this version"):
        read_table(store, parse_attributes(written, "root"))
