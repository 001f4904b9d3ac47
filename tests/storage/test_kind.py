"""``StorageKind``: every storage kind offers each member the lifecycle asks of it."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from rangestream import (
    DocumentStorage,
    StreamNumpyFormat,
    StreamStorage,
    StreamWithMetaStorage,
    TemporalArrayStorage,
)
from rangestream.storage.core.base import Storage
from rangestream.storage.core.kind import StorageKind

TOKENS = np.dtype([("tokens", "<i4")])


def _members() -> dict[str, bool]:
    """Each public member of the protocol, and whether it is a method."""
    members = {name: False for name in StorageKind.__annotations__}
    for name, value in vars(StorageKind).items():
        if not name.startswith("_"):
            members[name] = inspect.isfunction(value)
    return members


def test_the_contract_names_the_former_hooks() -> None:
    members = _members()
    assert {
        "check_schema",
        "open_index",
        "reading_format",
        "array_layouts",
        "array_attributes",
        "shard_encoder",
        "bind_record",
        "bind_schema",
        "kind_schema",
        "committed_schema",
        "write_derived_index",
        "new_store",
        "new_write_store",
        "appending_to",
        "opened_class",
        "layout_options",
    } <= set(members)
    for name in members:
        assert not hasattr(Storage, f"_{name}"), f"Storage still has the hook _{name}"


@pytest.mark.parametrize(
    "make",
    [
        lambda root: StreamStorage(root / "s", StreamNumpyFormat(TOKENS)),
        lambda root: StreamWithMetaStorage(root / "m"),
        lambda root: DocumentStorage(root / "d"),
        lambda root: TemporalArrayStorage(root / "t"),
    ],
    ids=["stream", "stream_with_meta", "document", "temporal"],
)
def test_every_kind_offers_every_member(make: object, tmp_path: Path) -> None:
    storage = make(tmp_path)  # type: ignore[operator]
    for name, is_method in _members().items():
        assert hasattr(storage, name), f"{type(storage).__name__} lacks {name}"
        if is_method:
            assert callable(getattr(storage, name)), f"{type(storage).__name__}.{name}"
    assert storage.kind == type(storage).kind != ""
