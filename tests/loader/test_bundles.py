"""Batches leave a tagged worker in bundles: the first alone, then several per message."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing

import rangestream.loader.transport as transport
from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.loader.transport import BUNDLE_BATCHES, Bundle, bundled, for_transport


@pytest.mark.parametrize("count", [0, 1, 2, 5, 13])
def test_the_first_batch_goes_alone_then_bundles_of_at_most_the_bundle_size(count: int) -> None:
    bundles = list(bundled(iter(range(count)), most=4))
    assert all(type(bundle) is Bundle for bundle in bundles)
    assert [item for bundle in bundles for item in bundle] == list(range(count))
    sizes = [len(bundle) for bundle in bundles]
    expected = [] if count == 0 else [1] + [4] * ((count - 1) // 4)
    if count > 1 and (count - 1) % 4:
        expected.append((count - 1) % 4)
    assert sizes == expected


def test_a_bundle_crosses_the_pipe_with_its_small_tensors_by_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport, "get_worker_info", lambda: object())
    batches = [(step, {"tokens": torch.full((8, 8), step)}, [(1, 64)]) for step in range(3)]
    wire = ForkingPickler.dumps(for_transport(Bundle(batches)))
    received = pickle.loads(bytes(wire))
    assert type(received) is Bundle and [step for step, _, _ in received] == [0, 1, 2]
    for step, batch, io in received:
        assert type(batch["tokens"]) is torch.Tensor and not batch["tokens"].is_shared()
        assert batch["tokens"].eq(step).all() and io == [(1, 64)]


def test_workers_hand_out_every_window_once_in_order_through_bundles(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(np.dtype([("tokens", "<i4")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(4 * 200, dtype="<i4")})
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=4, batch_size=3, num_workers=2, shuffle=False,
        head_start=False, drop_last=False,
    )  # fmt: skip
    starts = [int(row[0]) // 4 for batch in loader for row in batch["tokens"]]
    # 200 windows: 67 steps of 3 (the last padded), each worker sending many per message
    assert 2 * BUNDLE_BATCHES < 67 and starts == [*range(200), 0]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["consumed_samples"] == 0
