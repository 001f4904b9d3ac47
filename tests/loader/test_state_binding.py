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


# -- the block shuffle's buffer cuts -------------------------------------------------------------

BLOCK = {"shuffle": "block", "run_windows": 8, "buffer_runs": 4, "num_workers": 2}


def old_block_state(storage: StreamStorage) -> dict[str, Any]:
    """A state as the loader wrote it before it recorded ``buffer_cuts``: block-shuffled,
    two workers, 6 steps of 5 into epoch 0 (its buffers on the fixed grid of 4 runs)."""
    commit = loader(storage, **BLOCK).state_dict()["commit"]  # the data's: equal then and now
    return {
        "version": 1, "epoch": 0, "consumed_samples": 30, "phases": [[1, 5, 2, 1, 6]],
        "kind": "indexed", "shuffle": "block", "seed": 0, "run_windows": 8, "buffer_runs": 4,
        "num_samples": 500, "commit": commit, "sequence_length": 4, "stride": 4,
        "next_token": False, "batch_size": 5, "world_size": 1, "rank": 0, "drop_last": True,
    }  # fmt: skip


def test_an_old_block_state_without_buffer_cuts_is_refused_naming_both_schemes(
    windows: StreamStorage,
) -> None:
    from rangestream.loader.orders.block_shuffle import BlockShuffle
    from rangestream.loader.orders.phases import EpochPosition

    state = old_block_state(windows)
    # what is at stake: the windows its two readers consumed under the grid are not the
    # ones at the same positions of today's order, cut at those readers' regions
    shuffle = BlockShuffle(500, 0, 8, 4)
    position = EpochPosition.from_state_dict(state)
    regions = [(0, 15), (250, 265)]  # each worker's first 3 steps of 5
    consumed = np.concatenate([np.arange(a, b) for a, b in regions])
    assert set(shuffle.window_at(0, consumed).tolist()) != set(
        shuffle.window_at(0, consumed, position).tolist()
    )
    for resumed in (loader(windows, **BLOCK), loader(windows, **{**BLOCK, "num_workers": 0})):
        with pytest.raises(StateError) as caught:
            resumed.load_state_dict(state)
        message = str(caught.value)
        assert "no buffer_cuts" in message and "buffer_cuts='grid'" in message
        assert "buffer_cuts='first-phase'" in message and "epoch 0" in message
    with pytest.raises(StateError, match="no buffer_cuts"):
        loader(windows, **BLOCK).dataset.load_state_dict(
            {**state, "worker_id": 0, "num_workers": 1, "worker_batches": 0}
        )


def test_a_block_state_cut_by_another_scheme_is_refused_and_todays_resumes(
    windows: StreamStorage,
) -> None:
    state = saved(windows, **BLOCK)
    assert state["buffer_cuts"] == "first-phase"
    with pytest.raises(StateError, match="has buffer_cuts='grid', but this loader cuts"):
        loader(windows, **BLOCK).load_state_dict({**state, "buffer_cuts": "grid"})
    whole = [b["tokens"][:, 0].tolist() for b in loader(windows, **BLOCK)]
    resumed = loader(windows, **BLOCK)
    resumed.load_state_dict(state)
    assert [b["tokens"][:, 0].tolist() for b in resumed] == whole[2:]
