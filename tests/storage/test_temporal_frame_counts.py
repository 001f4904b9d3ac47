"""``frame_counts``: a lazy read-only array-like equal to numpy that reads the record index
by range as it is indexed (requests are exact counts)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from support.temporal import ALL, COUNTS, small_cache, write_bulk

from rangestream.errors import OutOfRangeError


@pytest.fixture(scope="module")
def bulk(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("bulk") / "ds")
    write_bulk(path, COUNTS)
    return path


def test_frame_counts_is_a_lazy_array_like_equal_to_numpy(bulk: str) -> None:
    storage = small_cache(bulk)
    counts = storage.frame_counts
    assert len(counts) == len(ALL) and counts.dtype == np.int64 and counts.shape == (len(ALL),)
    assert storage.stats.requests == 1  # nothing but the root so far
    assert counts[1234] == ALL[1234] and counts[-1] == ALL[-1]
    assert storage.stats.by_key_kind["record_rows"] == 2  # their two index chunks
    assert np.array_equal(counts[100:1900], ALL[100:1900])
    picks = np.asarray([4000, 3, 1025, 3, 2999])
    assert np.array_equal(counts[picks], ALL[picks])
    assert np.array_equal(np.asarray(counts), ALL)
    assert counts.tolist() == ALL.tolist()
    assert list(counts) == ALL.tolist()
    with pytest.raises(OutOfRangeError):
        counts[len(ALL)]


def test_frame_counts_pickle_as_their_storage_and_reopen_on_first_use(bulk: str) -> None:
    storage = small_cache(bulk)
    counts = storage.frame_counts
    assert counts[1234] == ALL[1234]  # the parent opened it and holds an index chunk
    payload = pickle.dumps(counts)
    assert len(payload) < 2048  # no index entries, cache or lock travel with it
    clone = pickle.loads(payload)
    assert clone.storage.stats.requests == 0  # nothing opened in the copy yet
    assert len(clone) == len(ALL)
    assert np.array_equal(clone[3000:3100], ALL[3000:3100])
    assert np.array_equal(pickle.loads(pickle.dumps(clone))[:], ALL)  # a copy of a copy too
    assert clone.storage.stats.requests > 0 and storage.stats.by_key_kind["record_rows"] == 1
