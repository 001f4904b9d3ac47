"""The loader's dataset iterated by a DataLoader other than rangestream's: plain batches,
never the loader's internal tagged steps or bundles (accelerate rebuilds a DataLoader from
``loader.dataset`` to skip batches on resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data
import torchdata.stateful_dataloader

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.errors import LoaderConfigError
from rangestream.loader import CausalLMCollate
from rangestream.loader.transport import Bundle


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


def foreign_loader(kind: str, dataset: Any, **kwargs: Any) -> Any:
    """torch's DataLoader or torchdata's StatefulDataLoader (not rangestream's subclass)."""
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **kwargs)
    return torchdata.stateful_dataloader.StatefulDataLoader(dataset, **kwargs)


FOREIGN = ["torch", "torchdata"]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", FOREIGN)
def test_a_foreign_loader_that_batches_again_is_refused_before_any_batch(
    tmp_path: Path, kind: str, num_workers: int
) -> None:
    """Its batch_size would stack whole batches into one, shapes off by a dimension."""
    loader = StatefulDataLoader.from_storage(
        windows(tmp_path / "s"), CausalLMCollate("tokens"), sequence_length=4, batch_size=3,
        shuffle=False,
    )  # fmt: skip
    foreign = foreign_loader(kind, loader.dataset, batch_size=2, num_workers=num_workers,
                             multiprocessing_context="fork" if num_workers else None)  # fmt: skip
    with pytest.raises(LoaderConfigError, match="batch_size=None") as refused:
        next(iter(foreign))  # the first batch asked for: none is made
    assert "StatefulDataLoader" in str(refused.value)  # the other fix it names


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", FOREIGN)
def test_a_foreign_loader_without_batch_size_yields_model_batches_not_bundles(
    tmp_path: Path, kind: str, num_workers: int
) -> None:
    loader = StatefulDataLoader.from_storage(
        windows(tmp_path / "s"), CausalLMCollate("tokens"), sequence_length=4, batch_size=3,
        num_workers=2, shuffle=False,
    )  # fmt: skip
    foreign = foreign_loader(kind, loader.dataset, batch_size=None, num_workers=num_workers,
                             multiprocessing_context="fork" if num_workers else None)  # fmt: skip
    batches = list(foreign)
    assert len(batches) == 60 // 3
    for batch in batches:
        assert type(batch) is dict and sorted(batch) == ["input_ids", "labels"]
        assert all(type(v) is torch.Tensor and v.shape == (3, 4) for v in batch.values())
        assert batch["input_ids"].dtype == torch.int64
        assert not any(isinstance(v, Bundle) for v in batch.values())
    # every window of the epoch once, as written: window w holds tokens 4w .. 4w + 3
    got = sorted(row.tolist() for batch in batches for row in batch["input_ids"])
    assert got == [list(range(4 * w, 4 * w + 4)) for w in range(60)]
