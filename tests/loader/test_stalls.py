"""The data-stall figure: what ``StatefulDataLoader.stall_stats()`` counts and how."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.loader import stack_collate
from rangestream.loader.reading.stalls import RESERVOIR, StallClock

KEYS = {"count", "wait_seconds", "wall_seconds", "wait_fraction", "p50", "p90", "p99", "max"}


def test_the_clock_keeps_count_total_max_and_nearest_rank_percentiles() -> None:
    clock = StallClock()
    assert clock.stats() == dict.fromkeys(KEYS, 0) | {"count": 0}
    now = 10.0
    for wait in range(1, 101):  # waits of 1..100 s, each asked 1 s after the last delivery
        clock.record(now, now + wait)
        now += wait + 1
    stats = clock.stats()
    assert set(stats) == KEYS
    assert (stats["count"], stats["wait_seconds"], stats["max"]) == (100, 5050, 100)
    assert (stats["p50"], stats["p90"], stats["p99"]) == (50, 90, 99)
    assert stats["wall_seconds"] == 5050 + 99  # first ask to last delivery
    assert stats["wait_fraction"] == pytest.approx(5050 / 5149)
    clock.reset()
    assert clock.stats()["count"] == 0


def test_the_clock_holds_a_bounded_sample_of_many_waits() -> None:
    clock = StallClock()
    for i in range(3 * RESERVOIR):
        clock.record(float(i), i + (1.0 if i % 2 else 0.0))  # half the waits 0 s, half 1 s
    stats = clock.stats()
    assert stats["count"] == 3 * RESERVOIR
    assert len(clock._sample) == RESERVOIR
    assert stats["wait_seconds"] == 3 * RESERVOIR / 2
    assert (stats["p50"] in (0.0, 1.0)) and stats["p99"] == 1.0 and stats["max"] == 1.0


class SlowCollate:
    """Stacks, after sleeping: a loader whose every batch keeps the step waiting."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, samples: list[Any]) -> Any:
        time.sleep(self.seconds)
        return stack_collate(samples)


@pytest.fixture
def storage(tmp_path: Path) -> StreamStorage:
    storage = StreamStorage(tmp_path / "s", StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(48 * 4, dtype="<u2")})
    return storage


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_batch_handed_out_is_timed_and_a_slow_collate_shows(
    storage: StreamStorage, num_workers: int
) -> None:
    sleep = 0.02
    processes: dict[str, Any] = {"num_workers": num_workers, "head_start": False}
    if num_workers:
        processes["multiprocessing_context"] = "fork"
    loader = StatefulDataLoader.from_storage(
        storage, SlowCollate(sleep), sequence_length=4, batch_size=4, rank=0, world_size=1,
        **processes,
    )  # fmt: skip
    assert loader.stall_stats()["count"] == 0
    batches = sum(1 for _ in loader)
    assert batches == 12
    stats = loader.stall_stats()
    assert set(stats) == KEYS
    assert stats["count"] == batches  # the epoch's end is not a batch
    if num_workers == 0:  # every collate runs inside next(): the wait covers each sleep
        assert stats["wait_seconds"] >= batches * sleep
        assert stats["p50"] >= sleep
    assert 0 < stats["wait_fraction"] <= 1
    assert stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]
    assert stats["wait_seconds"] <= stats["wall_seconds"]
    for _ in zip(range(3), loader, strict=False):  # cumulative over epochs ...
        pass
    assert loader.stall_stats()["count"] == batches + 3
    loader.reset_stalls()  # ... until reset
    assert loader.stall_stats()["count"] == 0
