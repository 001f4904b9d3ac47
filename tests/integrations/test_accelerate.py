"""``rangestream.integrations.accelerate.Accelerator`` with real accelerate (CPU): a tiny
model trained from a loader (local disk and S3, two forked workers), ``save_state`` after
K steps, fresh objects ``load_state`` and continue: the batches and losses after the
checkpoint are the uninterrupted run's. The stock ``Accelerator`` refuses the loader in
``prepare()`` at once, naming ``register_for_checkpointing``; the glue it names (the loader
kept out of ``prepare()``, registered by hand) resumes exactly too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import accelerate
import numpy as np
import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DataLoaderConfiguration, send_to_device
from support.s3 import Location

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.errors import LoaderConfigError, StateError
from rangestream.integrations.accelerate import Accelerator, DeviceLoader
from rangestream.loader import CausalLMCollate

VOCAB, LENGTH, BATCH = 32, 8, 4
STEPS, SAVE_AT = 10, 4
WINDOWS = STEPS * BATCH  # one epoch is the whole run


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Iterator[None]:
    """Every Accelerator of a test starts from accelerate's process state anew, as in a
    new process (accelerate keeps it in class-level singletons)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def write_tokens(location: Location) -> np.ndarray:
    tokens = np.random.default_rng(3).integers(0, VOCAB, WINDOWS * LENGTH, dtype="<u2")
    storage = StreamStorage(location.url, StreamNumpyFormat(np.dtype([("tokens", "<u2")])),
                            storage_options=location.storage_options)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    return tokens


def make_loader(location: Location, **process: Any) -> StatefulDataLoader:
    storage = StreamStorage(location.url, storage_options=location.storage_options)
    return StatefulDataLoader.from_storage(
        storage, CausalLMCollate("tokens"), sequence_length=LENGTH, batch_size=BATCH, **process
    )


class TinyLM(torch.nn.Module):
    """Embedding and a projection: enough for a next-token loss and an optimizer state."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))[:, :-1]
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1)
        )


def train(
    loader: StatefulDataLoader, *, steps: int, save: Path | None = None, load: Path | None = None
) -> tuple[list[torch.Tensor], list[float]]:
    """What a user writes: prepare, (load_state), train ``steps`` steps, (save_state).
    Returns the input ids of every step, as the model saw them, and the losses."""
    accelerator = Accelerator()
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer, batches = accelerator.prepare(model, optimizer, loader)
    assert isinstance(batches, DeviceLoader) and batches.loader is loader
    if load is not None:
        accelerator.load_state(load)
    seen: list[torch.Tensor] = []
    losses: list[float] = []
    for batch in batches:
        assert batch["input_ids"].device == accelerator.device
        assert batch["input_ids"].dtype == torch.int64
        seen.append(batch["input_ids"].clone())
        loss = model(**batch)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if len(seen) == steps:
            break
    if save is not None:
        accelerator.save_state(save)
    return seen, losses


def test_save_state_and_load_state_resume_the_uninterrupted_runs_batches(
    location: Location, tmp_path: Path
) -> None:
    tokens = write_tokens(location)
    process = {"num_workers": 2, "multiprocessing_context": "fork"}
    uninterrupted, expected_losses = train(make_loader(location, **process), steps=STEPS)
    assert len(uninterrupted) == STEPS
    windows = sorted(w.tolist() for b in uninterrupted for w in b)  # the epoch, each once
    assert windows == sorted(tokens.reshape(WINDOWS, LENGTH).astype(np.int64).tolist())

    checkpoint = tmp_path / "checkpoint"
    first, _ = train(make_loader(location, **process), steps=SAVE_AT, save=checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, first, strict=False))
    saved = torch.load(checkpoint / "custom_checkpoint_0.pkl", weights_only=False)
    assert saved["consumed_samples"] == SAVE_AT * BATCH

    fresh = make_loader(location, **process)
    resumed, losses = train(fresh, steps=STEPS, load=checkpoint)
    assert len(resumed) == STEPS - SAVE_AT  # the rest of the epoch, then the loop ends
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[SAVE_AT:], resumed, strict=True))
    assert losses == expected_losses[SAVE_AT:]  # model and optimizer restored with it
    assert fresh.epoch == 1 and fresh.consumed_samples == 0


def test_skip_first_batches_after_load_state_returns_the_positioned_loader(
    tmp_path: Path,
) -> None:
    location = Location(url=str(tmp_path / "data"), storage_options={})
    write_tokens(location)
    train(make_loader(location), steps=SAVE_AT, save=tmp_path / "checkpoint")
    accelerator = Accelerator()
    batches = accelerator.prepare(make_loader(location))
    accelerator.load_state(tmp_path / "checkpoint")
    assert accelerator.skip_first_batches(batches, SAVE_AT) is batches  # nothing read
    with pytest.raises(StateError, match="consumed_samples=16"):
        accelerator.skip_first_batches(batches, SAVE_AT + 1)
    assert accelerator.prepare(batches) is batches
    assert accelerator._custom_objects == [batches.loader]  # registered once


@pytest.mark.parametrize("stateful", [False, True], ids=["default", "use_stateful_dataloader"])
def test_the_stock_accelerator_refuses_the_loader_in_prepare_naming_the_fix(
    tmp_path: Path, stateful: bool
) -> None:
    location = Location(url=str(tmp_path / "data"), storage_options={})
    write_tokens(location)
    loader = make_loader(location, num_workers=2, multiprocessing_context="fork")
    config = DataLoaderConfiguration(use_stateful_dataloader=stateful)
    accelerator = accelerate.Accelerator(dataloader_config=config)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(LoaderConfigError, match="register_for_checkpointing") as refused:
        accelerator.prepare(model, optimizer, loader)
    assert "rangestream.integrations.accelerate.Accelerator" in str(refused.value)
    assert accelerator._dataloaders == [] and loader.consumed_samples == 0  # nothing began


def test_the_glue_the_refusal_names_resumes_exactly_with_the_stock_accelerator(
    tmp_path: Path,
) -> None:
    """The loader kept out of ``prepare()``, registered for checkpointing by hand."""
    location = Location(url=str(tmp_path / "data"), storage_options={})
    write_tokens(location)
    everything = [b["input_ids"] for b in make_loader(location)]
    seen: list[torch.Tensor] = []
    for load in (False, True):
        accelerator = accelerate.Accelerator()
        loader = make_loader(location)
        accelerator.register_for_checkpointing(loader)
        if load:
            accelerator.load_state(tmp_path / "checkpoint")
        for step, batch in enumerate(loader, 1):
            seen.append(send_to_device(batch, accelerator.device)["input_ids"])
            if not load and step == SAVE_AT:
                accelerator.save_state(tmp_path / "checkpoint")
                break
    assert len(seen) == STEPS
    assert all(torch.equal(a, b) for a, b in zip(everything, seen, strict=True))


@pytest.mark.parametrize("option", ["split_batches", "dispatch_batches"])
def test_batch_splitting_and_dispatching_are_refused(tmp_path: Path, option: str) -> None:
    """Each rank reads its own batch: accelerate splitting one batch across processes, or
    reading all on rank 0, would change what a rank trains on."""
    location = Location(url=str(tmp_path / "data"), storage_options={})
    write_tokens(location)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**{option: True}))
    with pytest.raises(LoaderConfigError, match=option):
        accelerator.prepare(make_loader(location))


def test_other_dataloaders_are_prepared_as_accelerate_does() -> None:
    plain = torch.utils.data.DataLoader(torch.arange(12), batch_size=4)
    prepared = Accelerator().prepare(plain)
    assert isinstance(prepared, accelerate.data_loader.DataLoaderShard)
    assert [b.tolist() for b in prepared] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
