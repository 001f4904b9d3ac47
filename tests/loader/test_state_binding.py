"""A saved state is bound to what it describes: the data, the windows, the order.

A state loads only into a loader over the same data (the storage's commit, its sample
count), cut into the same windows (sequence length, stride, next-token setting) in the
same order (shuffle kind, seed); the difference is named. Workers, ranks and batch size
may change (elastic resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.errors import StateError

FIELDS = np.dtype([("tokens", "<u2")])


def write(path: Path, num_tokens: int, offset: int = 0) -> StreamStorage:
    storage = StreamStorage(path, StreamNumpyFormat(FIELDS))
    with storage.sync_writer(overwrite=True) as writer:
        writer.append(0, {"tokens": (np.arange(num_tokens) + offset).astype("<u2")})
    return StreamStorage(path)


def loader(storage: StreamStorage, **options: Any) -> StatefulDataLoader:
    settings: dict[str, Any] = {"sequence_length": 4, "batch_size": 5, "num_workers": 0,
                                "shuffle": "window", "rank": 0, "world_size": 1}  # fmt: skip
    return StatefulDataLoader.from_storage(storage, **{**settings, **options})


def saved(storage: StreamStorage, **options: Any) -> dict[str, Any]:
    first = loader(storage, **options)
    batches = iter(first)
    next(batches)
    next(batches)
    return first.state_dict()


@pytest.fixture
def windows(tmp_path: Path) -> StreamStorage:
    return write(tmp_path / "a", 2000)  # 500 windows of 4


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"sequence_length": 8}, "sequence_length=4 but this loader has sequence_length=8"),
        ({"stride": 2}, "stride=4 but this loader has stride=2"),
        ({"next_token": True}, "next_token=False but this loader has next_token=True"),
        ({"shuffle": False}, "shuffle=True but this loader has shuffle=False"),
        ({"shuffle": "block"}, "shuffle=True but this loader has shuffle='block'"),
        ({"shuffle_seed": 7}, "seed=0 but this loader has seed=7"),
    ],
)
def test_a_state_with_other_windows_or_another_order_is_refused(
    windows: StreamStorage, options: dict[str, Any], named: str
) -> None:
    state = saved(windows)
    other = loader(windows, **options)
    with pytest.raises(StateError, match=named.replace("(", r"\(")):
        other.load_state_dict(state)


def test_a_state_of_500_windows_does_not_load_over_100(tmp_path: Path) -> None:
    state = saved(write(tmp_path / "big", 2000))
    small = loader(write(tmp_path / "small", 400))
    with pytest.raises(StateError, match="num_samples=500 but this loader has num_samples=100"):
        small.load_state_dict(state)


def test_a_state_of_another_commit_is_refused_even_with_equal_sizes(tmp_path: Path) -> None:
    state = saved(write(tmp_path / "a", 2000))
    rewritten = loader(write(tmp_path / "a", 2000, offset=1))
    with pytest.raises(StateError, match="commit=") as caught:
        rewritten.load_state_dict(state)
    assert "num_samples" not in str(caught.value)
    moved = tmp_path / "moved"
    (tmp_path / "a").rename(moved)  # the same version elsewhere: the same data
    loader(StreamStorage(moved)).load_state_dict(saved(StreamStorage(moved)))


def test_elastic_changes_are_accepted_and_resume_exactly(windows: StreamStorage) -> None:
    state = saved(windows)  # 2 batches of 5: 10 samples consumed
    whole = [b["tokens"] for b in loader(windows, batch_size=10)]
    resumed = loader(windows, batch_size=2, num_workers=2, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert resumed.consumed_samples == 10
    rest = [b["tokens"][:, 0].tolist() for b in resumed]
    order = np.concatenate([b[:, 0].numpy() for b in whole])[10:]
    expected = order[: len(order) // 4 * 4].reshape(-1, 4)[:, 2:]
    assert np.concatenate(rest).tolist() == expected.reshape(-1).tolist()
