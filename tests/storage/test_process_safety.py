"""Readers made in a parent keep working in forked children; local sync reads use no loop."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

from rangestream import StreamDataset, StreamNumpyFormat, StreamStorage

FIELDS = np.dtype([("tokens", "<i4")])


def _read_in_child(reader: Any, queue: Any) -> None:
    try:
        queue.put(reader[3]["tokens"].tolist())
    except BaseException as error:  # report instead of hanging the parent
        queue.put(repr(error))


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_a_reader_opened_in_the_parent_reads_correctly_in_a_child(
    location: Location, start_method: str
) -> None:
    storage = StreamStorage(location.child("ds"), StreamNumpyFormat(FIELDS),
                            storage_options=location.storage_options)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(1000, dtype="<i4")})
    with StreamDataset(storage, 10).sync_reader() as reader:
        assert reader[1]["tokens"].tolist() == list(range(10, 20))  # parent used it first
        context = multiprocessing.get_context(start_method)
        queue = context.Queue()
        child = context.Process(target=_read_in_child, args=(reader, queue))
        child.start()
        result = queue.get(timeout=120)
        child.join(60)
        assert result == list(range(30, 40))
        assert reader[2]["tokens"].tolist() == list(range(20, 30))  # parent still works


def test_local_sync_reads_start_no_event_loop_thread(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import threading, numpy as np
        from rangestream import StreamStorage, StreamNumpyFormat, StreamDataset
        fmt = StreamNumpyFormat(np.dtype([("t", "<i4")]))
        storage = StreamStorage({str(tmp_path / "ds")!r}, fmt)
        with StreamDataset(storage, 8).sync_reader() as reader:
            window = reader[5]["t"]
        assert window.tolist() == list(range(40, 48)), window
        print(sorted(t.name for t in threading.enumerate()))
        """
    )
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(np.dtype([("t", "<i4")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"t": np.arange(100, dtype="<i4")})
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "rangestream-io" not in output
    assert "MainThread" in output
