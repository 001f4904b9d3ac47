"""Sessions: kept where a restart finds them, invisible to readers, gone after the commit;
a running write's heartbeat keeps ``gc`` off its objects, and the grace counts from it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.cli.main import main
from rangestream.errors import DatasetNotFoundError, ResumeError
from rangestream.ingest import session as session_module
from rangestream.ingest.session import SESSION_KEY, Heartbeat, begin, finish, part_id

FORMAT = StreamNumpyFormat(np.dtype([("tokens", "<i4")]))


def test_an_interrupted_session_is_found_with_its_finished_splits(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", FORMAT)
    first = begin(storage, "abc", 3, resume=False, overwrite=False)
    for split in (0, 2):
        with first.session.sync_writer(part_id=part_id(split)) as writer:
            writer.append(split, {"tokens": np.arange(3, dtype="<i4")})
    stored = json.loads((tmp_path / "ds" / SESSION_KEY).read_text())
    assert stored["commit_id"] == first.session.commit_id and stored["fingerprint"] == "abc"
    with pytest.raises(DatasetNotFoundError):  # nothing visible before the commit
        StreamStorage(tmp_path / "ds", FORMAT).sync_reader().read(0, 1)
    again = begin(storage, "abc", 3, resume=True, overwrite=False)
    assert again.resumed and again.session.commit_id == first.session.commit_id
    assert again.done == {0, 2}
    with pytest.raises(ResumeError):
        begin(storage, "other", 3, resume=True, overwrite=False)
    again.session.commit()
    finish(storage)
    assert not (tmp_path / "ds" / "in_progress").exists()
    with storage.sync_reader() as reader:
        assert reader.total_length == 6


def test_resume_without_an_interrupted_session_starts_a_new_one(tmp_path: Path) -> None:
    state = begin(StreamStorage(tmp_path / "ds", FORMAT), "abc", 2, resume=True, overwrite=False)
    assert not state.resumed and state.done == frozenset()


def session_document(path: Path) -> dict[str, Any]:
    return json.loads((path / SESSION_KEY).read_text())


def test_a_running_write_refreshes_its_heartbeat_and_a_stopped_one_ends_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "HEARTBEAT_SECONDS", 0.02)
    storage = StreamStorage(tmp_path / "ds", FORMAT)
    state = begin(storage, "abc", 2, resume=False, overwrite=False)
    first = session_document(tmp_path / "ds")["heartbeat"]
    with pytest.raises(KeyboardInterrupt), Heartbeat(storage, state.session.commit_id):
        deadline = time.monotonic() + 30  # a wait for the thread, not a timing assertion
        while session_document(tmp_path / "ds")["heartbeat"] == first:
            assert time.monotonic() < deadline, "the heartbeat was never refreshed"
            time.sleep(0.01)
        raise KeyboardInterrupt  # stopped, not killed
    stopped = session_document(tmp_path / "ds")
    assert stopped["heartbeat"] > first and stopped["lease_seconds"] == 0.0
    # a session file another run took over is not rewritten by this run's heartbeat
    taken = {**stopped, "commit_id": "f" * 32, "heartbeat": 1.0}
    (tmp_path / "ds" / SESSION_KEY).write_text(json.dumps(taken))
    asyncio.run(Heartbeat(storage, state.session.commit_id).beat())
    assert session_document(tmp_path / "ds") == taken


def test_gc_counts_the_grace_period_from_the_last_heartbeat_once_the_lease_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = StreamStorage(tmp_path / "ds", FORMAT)
    state = begin(storage, "abc", 2, resume=False, overwrite=False)
    with state.session.sync_writer(part_id=part_id(0)) as writer:
        writer.append(0, {"tokens": np.arange(3, dtype="<i4")})
    prefix = tmp_path / "ds" / state.session.prefix
    # the objects were written an hour ago; the writer's last heartbeat was 200 s ago, and
    # its lease (120 s) has ended: gc may collect it only 200 s after that heartbeat
    now = time.time()
    for path in prefix.rglob("*"):
        os.utime(path, (now - 3600, now - 3600))
    document = {**session_document(tmp_path / "ds"), "heartbeat": now - 200}
    document["lease_seconds"] = 120.0
    (tmp_path / "ds" / SESSION_KEY).write_text(json.dumps(document))

    def gc(grace: str) -> dict[str, Any]:
        assert main(["gc", str(tmp_path / "ds"), "--grace", grace, "--yes", "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    kept = gc("300")  # 200 s since the heartbeat, under the grace: kept, however old
    assert [o["prefix"] for o in kept["young"]] == [state.session.prefix] and not kept["orphans"]
    assert prefix.exists()
    collected = gc("100")
    assert [o["prefix"] for o in collected["orphans"]] == [state.session.prefix]
    assert not prefix.exists()
