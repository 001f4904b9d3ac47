"""Racing appends on GCS and Azure (their emulators): no reported commit is ever lost.

Azurite honours ``If-None-Match`` / ``If-Match``: of 4 processes appending at once, each
commit either lands (and its records are in the dataset) or learns it lost. The GCS
emulator ignores ``ifGenerationMatch``: rangestream's probe finds that out, and with no
single writer declared every commit is refused naming why, so none is reported and lost.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from support.cloud import CloudLocation
from support.cloud_data import append_in_rounds, write_stream

from rangestream import StreamStorage
from rangestream.io.conditional_writes import SINGLE_WRITER_ANY_ENV

WRITERS, ROUNDS = 4, 2


def test_racing_appends_never_lose_a_reported_commit(
    cloud_location: CloudLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SINGLE_WRITER_ANY_ENV, raising=False)
    base = np.arange(8, dtype="<i4")
    with monkeypatch.context() as declared:  # the first version, by one writer
        declared.setenv(SINGLE_WRITER_ANY_ENV, "1")
        write_stream(cloud_location.url, cloud_location.storage_options, base)
    # forkserver: the writers fork from one process that imported the storage once
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["support.cloud_data"])
    barrier, results = context.Barrier(WRITERS), context.Queue()
    processes = [
        context.Process(target=append_in_rounds, args=(
            cloud_location.url, cloud_location.storage_options, worker, ROUNDS, barrier,
            results,
        ))
        for worker in range(WRITERS)
    ]  # fmt: skip
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=240) for _ in range(WRITERS * ROUNDS)]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert not [o for o in outcomes if o[1].startswith("error")], outcomes
    committed = sorted(value for value, outcome in outcomes if outcome == "committed")
    storage = StreamStorage(cloud_location.url, storage_options=cloud_location.storage_options)
    with storage.sync_reader() as reader:
        stored = reader.read(0, reader.total_length)["t"].tolist()
    assert stored[: len(base)] == base.tolist()
    assert sorted(set(stored[len(base) :])) == committed, "a reported commit was lost"
    assert len(stored) == len(base) + 4 * len(committed)
    if cloud_location.conditional_writes:
        assert committed, outcomes
        assert any(outcome == "conflict" for _, outcome in outcomes), "no race happened"
    else:
        assert committed == [] and {o.split(":")[0] for _, o in outcomes} == {"refused"}
        assert all("ifGenerationMatch" in o and SINGLE_WRITER_ANY_ENV in o for _, o in outcomes)
