"""Sessions: kept where a restart finds them, invisible to readers, gone after the commit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import DatasetNotFoundError, ResumeError
from rangestream.ingest.session import SESSION_KEY, begin, finish, part_id

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
