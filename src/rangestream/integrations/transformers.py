"""A Hugging Face ``Trainer`` fed by a rangestream :class:`~rangestream.loader.StatefulDataLoader`.

Why a subclass: given a loader, ``transformers.Trainer`` resumes a checkpoint by rebuilding a
DataLoader from ``loader.dataset`` and iterating the batches it already trained on
(accelerate's ``skip_first_batches``): every skipped batch is read again, over object storage
minutes of requests for a late checkpoint. The loader knows its position exactly and
resumes from it without reading anything it skips, so this Trainer

* returns the loader itself from :meth:`Trainer.get_train_dataloader` (its batches are
  built and collated in its workers; the Trainer moves them to the device);
* writes the loader's ``state_dict()`` (plain data, as JSON) into every checkpoint
  directory, before ``trainer_state.json`` marks the checkpoint complete;
* on ``train(resume_from_checkpoint=...)`` loads that state into the loader (which checks
  that it describes the same data and order) and turns the Trainer's batch skipping into
  a no-op for this loader, after checking that the loader stands where the Trainer
  resumes: the Trainer's step counters stay its own, nothing is re-read.

Import this module only with ``transformers`` installed (``pip install
rangestream[integrations]``); ``rangestream.integrations`` itself does not import it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import transformers
import transformers.trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.dataloader import StatefulDataLoader

__all__ = ["LOADER_STATE_NAME", "Trainer", "load_loader_state", "save_loader_state"]

LOADER_STATE_NAME = "rangestream_loader.json"
"""The loader's state in a checkpoint directory (``StatefulDataLoader.state_dict()``)."""


def save_loader_state(loader: StatefulDataLoader, checkpoint_dir: str | os.PathLike[str]) -> str:
    """Write ``loader.state_dict()`` into ``checkpoint_dir`` as JSON, atomically (a
    checkpoint killed while writing keeps no half state); returns the file's path."""
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = os.path.join(checkpoint_dir, LOADER_STATE_NAME)
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as file:
        json.dump(loader.state_dict(), file, indent=1, sort_keys=True)
    os.replace(partial, path)
    return path


def load_loader_state(loader: StatefulDataLoader, checkpoint_dir: str | os.PathLike[str]) -> None:
    """Load the state :func:`save_loader_state` wrote into ``checkpoint_dir``."""
    path = os.path.join(checkpoint_dir, LOADER_STATE_NAME)
    if not os.path.isfile(path):
        raise StateError(
            f"checkpoint {os.fspath(checkpoint_dir)!r} has no {LOADER_STATE_NAME}: it was not "
            "saved by rangestream.integrations.transformers.Trainer, so where the loader "
            "stood is unknown; resume from a checkpoint this Trainer saved"
        )
    with open(path, encoding="utf-8") as file:
        loader.load_state_dict(json.load(file))


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` trained from a rangestream loader, resumed exactly.

    Parameters
    ----------
    *args, **kwargs
        As for ``transformers.Trainer``, without ``train_dataset`` (the loader is the
        training data).
    train_loader : StatefulDataLoader
        The training batches, e.g. ``StatefulDataLoader.from_storage(storage,
        CausalLMCollate(), sequence_length=1024, batch_size=8)``: its batch keys are what
        the model's ``forward`` takes. Its batch size is the per-device batch size (the
        ``per_device_train_batch_size`` argument is set to it); its
        ``num_workers`` and other process options replace the ``dataloader_*`` arguments.

    Notes
    -----
    Every checkpoint holds the loader's state in ``rangestream_loader.json``; resuming
    (``trainer.train(resume_from_checkpoint=True)`` or a path) restores it, so the batches
    after the checkpoint are exactly those the uninterrupted run trained on, and no batch
    before it is read again. Leave ``ignore_data_skip`` at its default (``False``): the
    skip costs nothing here, and it keeps the Trainer's step counters where they were.
    """

    def __init__(self, *args: Any, train_loader: StatefulDataLoader, **kwargs: Any) -> None:
        if not isinstance(train_loader, StatefulDataLoader):
            raise LoaderConfigError(
                "rangestream Trainer needs train_loader=, a rangestream StatefulDataLoader "
                f"(e.g. StatefulDataLoader.from_storage), got {type(train_loader).__name__}"
            )
        if kwargs.get("train_dataset") is not None or len(args) > 3:
            raise LoaderConfigError(
                "pass the training data as train_loader= only, not also a train_dataset"
            )
        super().__init__(*args, **kwargs)
        if self.args.auto_find_batch_size:
            raise LoaderConfigError(
                "auto_find_batch_size would rebuild the training DataLoader with another "
                "batch size; with train_loader= the batch size is the loader's"
            )
        self.train_loader = train_loader
        # the per-device batch size is the loader's: the Trainer's logs, its sample counts
        # and the checkpoint's train_batch_size say so
        self._train_batch_size = train_loader.dataset.options.batch_size
        self.args.per_device_train_batch_size = self._train_batch_size

    # -- data ----------------------------------------------------------------------------

    def get_train_dataloader(self) -> StatefulDataLoader:  # type: ignore[override]
        """The loader itself: not rebuilt by accelerate, which would iterate its dataset
        outside it (no position kept) and, with several processes, shard what the loader
        already shards by rank."""
        return self.train_loader

    def num_examples(self, dataloader: Any) -> int:
        """Samples per epoch for the Trainer's logs (the loader's dataset counts batches)."""
        if dataloader is self.train_loader:
            return int(self.train_loader.dataset.num_samples())
        return int(super().num_examples(dataloader))

    # -- checkpoints ---------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write the loader's state into the checkpoint directory first, then the rest
        (``trainer_state.json``, written last, marks the checkpoint complete)."""
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            save_loader_state(
                self.train_loader, os.path.join(self._get_output_dir(trial=trial), folder)
            )
        super()._save_checkpoint(model, trial)

    def train(  # type: ignore[override]
        self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        """``transformers.Trainer.train``, the loader restored from the checkpoint first."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"No valid checkpoint found in output directory ({self.args.output_dir})"
                )
        if resume_from_checkpoint:
            load_loader_state(self.train_loader, resume_from_checkpoint)
        return super().train(resume_from_checkpoint or None, *args, **kwargs)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        with _positioned_loader_skips_nothing(self.train_loader, kwargs.get("epoch")):
            return super()._run_epoch(*args, **kwargs)


@contextlib.contextmanager
def _positioned_loader_skips_nothing(
    loader: StatefulDataLoader, epoch: int | None
) -> Iterator[None]:
    """Within the block, the Trainer's ``skip_first_batches(loader, n)`` returns ``loader``
    unchanged: it already stands ``n`` batches into the epoch (restored from the
    checkpoint), which is checked. Other DataLoaders are skipped as the Trainer does.

    ``Trainer._run_epoch`` calls the name ``skip_first_batches`` of ``transformers.trainer``
    (accelerate's); it is replaced for this call only and restored after.
    """
    original = transformers.trainer.skip_first_batches

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if dataloader is not loader:
            return original(dataloader, num_batches)
        consumed = loader.consumed_samples
        expected = num_batches * loader.dataset.options.global_batch_size
        if consumed != expected or (epoch is not None and loader.epoch != epoch):
            raise StateError(
                f"the Trainer resumes {num_batches} batches into epoch {epoch}, but the "
                f"loader's state stands at epoch {loader.epoch}, consumed_samples={consumed} "
                f"(expected {expected} "
                "for this batch size and world size): the checkpoint's loader state and "
                "trainer state disagree"
            )
        return loader

    transformers.trainer.skip_first_batches = skip_first_batches
    try:
        yield
    finally:
        transformers.trainer.skip_first_batches = original
