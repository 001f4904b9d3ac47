"""Part manifests: both formats commit to the same manifest, each part read once; hostile
parts, overlapping writers and disagreeing schemas are refused naming the part."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage, TemporalArrayStorage
from rangestream.errors import CommitError, SchemaMismatchError
from rangestream.io.local import LocalStore
from rangestream.storage.core import parts as part_manifests
from rangestream.storage.core.parts import part_document
from rangestream.storage.core.writing import WriteSession

TOKENS = np.dtype([("t", "<i4")])
ARRAYS = ("stream", "record_ends")


def tokens_storage(path: Path) -> StreamStorage:
    return StreamStorage(path / "ds", StreamNumpyFormat(TOKENS))


def first_format(part_id: str, shards: dict[int, dict[str, int]]) -> bytes:
    """A part as writers wrote them before the columnar format (the old writer's code)."""
    document = {"part_id": part_id, "shards": {str(s): lengths for s, lengths in shards.items()}}
    return json.dumps(document).encode()


def put_part(path: Path, session: WriteSession, name: str, data: bytes) -> None:
    part = path / "ds" / session.prefix / "parts" / f"{name}.json"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(data)


def count_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Requests to local objects, by key, from here on."""
    reads: Counter[str] = Counter()
    get_range = LocalStore.get_range

    async def counted(self: LocalStore, key: str, start: int, end: int) -> bytes:
        reads[key] += 1
        return await get_range(self, key, start, end)

    monkeypatch.setattr(LocalStore, "get_range", counted)
    return reads


def claimed_shards(parts: int, per_part: int, seed: int) -> list[dict[int, dict[str, int]]]:
    """Each part's shards (ids dealt at random, so no part's are contiguous) and rows."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(parts * per_part * 3)[: parts * per_part]
    rows = rng.integers(0, 10**9, size=(parts * per_part, 2))
    return [
        {
            int(ids[p * per_part + i]): dict(
                zip(ARRAYS, map(int, rows[p * per_part + i]), strict=True)
            )
            for i in range(per_part)
        }
        for p in range(parts)
    ]


@pytest.mark.parametrize("part_format", ["columnar", "first", "both"])
def test_a_commit_of_many_parts_reads_each_once_and_lists_every_shard_with_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part_format: str
) -> None:
    storage = tokens_storage(tmp_path)
    session = storage.parallel_write()
    claims = claimed_shards(parts=300, per_part=20, seed=1)
    for p, shards in enumerate(claims):
        columnar = part_format == "columnar" or (part_format == "both" and p % 2 == 0)
        data = part_document(f"p{p}", shards) if columnar else first_format(f"p{p}", shards)
        put_part(tmp_path, session, f"p{p}", data)
    reads = count_reads(monkeypatch)
    manifest = session.commit(check_objects=False)  # claimed shards: parts without objects
    part_reads = {key: n for key, n in reads.items() if "/parts/" in key}
    assert len(part_reads) == len(claims) and set(part_reads.values()) == {1}
    # ground truth: every claim, sorted by shard id
    table = np.array(sorted((s, *(r[a] for a in ARRAYS)) for c in claims for s, r in c.items()))
    np.testing.assert_array_equal(manifest.shard_ids, table[:, 0])
    for i, name in enumerate(ARRAYS):
        np.testing.assert_array_equal(manifest.lengths[name], table[:, 1 + i])
    assert manifest.totals == {name: int(table[:, 1 + i].sum()) for i, name in enumerate(ARRAYS)}


def test_writers_write_columnar_parts_that_commit_as_the_data_they_wrote(tmp_path: Path) -> None:
    storage = tokens_storage(tmp_path)
    session = storage.parallel_write()
    for writer_index in range(3):
        with session.sync_writer(part_id=f"w{writer_index}") as writer:
            for shard in (writer_index, writer_index + 3):
                writer.append(shard, {"t": np.arange(shard + 1, dtype="<i4")})
    part = json.loads((tmp_path / "ds" / session.prefix / "parts" / "w1.json").read_bytes())
    assert part == {
        "part_id": "w1",
        "format_version": 2,
        "shard_ids": [1, 4],
        "lengths": {"stream": [2, 5], "record_ends": [1, 1]},
    }
    session.commit()
    with storage.sync_reader() as reader:
        tokens = reader.read(0, reader.total_length)["t"].tolist()
    assert tokens == [t for shard in range(6) for t in range(shard + 1)]


def test_a_part_longer_than_the_first_read_is_read_whole_with_one_more_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(part_manifests, "PART_FIRST_READ_BYTES", 256)
    storage = tokens_storage(tmp_path)
    session = storage.parallel_write()
    (long_part,) = claimed_shards(parts=1, per_part=100, seed=2)
    put_part(tmp_path, session, "long", part_document("long", long_part))
    short = {10**6: {"stream": 3, "record_ends": 1}}
    put_part(tmp_path, session, "short", part_document("short", short))
    reads = count_reads(monkeypatch)
    manifest = session.commit(check_objects=False)  # claimed shards: parts without objects
    assert reads[f"{session.prefix}/parts/long.json"] == 2
    assert reads[f"{session.prefix}/parts/short.json"] == 1
    assert manifest.shard_ids.tolist() == [*sorted(long_part), 10**6]


def test_two_parts_naming_one_shard_fail_naming_both_parts_and_the_first_shard(
    tmp_path: Path,
) -> None:
    storage = tokens_storage(tmp_path)
    session = storage.parallel_write()
    lengths = {"stream": 1, "record_ends": 1}
    put_part(tmp_path, session, "a", part_document("a", {s: lengths for s in (5, 1, 9)}))
    put_part(tmp_path, session, "b", first_format("b", {s: lengths for s in (2, 3)}))
    # c repeats 9 then 1: 9 comes first in c, so 9 is the shard a reading in order meets
    put_part(tmp_path, session, "c", part_document("c", {s: lengths for s in (4, 9, 1)}))
    prefix = session.prefix
    with pytest.raises(CommitError) as raised:
        session.commit()
    assert str(raised.value) == (
        f"shard 9 was written by two writers ({prefix}/parts/a.json and {prefix}/parts/c.json)"
        "; each shard must have exactly one writer"
    )
    assert not storage.exists()


def test_an_overlap_among_earlier_parts_is_reported_before_a_later_unreadable_part(
    tmp_path: Path,
) -> None:
    storage = tokens_storage(tmp_path)
    session = storage.parallel_write()
    lengths = {"stream": 1, "record_ends": 1}
    put_part(tmp_path, session, "a", part_document("a", {0: lengths}))
    put_part(tmp_path, session, "b", first_format("b", {0: lengths}))
    put_part(tmp_path, session, "c", b"{not json")
    with pytest.raises(CommitError, match=r"shard 0 was written by two writers \(.*a\.json and"):
        session.commit()


def columnar_part(**fields: Any) -> bytes:
    document = {"part_id": "p", "format_version": 2, "shard_ids": [0, 1],
                "lengths": {"stream": [3, 4], "record_ends": [1, 1]}}  # fmt: skip
    document.update(fields)
    return json.dumps(document).encode()


HOSTILE_PARTS = {
    "not an object": b"[1, 2]",
    "not json": b"\xff\x00",
    "a newer format": columnar_part(format_version=3),
    "a format that is not an integer": columnar_part(format_version=2.0),
    "ids not a list": columnar_part(shard_ids={"0": 1}),
    "float ids": columnar_part(shard_ids=[0, 1.5]),
    "string ids": columnar_part(shard_ids=["0", "1"]),
    "negative id": columnar_part(shard_ids=[-1, 1]),
    "id past int64": columnar_part(shard_ids=[0, 1 << 63]),
    "id far past int64": columnar_part(shard_ids=[0, 1 << 70]),
    "nested ids": columnar_part(shard_ids=[[0], [1]]),
    "ragged ids": columnar_part(shard_ids=[[0], 1]),
    "boolean lengths": columnar_part(lengths={"stream": [True, False], "record_ends": [1, 1]}),
    "lengths not an object": columnar_part(lengths=[[3, 4], [1, 1]]),
    "a column too short": columnar_part(lengths={"stream": [3], "record_ends": [1, 1]}),
    "negative length": columnar_part(lengths={"stream": [3, -4], "record_ends": [1, 1]}),
    "huge length": columnar_part(lengths={"stream": [3, 1 << 50], "record_ends": [1, 1]}),
    "a shard listed twice": columnar_part(shard_ids=[7, 7]),
    "a missing array": columnar_part(lengths={"stream": [3, 4]}),
    "first format, shards not an object": json.dumps({"shards": [1]}).encode(),
    "first format, a non-integer id": json.dumps({"shards": {"x": {"stream": 1}}}).encode(),
    "first format, an entry not an object": json.dumps({"shards": {"0": [1, 1]}}).encode(),
    "first format, a float length": json.dumps(
        {"shards": {"0": {"stream": 1.5, "record_ends": 1}}}
    ).encode(),
    "first format, a shard missing an array": json.dumps(
        {"shards": {"0": {"stream": 1, "record_ends": 1}, "1": {"stream": 1}}}
    ).encode(),
    "no shards": json.dumps({"part_id": "p"}).encode(),
    "schema not an object": columnar_part(schema=[1]),
}


@pytest.mark.parametrize("content", HOSTILE_PARTS.values(), ids=HOSTILE_PARTS.keys())
def test_a_hostile_part_fails_the_commit_naming_the_part(tmp_path: Path, content: bytes) -> None:
    storage = tokens_storage(tmp_path)
    session = storage.parallel_write()
    put_part(tmp_path, session, "good", part_document("good", {9: {"stream": 2, "record_ends": 1}}))
    put_part(tmp_path, session, "hostile", content)
    hostile = str(tmp_path / "ds" / session.prefix / "parts" / "hostile.json")
    with pytest.raises(CommitError, match=f"part manifest {hostile} "):
        session.commit()
    assert not storage.exists()


def test_a_part_of_no_shards_commits_with_the_others_in_either_format(tmp_path: Path) -> None:
    storage = tokens_storage(tmp_path)
    session = storage.parallel_write()
    put_part(tmp_path, session, "empty1", first_format("empty1", {}))
    put_part(tmp_path, session, "empty2", part_document("empty2", {}))
    put_part(tmp_path, session, "one", part_document("one", {4: {"stream": 2, "record_ends": 1}}))
    manifest = session.commit(check_objects=False)  # a claimed shard: a part without objects
    assert manifest.shard_ids.tolist() == [4]
    assert manifest.lengths["stream"].tolist() == [2]


def frames(dtype: str) -> dict[str, np.ndarray]:
    return {"x": np.zeros((2, 3), dtype=dtype)}


def test_parts_of_one_schema_bind_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = TemporalArrayStorage(tmp_path / "ds")
    session = storage.parallel_write()
    for shard in range(20):
        with session.sync_writer(part_id=f"p{shard}") as writer:
            writer.append(shard, frames("<f4"))
    binds = Counter[str]()
    bind = TemporalArrayStorage.bind_schema

    def counted(self: TemporalArrayStorage, schema: dict[str, Any], where: str) -> Any:
        binds[where] += 1
        return bind(self, schema, where)

    monkeypatch.setattr(TemporalArrayStorage, "bind_schema", counted)
    session.commit()
    assert sum(binds.values()) == 1
    with storage.sync_reader() as reader:
        assert len(reader) == 20


def test_a_part_whose_schema_disagrees_with_an_earlier_one_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    storage = TemporalArrayStorage(tmp_path / "ds")
    session = storage.parallel_write()
    for shard, dtype in enumerate(["<f4", "<f4", "<f8", "<f4"]):
        with session.sync_writer(part_id=f"p{shard}") as writer:
            writer.append(shard, frames(dtype))
    disagreeing = str(tmp_path / "ds" / session.prefix / "parts" / "p2.json")
    with pytest.raises(SchemaMismatchError, match=f"{disagreeing} was written with another schema"):
        session.commit()
    assert not storage.exists()
