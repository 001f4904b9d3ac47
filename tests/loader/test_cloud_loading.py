"""The loader over GCS and Azure (their emulators): workers resume exactly.

A run interrupted after 9 steps and resumed from its ``state_dict`` yields exactly the
batches the uninterrupted run yields, with the resumed loader's workers started by fork or
by spawn (a spawned worker opens the store from a pickled storage, in a fresh interpreter).
The reference and interrupted runs fork (spawned interpreters cost ~10 s each here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.cloud import CloudLocation
from support.cloud_data import write_stream

from rangestream import StatefulDataLoader, StreamStorage

WINDOW, TOKENS = 8, 2400  # 300 windows


def _loader(storage: StreamStorage, start_method: str) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(
        storage, sequence_length=WINDOW, batch_size=6, num_workers=2, shuffle="block",
        run_windows=20, shuffle_seed=11, rank=0, world_size=1,
        multiprocessing_context=start_method,
    )  # fmt: skip


def _starts(batch: dict[str, Any]) -> list[int]:
    return (batch["t"][:, 0] // WINDOW).tolist()


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_the_loader_resumes_exactly_with_workers(
    cloud_location: CloudLocation, start_method: str
) -> None:
    storage = write_stream(cloud_location.url, cloud_location.storage_options,
                           np.arange(TOKENS, dtype="<i4"))  # fmt: skip
    whole = [_starts(batch) for batch in _loader(storage, "fork")]
    first = _loader(storage, "fork")
    iterator = iter(first)
    head = [_starts(next(iterator)) for _ in range(9)]
    state = first.state_dict()
    del iterator
    resumed = _loader(storage, start_method)
    resumed.load_state_dict(state)
    rest = [_starts(batch) for batch in resumed]
    assert head + rest == whole
    assert sorted(s for batch in whole for s in batch) == list(range(TOKENS // WINDOW))
