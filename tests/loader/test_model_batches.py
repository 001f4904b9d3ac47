"""Batches that go straight into a model: int64 token ids, boundaries and keys through
``from_storage``, the varlen, sft and dpo collates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rangestream import (
    DocumentStorage,
    RecordField,
    RecordFormat,
    StatefulDataLoader,
    StreamNumpyFormat,
    StreamStorage,
)
from rangestream.errors import LoaderConfigError
from rangestream.loader import IGNORE_INDEX, DpoCollate, SftCollate, VarlenCollate

RECORDS = [7, 3, 12, 1, 9, 20, 5]  # record lengths; tokens count up from 0


def token_stream(path: Path) -> StreamStorage:
    """The seq preset's layout: one ``uint16`` token field."""
    storage = StreamStorage(path, StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    start = 0
    with storage.sync_writer() as writer:
        for n in RECORDS:
            writer.append(0, {"tokens": np.arange(start, start + n, dtype="<u2")})
            start += n
    return StreamStorage(path)


def record_starts() -> list[int]:
    return np.cumsum([0, *RECORDS])[:-1].tolist()


def test_token_batches_are_int64_by_default_and_keep_the_stored_dtype_when_asked(
    tmp_path: Path,
) -> None:
    storage = token_stream(tmp_path / "s")
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=8, batch_size=2, num_workers=0, shuffle=False
    )
    batch = next(iter(loader))["tokens"]
    assert batch.dtype == torch.int64
    assert batch.tolist() == [list(range(8)), list(range(8, 16))]
    embedding = torch.nn.Embedding(64, 4)
    embedding(batch)  # the first training step takes them as they come
    kept = StatefulDataLoader.from_storage(
        storage, sequence_length=8, batch_size=2, num_workers=0, shuffle=False, token_dtype=None
    )
    assert next(iter(kept))["tokens"].dtype == torch.uint16


def test_boundaries_through_from_storage_reach_the_varlen_collate(tmp_path: Path) -> None:
    storage = token_stream(tmp_path / "s")
    loader = StatefulDataLoader.from_storage(
        storage,
        VarlenCollate(tokens="tokens"),
        sequence_length=8,
        batch_size=2,
        num_workers=0,
        shuffle=False,
        boundaries=True,
    )
    batch = next(iter(loader))
    assert batch["input_ids"].tolist() == [list(range(8)), list(range(8, 16))]
    # records start at 0, 7, 10, 22: over the flattened batch of 16 tokens
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, 7, 8, 10, 16]
    assert batch["max_seqlen"] == 7
    assert batch["position_ids"].tolist() == [
        [0, 1, 2, 3, 4, 5, 6, 0],
        [1, 2, 0, 1, 2, 3, 4, 5],
    ]
    labels = batch["labels"].reshape(-1)
    starts = batch["cu_seqlens"][:-1].tolist()
    assert all(labels[s] == IGNORE_INDEX for s in starts)
    others = [i for i in range(16) if i not in starts]
    assert labels[others].tolist() == batch["input_ids"].reshape(-1)[others].tolist()


def test_varlen_next_token_targets_never_cross_a_record(tmp_path: Path) -> None:
    storage = token_stream(tmp_path / "s")
    loader = StatefulDataLoader.from_storage(
        storage,
        VarlenCollate(tokens="tokens"),
        sequence_length=8,
        next_token=True,
        batch_size=1,
        num_workers=0,
        shuffle=False,
        boundaries=True,
    )
    batch = next(iter(loader))
    assert batch["input_ids"].tolist() == [list(range(8))]
    targets = batch["target_ids"][0].tolist()
    assert targets == [1, 2, 3, 4, 5, 6, IGNORE_INDEX, 8]  # token 7 starts record 2
    assert batch["cu_seqlens"].tolist() == [0, 7, 8]


def test_sft_collate_masks_labels_where_the_loss_mask_is_zero(tmp_path: Path) -> None:
    fields = np.dtype([("sequence", "<u2"), ("loss_mask", "u1"), ("position_ids", "<u2")])
    storage = StreamStorage(tmp_path / "sft", StreamNumpyFormat(fields))
    with storage.sync_writer() as writer:
        tokens = np.arange(10, 26, dtype="<u2")
        writer.append(0, {"sequence": tokens, "loss_mask": (tokens % 3 == 0).astype("u1"),
                          "position_ids": np.arange(16, dtype="<u2")})  # fmt: skip
    loader = StatefulDataLoader.from_storage(
        StreamStorage(tmp_path / "sft"),
        SftCollate(),
        sequence_length=8,
        batch_size=2,
        num_workers=0,
        shuffle=False,
    )
    batch = next(iter(loader))
    ids = torch.arange(10, 26).reshape(2, 8)
    assert batch["input_ids"].tolist() == ids.tolist()
    assert batch["labels"].tolist() == torch.where(ids % 3 == 0, ids, -100).tolist()
    assert batch["attention_mask"].tolist() == [[1] * 8] * 2
    assert batch["position_ids"].tolist() == [list(range(8)), list(range(8, 16))]
    loss = torch.nn.functional.cross_entropy(torch.zeros(16, 32), batch["labels"].reshape(-1))
    assert torch.isfinite(loss)


def test_dpo_records_pad_per_side_with_labels_on_the_answers_only(tmp_path: Path) -> None:
    fields = [RecordField(name, np.dtype("<u2" if "mask" not in name else "u1"))
              for name in ("chosen", "rejected", "chosen_mask", "rejected_mask")]  # fmt: skip
    storage = DocumentStorage(tmp_path / "dpo", RecordFormat(fields))
    pairs = [(4, 2), (3, 5)]
    with storage.sync_writer() as writer:
        for c, r in pairs:
            writer.append(0, {
                "chosen": np.arange(1, c + 1, dtype="<u2"),
                "rejected": np.arange(11, r + 11, dtype="<u2"),
                "chosen_mask": np.r_[np.zeros(1), np.ones(c - 1)].astype("u1"),
                "rejected_mask": np.ones(r, dtype="u1"),
            })  # fmt: skip
    loader = StatefulDataLoader.from_storage(
        DocumentStorage(tmp_path / "dpo"),
        DpoCollate(pad_id=0),
        batch_size=2,
        num_workers=0,
        shuffle=False,
    )
    batch = next(iter(loader))
    assert batch["chosen_input_ids"].tolist() == [[1, 2, 3, 4], [1, 2, 3, 0]]
    assert batch["chosen_labels"].tolist() == [[-100, 2, 3, 4], [-100, 2, 3, -100]]
    assert batch["chosen_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["rejected_input_ids"].shape == (2, 5)
    assert batch["rejected_labels"][0].tolist() == [11, 12, -100, -100, -100]
    keys = StatefulDataLoader.from_storage(
        DocumentStorage(tmp_path / "dpo"),
        batch_size=1,
        num_workers=0,
        shuffle=False,
        keys=["chosen"],
        collate_fn=list,
    )
    (record,) = next(iter(keys))
    assert set(record) == {"chosen"} and record["chosen"].dtype == np.int64


def test_options_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    storage = token_stream(tmp_path / "s")
    with pytest.raises(LoaderConfigError, match="keys"):
        StatefulDataLoader.from_storage(storage, sequence_length=8, keys=["x"], num_workers=0)
    with pytest.raises(LoaderConfigError, match="token_dtype"):
        StatefulDataLoader.from_storage(
            storage, sequence_length=8, token_dtype="float32", num_workers=0
        )
