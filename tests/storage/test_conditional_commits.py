"""On a server that ignores ``If-Match`` / ``If-None-Match`` (rclone serve s3), a race of
commits loses no reported commit: each one either succeeds and stays, or is refused with
an error naming what the server does. (Unchecked, 8 of 19 reported commits were lost.)"""

from __future__ import annotations

import multiprocessing
import uuid
from typing import Any

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import CommitConflictError
from rangestream.io.conditional_writes import SINGLE_WRITER_ENV, ConditionalWritesUnsupportedError
from testkit.s3_servers import LocalS3Server

TOKENS = np.dtype([("t", "<i4")])
ROUNDS = 3
WRITERS = 4


def _commit_in_rounds(
    url: str, options: dict[str, Any], worker: int, barrier: Any, results: Any
) -> None:
    """One writer process: each round, write a part, wait for the others, commit."""
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)
    for round_number in range(ROUNDS):
        session = storage.parallel_write(overwrite=True)
        with session.sync_writer() as writer:
            writer.append(0, {"t": np.full(8, 100 * round_number + worker, dtype="<i4")})
        barrier.wait()  # every writer commits at once
        try:
            session.commit()
            outcome: tuple[str, str] = ("committed", "")
        except ConditionalWritesUnsupportedError as error:
            outcome = ("refused", str(error))
        except CommitConflictError as error:
            outcome = ("conflict", str(error))
        except Exception as error:  # reported, so the test names it
            outcome = ("error", repr(error))
        results.put((round_number, worker, session.commit_id, *outcome))
        barrier.wait()


def test_racing_commits_on_rclone_are_refused_never_silently_lost(
    rclone_s3_server: LocalS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SINGLE_WRITER_ENV, raising=False)
    endpoint = rclone_s3_server.endpoint
    endpoint.create_bucket("race")
    url = f"s3://race/ds-{uuid.uuid4().hex[:8]}"
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(WRITERS), context.Queue()
    processes = [
        context.Process(
            target=_commit_in_rounds,
            args=(url, endpoint.storage_options, worker, barrier, results),
        )
        for worker in range(WRITERS)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=240) for _ in range(ROUNDS * WRITERS)]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    kinds = {kind for *_, kind, _message in outcomes}
    assert kinds == {"refused"}, outcomes  # no success reported, so none can be lost
    for *_, message in outcomes:
        assert "accepted a PUT with If-None-Match: * over an existing object" in message
        assert SINGLE_WRITER_ENV in message
    storage = StreamStorage(
        url, StreamNumpyFormat(TOKENS), storage_options=endpoint.storage_options
    )
    assert not storage.exists()  # nothing was published behind a refusal
