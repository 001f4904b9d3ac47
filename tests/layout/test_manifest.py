"""The root manifest's ``inherited`` shards: written only when needed, parsed as untrusted."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rangestream.errors import MetadataError
from rangestream.layout.block import ArrayLayout
from rangestream.layout.manifest import Manifest, parse_attributes

OWN, OLD, OLDER = "a" * 32, "b" * 32, "c" * 32


def manifest(inherited: dict[str, list[int]]) -> Manifest:
    layout = ArrayLayout(np.dtype("u1"), (), 64, 1024)
    ids = np.asarray([0, 1, 4], dtype=np.int64)
    lengths = {"payload_heap": np.asarray([5, 6, 7]), "payload_offsets": np.asarray([2, 2, 2])}
    arrays = {"payload_heap": layout, "payload_offsets": ArrayLayout(np.dtype("<i8"), (), 8, 64)}
    return Manifest("document", OWN, {}, arrays, ids, lengths, {}, inherited)


def attributes(inherited: dict[str, list[int]]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(manifest(inherited).to_attributes())))


def test_a_manifest_without_inherited_shards_stays_format_version_1() -> None:
    written = attributes({})
    assert written["format_version"] == 1 and "inherited" not in written
    assert parse_attributes(written, "root").array_key(4, "payload_heap") == (
        f"data/{OWN}/shards/4/payload_heap"
    )


def test_inherited_shards_are_read_under_their_commit_and_need_version_2() -> None:
    written = attributes({OLD: [0], OLDER: [1]})
    assert written["format_version"] == 2
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
