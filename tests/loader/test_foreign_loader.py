"""The loader's dataset iterated by a DataLoader other than rangestream's: plain batches,
never the loader's internal tagged steps or bundles (accelerate rebuilds a DataLoader from
``loader.dataset`` to skip batches on resume)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage


def windows(path: Path) -> StreamStorage:
    storage = StreamStorage(path, StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(4 * 60, dtype="<u2")})
    return StreamStorage(path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_dataloader_over_the_loaders_dataset_yields_the_same_batches(
    tmp_path: Path, num_workers: int
) -> None:
    loader = StatefulDataLoader.from_storage(
        windows(tmp_path / "s"), sequence_length=4, batch_size=3, num_workers=2, shuffle=False
    )
    ours = [batch["tokens"] for batch in loader]
    plain = torch.utils.data.DataLoader(loader.dataset, batch_size=None, num_workers=num_workers)
    theirs = list(plain)
    assert all(isinstance(batch, dict) for batch in theirs)  # no tuple, no Bundle
    got = sorted(batch["tokens"][:, 0].tolist() for batch in theirs)
    assert got == sorted(batch[:, 0].tolist() for batch in ours)
    assert [b["tokens"].tolist() for b in loader] == [b.tolist() for b in ours]  # ours still
