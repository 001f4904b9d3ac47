"""An ``accelerate.Accelerator`` that prepares a rangestream loader without rebuilding it.

Why a subclass: ``accelerate.Accelerator.prepare`` rebuilds every DataLoader it is given
from ``loader.dataset`` (``DataLoaderShard``, or ``DataLoaderDispatcher`` for an iterable
dataset): the rebuilt loader keeps no position, so ``save_state``/``load_state`` cannot
resume it, and with several processes it shards (or dispatches from rank 0) what the
rangestream loader already shards by rank. The plain ``Accelerator`` is therefore refused
at once, with an error naming this class and ``register_for_checkpointing``. This
Accelerator instead

* returns a :class:`DeviceLoader` for a rangestream loader: the loader's own batches, in
  its order, each moved to ``accelerator.device`` (unless ``device_placement=False``);
* registers the loader with ``register_for_checkpointing``, so ``save_state`` writes its
  ``state_dict()`` (``custom_checkpoint_<i>.pkl``, written by the main process: every
  rank holds the same position) and ``load_state`` restores it exactly, without reading
  any batch it skips;
* makes ``skip_first_batches`` a checked no-op for such a loader (after ``load_state``
  it already stands there).

Everything else (models, optimizers, schedulers, other DataLoaders) is prepared as
``accelerate.Accelerator`` does. Import this module only with ``accelerate`` installed
(``pip install rangestream[integrations]``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import accelerate
import torch
from accelerate.utils import DistributedType, send_to_device

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.dataloader import StatefulDataLoader

__all__ = ["Accelerator", "DeviceLoader"]


class DeviceLoader:
    """A rangestream loader whose batches are moved to a device: what
    :meth:`Accelerator.prepare` returns for it.

    Iterating it iterates :attr:`loader` (one ``for`` loop is one epoch, a ``break``
    keeps the position, as for the loader); any other attribute (``state_dict``,
    ``set_epoch``, ``epoch``, ``consumed_samples``, ``stall_stats`` ...) is the loader's.
    """

    #: accelerate's mark of a prepared object: preparing this again returns it unchanged.
    _is_accelerate_prepared = True

    def __init__(
        self, loader: StatefulDataLoader, device: torch.device | None, non_blocking: bool = False
    ) -> None:
        self.loader = loader
        #: Where batches go (``None``: left where the loader's workers built them).
        self.device = device
        self.non_blocking = bool(non_blocking)

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.loader)
        if self.device is None:
            return batches
        return (send_to_device(b, self.device, non_blocking=self.non_blocking) for b in batches)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"DeviceLoader({self.loader!r}, device={self.device})"


class Accelerator(accelerate.Accelerator):
    """``accelerate.Accelerator`` that keeps rangestream loaders and checkpoints them.

    Use it as accelerate's own::

        accelerator = Accelerator()
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        ...
        accelerator.save_state(directory)   # the loader's position included
        accelerator.load_state(directory)   # in a new run, after prepare()

    A rangestream loader's ``batch_size`` is the batch of one process (each rank reads
    its own share), so ``split_batches=True`` and ``dispatch_batches=True`` are refused
    for it. Its batches carry no end-of-epoch look-ahead: with gradient accumulation,
    gradients sync every ``gradient_accumulation_steps`` steps.
    """

    def prepare_data_loader(
        self,
        data_loader: Any,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Any = None,
    ) -> Any:
        """A :class:`DeviceLoader` over a rangestream loader (registered for
        checkpointing once); any other DataLoader as accelerate prepares it."""
        if isinstance(data_loader, DeviceLoader):
            return data_loader
        if not isinstance(data_loader, StatefulDataLoader):
            return super().prepare_data_loader(
                data_loader, device_placement, slice_fn_for_dispatch=slice_fn_for_dispatch
            )
        if self.split_batches:
            raise LoaderConfigError(
                "split_batches=True splits one batch across processes, but a rangestream "
                "loader's batch_size is already one process's batch (each rank reads its "
                "own share); leave split_batches off and set the per-process batch_size"
            )
        if self.dispatch_batches:
            raise LoaderConfigError(
                "dispatch_batches=True reads every batch on the main process and sends "
                "slices to the others, but each rank of a rangestream loader reads its own "
                "share; leave dispatch_batches unset"
            )
        if device_placement is None:
            device_placement = (
                self.device_placement if self.distributed_type != DistributedType.XLA else False
            )
        if not any(obj is data_loader for obj in self._custom_objects):
            self.register_for_checkpointing(data_loader)
        device = self.device if device_placement else None
        return DeviceLoader(data_loader, device, non_blocking=self.non_blocking)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """For a rangestream loader, the loader itself, after checking it stands
        ``num_batches`` into its epoch (``load_state`` put it there; nothing is read to
        skip). Other DataLoaders are skipped as accelerate does."""
        loader = dataloader.loader if isinstance(dataloader, DeviceLoader) else dataloader
        if not isinstance(loader, StatefulDataLoader):
            return super().skip_first_batches(dataloader, num_batches)
        expected = num_batches * loader.dataset.options.global_batch_size
        if loader.consumed_samples != expected:
            raise StateError(
                f"skip_first_batches({num_batches}) expects the loader {expected} samples "
                f"into epoch {loader.epoch}, but it stands at consumed_samples="
                f"{loader.consumed_samples}: a rangestream loader resumes from its own "
                "state (load_state restores it), so iterate it without skipping"
            )
        return dataloader
