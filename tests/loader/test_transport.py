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


@pytest.mark.parametrize(
    ("dtype", "low", "high", "itemsize"),
    [
        (torch.int64, 0, 50_256, 2),  # GPT-2 token ids: uint16
        (torch.int64, 0, 255, 1),
        (torch.int64, -100, 30_000, 2),  # int16
        (torch.int64, -5, 70_000, 4),  # int32
        (torch.int64, 0, 2**40, 8),  # nothing narrower holds it
        (torch.int32, 0, 50_000, 2),
        (torch.int32, -40_000, 5, 4),  # int32 is as narrow as it gets
    ],
)
def test_wide_integer_tensors_cross_in_the_narrowest_dtype_that_holds_their_values(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, low: int, high: int, itemsize: int
) -> None:
    """The message carries ``itemsize`` bytes per element (counted in the pickled bytes),
    the main process gets the tensor in its own dtype with exactly its values."""
    in_a_worker(monkeypatch)
    elements = 8 * 2049
    values = torch.arange(elements, dtype=torch.int64) % (high - low + 1) + low
    values[0], values[-1] = low, high  # the range's two ends
    tensor = values.to(dtype).reshape(8, 2049)
    assert int(tensor.min()) == low and int(tensor.max()) == high
    wire = bytes(ForkingPickler.dumps(for_transport({"input_ids": tensor, "step": 3})))
    assert elements * itemsize <= len(wire) < elements * itemsize + 512
    got = pickle.loads(wire)
    assert got["step"] == 3
    arrived = got["input_ids"]
    assert type(arrived) is torch.Tensor and arrived.dtype == dtype
    assert arrived.shape == tensor.shape and torch.equal(arrived, tensor)
    arrived[0, 0] = -1  # writable, and its own memory
    assert tensor[0, 0] == low


def test_small_or_other_tensors_cross_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    in_a_worker(monkeypatch)
    small = torch.arange(transport.NARROW_MIN_ELEMENTS - 1, dtype=torch.int64)
    floats = torch.arange(4096, dtype=torch.float64)
    short = torch.arange(4096, dtype=torch.int16)  # already narrow
    for tensor in (small, floats, short):
        wire = bytes(ForkingPickler.dumps(for_transport(tensor)))
        assert len(wire) >= tensor.nbytes
        got = pickle.loads(wire)
        assert got.dtype == tensor.dtype and torch.equal(got, tensor)


@pytest.mark.parametrize("stored", ["<u2", "<i4"])
def test_a_loader_with_workers_hands_out_int64_token_ids_of_narrow_storage(
    tmp_path: Path, stored: str
) -> None:
    """Token ids stored as uint16 or int32 cross narrowed and arrive as the int64 the
    loader's batches are documented to hold, with exactly the stored values."""
    dtype = np.dtype([("tokens", stored)])
    tokens = (np.arange(40_000) * 7919 % 50_257).astype(stored)
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(dtype))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=1024, batch_size=2, num_workers=2,
        shuffle=False, head_start=False,  # every batch crosses from a worker
    )  # fmt: skip
    batches = [batch["tokens"] for batch in loader]
    assert len(batches) == 40_000 // 1024 // 2
    for number, batch in enumerate(batches):
        assert batch.dtype == torch.int64 and tuple(batch.shape) == (2, 1024)
        first = number * 2 * 1024
        expected = tokens[first : first + 2 * 1024].astype(np.int64).reshape(2, 1024)
        np.testing.assert_array_equal(batch.numpy(), expected)
