"""A ``sync_writer()`` session killed at each step of its commit loses nothing committed.

A stream dataset of two versions (the second appended to the first) is overwritten by a
child process writing with ``parallel_write(overwrite=True)`` / ``sync_writer()`` /
``commit()``, which SIGKILLs itself at one named step. Then, each on a copy of the store as
the kill left it: an overwrite whose writer fails, an append, ``gc`` with zero grace and
``verify``; after each, every live version reads back exactly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ingest.test_kill_points import (
    committed,
    copy_store,
    put_key,
    read_key,
    run_cli,
    store_flags,
)
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.storage.core.kill_points import ENVIRONMENT

TOKENS = np.dtype([("t", "<i4")])
STEPS = ("data-written", "part-written", "index-written", "root-published")

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from rangestream import StreamNumpyFormat, StreamStorage
    url, options = sys.argv[1], json.loads(sys.argv[2])
    storage = StreamStorage(url, StreamNumpyFormat(np.dtype([("t", "<i4")])),
                            storage_options=options)
    session = storage.parallel_write(overwrite=True)
    with session.sync_writer(part_id="killed") as writer:
        for shard in range(3):
            writer.append(shard, {"t": np.arange(100, 110, dtype="<i4")})
    session.commit()
    """
)


def storage_at(location: Location) -> StreamStorage:
    return StreamStorage(location.url, StreamNumpyFormat(TOKENS),
                         storage_options=location.storage_options)  # fmt: skip


def tokens_at(location: Location) -> list[int]:
    with storage_at(location).sync_reader() as reader:
        return reader.read(0, reader.total_length)["t"].tolist()


def write(location: Location, values: list[int], mode: str | None = None) -> None:
    with storage_at(location).sync_writer(mode=mode) as writer:
        writer.append(0, {"t": np.array(values, dtype="<i4")})


class Failed(Exception):
    pass


@pytest.mark.parametrize("step", STEPS)
def test_a_sync_writer_session_killed_at_each_step_loses_nothing_committed(
    step: str, location: Location
) -> None:
    ds = Location(location.child("ds"), location.storage_options)
    write(ds, [1, 2, 3])
    write(ds, [4, 5], mode="append")
    want = {committed(ds)["commit_id"]: [1, 2, 3, 4, 5]}
    v2_root = read_key(ds, "zarr.json")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, ds.url, json.dumps(ds.storage_options)],
        capture_output=True, text=True, timeout=120, env={**os.environ, ENVIRONMENT: step},
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    if step == "root-published":
        want[committed(ds)["commit_id"]] = list(range(100, 110)) * 3
    before = committed(ds)["commit_id"]
    for name in ("overwrite-failing", "append", "gc", "verify"):
        copy = Location(location.child(f"after-{name}"), location.storage_options)
        copy_store(ds, copy)
        if name == "overwrite-failing":
            with pytest.raises(Failed), storage_at(copy).sync_writer(overwrite=True) as writer:
                writer.append(0, {"t": np.array([9], dtype="<i4")})
                raise Failed
            assert committed(copy)["commit_id"] == before
        elif name == "append":
            write(copy, [7], mode="append")
            want[committed(copy)["commit_id"]] = [*want[before], 7]
        elif name == "gc":
            code, said = run_cli(["gc", copy.url, "--yes", "--grace", "0", *store_flags(copy)])
            assert code == 0 and committed(copy)["commit_id"] == before, said
        code, said = run_cli(["verify", copy.url, *store_flags(copy)])
        assert code == 0, said
        root = committed(copy)
        assert tokens_at(copy) == want[root["commit_id"]]
        if root.get("extra", {}).get("previous_commit_id") == next(iter(want)):
            # the replaced version, as a reader that opened it before the commit reads it
            scratch = Location(location.child(f"scratch-{name}"), location.storage_options)
            copy_store(copy, scratch)

            put_key(scratch, "zarr.json", v2_root)
            assert tokens_at(scratch) == [1, 2, 3, 4, 5]
