"""Batches leaving DataLoader workers: small tensors by value, large ones in shared memory,
ordinary tensors in the main process either way."""

from __future__ import annotations

import pickle
from collections import namedtuple
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing  # registers torch's shared-memory reductions

import rangestream.loader.transport as transport
from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.loader import stack_collate
from rangestream.loader.transport import BY_VALUE_MAX_BYTES, for_transport

Pair = namedtuple("Pair", ["inputs", "targets"])


def in_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "get_worker_info", lambda: object())


def through_a_queue(batch: Any) -> Any:
    """What the main process gets: the worker's pickling (torch's reductions) and back."""
    return pickle.loads(bytes(ForkingPickler.dumps(batch)))


def test_small_tensors_cross_by_value_and_arrive_as_writable_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_a_worker(monkeypatch)
    small = torch.arange(64, dtype=torch.int32).reshape(8, 8)
    batch = {"tokens": small, "pair": Pair(small + 1, small + 2), "ids": [small[0], "doc"]}
    wire = ForkingPickler.dumps(for_transport(batch))
    assert len(wire) > small.nbytes  # the bytes travel in the message itself
    got = pickle.loads(bytes(wire))
    assert type(got["tokens"]) is torch.Tensor and not got["tokens"].is_shared()
    assert torch.equal(got["tokens"], small) and got["tokens"].dtype == torch.int32
    assert isinstance(got["pair"], Pair) and torch.equal(got["pair"].targets, small + 2)
    assert torch.equal(got["ids"][0], small[0]) and got["ids"][1] == "doc"
    got["tokens"][0, 0] = -1  # writable, and its own memory
    assert small[0, 0] == 0


def test_tensors_the_by_value_path_does_not_fit_keep_torch_s_own_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_a_worker(monkeypatch)
    large = torch.zeros(BY_VALUE_MAX_BYTES // 4 + 1, dtype=torch.int32)
    others = {
        "large": large,
        "bfloat16": torch.zeros(4, dtype=torch.bfloat16),  # numpy has no bfloat16
        "strided": torch.arange(16).reshape(4, 4).t(),
        "grad": torch.zeros(3, requires_grad=True),
    }
    wrapped = for_transport(others)
    assert all(wrapped[name] is tensor for name, tensor in others.items())
    assert through_a_queue({"large": large})["large"].is_shared()


def test_outside_a_worker_the_batch_is_returned_untouched() -> None:
    batch = {"tokens": torch.zeros(4)}
    assert for_transport(batch) is batch


def test_stacked_batches_are_shared_only_above_the_by_value_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_a_worker(monkeypatch)
    monkeypatch.setattr("rangestream.loader.collate.share_in_worker", transport.share_in_worker)
    small = stack_collate([np.zeros(16, np.int32)] * 8)
    large = stack_collate([np.zeros(BY_VALUE_MAX_BYTES // 4, np.int32)] * 2)
    assert not small.is_shared() and large.is_shared()


def test_a_loader_with_workers_yields_plain_tensors_of_either_size(tmp_path: Path) -> None:
    dtype = np.dtype([("tokens", "<i4")])
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(dtype))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(600_000, dtype="<i4")})
    for sequence_length, shared in [(64, False), (BY_VALUE_MAX_BYTES // 4, True)]:
        loader = StatefulDataLoader.from_storage(
            storage, sequence_length=sequence_length, batch_size=2, num_workers=2,
            shuffle=False, head_start=False,  # every batch crosses from a worker
        )  # fmt: skip
        batches = [batch["tokens"] for _, batch in zip(range(4), loader, strict=False)]
        for number, tokens in enumerate(batches):
            assert type(tokens) is torch.Tensor and tokens.is_shared() == shared
            first = number * 2 * sequence_length
            expected = torch.arange(first, first + 2 * sequence_length, dtype=torch.int32)
            assert torch.equal(tokens.reshape(-1), expected)
