from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rangestream.errors import LoaderConfigError
from rangestream.loader import (
    IndexedSource,
    SampleSource,
    SourceOptions,
    StatefulDataLoader,
    register_storage_kind,
    registered_kinds,
    storage_kind,
)
from rangestream.loader.sources import storage_kinds as storage_kinds_module

from .fakes import FakeStreamDataset, FakeStreamStorage, positions_of


@pytest.fixture
def clean_registry() -> Iterator[None]:
    saved = dict(storage_kinds_module._BUILDERS)
    yield
    storage_kinds_module._BUILDERS.clear()
    storage_kinds_module._BUILDERS.update(saved)


def test_the_four_storage_kinds_are_registered() -> None:
    assert registered_kinds() == [
        "document",
        "stream",
        "stream_with_meta",
        "temporal",
        "temporal_records",
    ]


def test_storage_kind_reads_the_kind_attribute() -> None:
    assert storage_kind(FakeStreamStorage(4, kind="stream_with_meta")) == "stream_with_meta"


def test_a_storage_without_a_registered_kind_names_the_known_kinds() -> None:
    with pytest.raises(LoaderConfigError, match=r"kind=None.*\['document', 'stream'"):
        storage_kind(object())


@pytest.mark.usefixtures("clean_registry")
def test_a_registered_kind_is_served_by_from_storage() -> None:
    def build(storage: Any, options: SourceOptions) -> SampleSource:
        return IndexedSource(FakeStreamDataset(storage, options.sequence_length or 2),
                             shuffle=False)  # fmt: skip

    register_storage_kind("tokens_v2", build)
    loader = StatefulDataLoader.from_storage(
        FakeStreamStorage(8, kind="tokens_v2"), batch_size=2, num_workers=0, rank=0,
        world_size=1,
    )  # fmt: skip
    assert [positions_of(batch) for batch in loader] == [[0, 1], [2, 3]]


@pytest.mark.usefixtures("clean_registry")
def test_registering_a_kind_twice_needs_replace() -> None:
    def build(storage: Any, options: SourceOptions) -> SampleSource:
        raise AssertionError("never built")

    with pytest.raises(LoaderConfigError, match="'stream' is already registered"):
        register_storage_kind("stream", build)
    register_storage_kind("stream", build, replace=True)
    assert storage_kinds_module._BUILDERS["stream"] is build
