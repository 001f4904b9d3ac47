"""AstrAI's seq / sft keys on a structured stream, through the loader with next_token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import CollateError
from rangestream.loader import NextTokenCollate, StatefulDataLoader

SFT = np.dtype([("sequence", "<i4"), ("loss_mask", "u1"), ("position_ids", "<i4")])


def test_sft_windows_become_inputs_shifted_targets_and_aligned_fields(tmp_path: Path) -> None:
    total = 1_000
    sequence = np.arange(total, dtype="<i4")
    loss_mask = (sequence % 3 == 0).astype("u1")
    position_ids = (sequence % 17).astype("<i4")
    storage = StreamStorage(tmp_path / "sft", StreamNumpyFormat(SFT))
    with storage.sync_writer() as writer:
        for start in range(0, total, 100):
            writer.append(
                0,
                {
                    "sequence": sequence[start : start + 100],
                    "loss_mask": loss_mask[start : start + 100],
                    "position_ids": position_ids[start : start + 100],
                },
            )
    loader = StatefulDataLoader.from_storage(
        storage,
        NextTokenCollate("sequence"),
        sequence_length=16,
        next_token=True,
        batch_size=4,
        num_workers=0,
        shuffle=False,
    )
    batches = list(loader)
    assert len(batches) == ((total - 1) // 16) // 4
    for b, batch in enumerate(batches):
        starts = (np.arange(4) + 4 * b) * 16
        rows = starts[:, None] + np.arange(16)
        assert torch.equal(batch["input_ids"], torch.from_numpy(sequence[rows]))
        assert torch.equal(batch["target_ids"], torch.from_numpy(sequence[rows + 1]))
        assert torch.equal(batch["loss_mask"], torch.from_numpy(loss_mask[rows + 1]))
        assert torch.equal(batch["position_ids"], torch.from_numpy(position_ids[rows]))


def test_windows_without_the_extra_token_are_refused() -> None:
    windows = [{"tokens": np.arange(1)}, {"tokens": np.arange(1)}]
    with pytest.raises(CollateError, match="next_token=True"):
        NextTokenCollate()(windows)
