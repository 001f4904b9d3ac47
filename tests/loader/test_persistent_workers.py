"""Workers kept across epochs (``persistent_workers``, the default with workers), under
every start method: over three epochs the same two worker processes build every batch
(no process is started after the first epoch), every epoch holds each window exactly once
(against windows cut from the raw tokens here), a shuffled epoch's order is a new one, and
a checkpoint taken inside the second epoch resumes in a fresh loader with exactly the rest
of that epoch and then the same third epoch as the run that was not stopped.

The ground truth: the tokens are random and written here, so window ``w`` is
``tokens[w * L:(w + 1) * L]`` of the array as written; the per-window shuffle's order is
rebuilt from :class:`~rangestream.loader.Permutation` (``expected.epoch_order``); the block
shuffle's order has no independent model, so it is checked as a multiset per epoch, as a
new order per epoch, and against the uninterrupted run on resume.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.loader import StatefulDataLoader
from testkit import S3Endpoint

from .expected import epoch_order
from .worker_parts import note_start, tagged

METHODS = ["fork", "spawn", "forkserver"]
TOKENS = np.dtype([("tokens", "<i4")])
SEQUENCE = 8
BATCH = 4
WINDOWS = 120  # 30 batches of 4: drop_last drops nothing, so every window comes once
WORKERS = 2
EPOCHS = 3
STOP_AFTER = 5  # batches of the second epoch before its checkpoint (odd: not a round)
SEED = 11


def write_tokens(url: str, options: dict[str, Any]) -> np.ndarray:
    """Random tokens over four records of two shards; returns them in storage order."""
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, 2**31 - 1, WINDOWS * SEQUENCE, dtype=np.int64).astype("<i4")
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options,
                            chunk_bytes=64, block_bytes=512)  # fmt: skip
    cuts = [0, 150, 480, 700, len(tokens)]  # records cross windows, chunks and blocks
    with storage.sync_writer() as writer:
        for record, (low, high) in enumerate(itertools.pairwise(cuts)):
            writer.append(record // 2, {"tokens": tokens[low:high]})
    return tokens


def truth(tokens: np.ndarray) -> list[tuple[int, ...]]:
    """Window ``w`` of the raw tokens, for every ``w``."""
    return [tuple(row) for row in tokens.reshape(WINDOWS, SEQUENCE).tolist()]


@pytest.fixture(scope="module")
def local_tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], Any]:
    url = str(tmp_path_factory.mktemp("persistent") / "tokens")
    return url, {}, write_tokens(url, {})


@pytest.fixture(scope="module")
def s3_tokens(s3_server: S3Endpoint, s3_bucket: str) -> tuple[str, dict[str, Any], Any]:
    url = f"s3://{s3_bucket}/persistent-{uuid.uuid4().hex[:8]}"
    options = s3_server.storage_options
    return url, options, write_tokens(url, options)


def started(directory: Path) -> list[int]:
    return sorted(int(name.name.split("-")[0]) for name in directory.iterdir())


def make_loader(data: tuple[str, dict[str, Any], Any], shuffle: str | bool, method: str,
                starts: Path) -> StatefulDataLoader:  # fmt: skip
    url, options, _tokens = data
    starts.mkdir()
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)
    block = {"run_windows": 4, "buffer_runs": 3} if shuffle == "block" else {}
    # persistent_workers is not passed: keeping the workers is the default
    return StatefulDataLoader.from_storage(
        storage, tagged, sequence_length=SEQUENCE, batch_size=BATCH, shuffle=shuffle,
        shuffle_seed=SEED, rank=0, world_size=1, num_workers=WORKERS,
        multiprocessing_context=method, worker_init_fn=functools.partial(note_start, str(starts)),
        **block,
    )  # fmt: skip


Batches = list[list[tuple[int, ...]]]


def play(iterator: Iterator[dict[str, Any]], pids: set[int], stop: int | None = None) -> Batches:
    """Batches (each a list of windows) until the epoch ends or ``stop`` were taken."""
    batches: Batches = []
    for batch in iterator:
        assert batch["tokens"].dtype == torch.int64
        batches.append([tuple(row) for row in batch["tokens"].tolist()])
        pids.add(batch["pid"])
        if stop is not None and len(batches) == stop:
            break
    return batches


def windows_of(batches: Batches) -> list[tuple[int, ...]]:
    return [window for batch in batches for window in batch]


def check_epochs_over_kept_workers(
    data: tuple[str, dict[str, Any], Any], shuffle: str | bool, method: str, tmp_path: Path
) -> None:
    tokens = data[2]
    windows = truth(tokens)
    loader = make_loader(data, shuffle, method, tmp_path / "uninterrupted")
    epochs: list[Batches] = []
    pids: list[set[int]] = []
    starts_after: list[list[int]] = []
    state: dict[str, Any] | None = None
    for epoch in range(EPOCHS):
        pids.append(set())
        iterator = iter(loader)
        if epoch == 1:
            head = play(iterator, pids[-1], stop=STOP_AFTER)
            state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint stores it
            epochs.append(head + play(iterator, pids[-1]))
        else:
            epochs.append(play(iterator, pids[-1]))
        starts_after.append(started(tmp_path / "uninterrupted"))

    # the same two workers built every batch of every epoch; none started after the first
    workers = starts_after[0]
    assert len(set(workers)) == WORKERS and os.getpid() not in workers
    assert starts_after == [workers] * EPOCHS
    assert pids == [set(workers)] * EPOCHS

    # each epoch exact: every window of the raw tokens once
    for batches in epochs:
        assert len(batches) == WINDOWS // BATCH
        assert sorted(windows_of(batches)) == sorted(windows)
    if shuffle == "window":
        for epoch, batches in enumerate(epochs):
            order = epoch_order(WINDOWS, SEED, epoch)
            assert windows_of(batches) == [windows[w] for w in order]
    if shuffle is False:
        assert all(windows_of(batches) == windows for batches in epochs)
    else:
        assert len({tuple(windows_of(batches)) for batches in epochs}) == EPOCHS

    # the checkpoint of the second epoch, in a fresh loader: the rest of it, then the third
    assert state is not None
    assert (state["epoch"], state["consumed_samples"]) == (1, STOP_AFTER * BATCH)
    resumed = make_loader(data, shuffle, method, tmp_path / "resumed")
    resumed.load_state_dict(state)
    resumed_pids: list[set[int]] = [set(), set()]
    rest = play(iter(resumed), resumed_pids[0])
    third = play(iter(resumed), resumed_pids[1])
    assert rest == epochs[1][STOP_AFTER:]
    assert third == epochs[2]
    again = started(tmp_path / "resumed")
    assert len(set(again)) == WORKERS and resumed_pids == [set(again)] * 2


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shuffle", ["window", "block", False])
def test_local_epochs_over_kept_workers_are_exact_and_resume_mid_epoch(
    local_tokens: tuple[str, dict[str, Any], Any], shuffle: str | bool, method: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    check_epochs_over_kept_workers(local_tokens, shuffle, method, tmp_path)


@pytest.mark.parametrize("method", METHODS)
def test_s3_block_shuffled_epochs_over_kept_workers_are_exact_and_resume_mid_epoch(
    s3_tokens: tuple[str, dict[str, Any], Any], method: str, tmp_path: Path
) -> None:
    check_epochs_over_kept_workers(s3_tokens, "block", method, tmp_path)
