"""Which samples of an epoch each rank and worker loads, and in which batch.

The epoch is one global sequence: sequence index ``i`` (``0 <= i < num_samples``) names the
``i``-th sample of the epoch's (shuffled) order. The sequence is cut into *global batches* of
``world_size * batch_size`` indices; rank ``r`` takes the contiguous slice
``[r * batch_size, (r + 1) * batch_size)`` of every global batch (as Megatron does). The
DataLoader workers of a rank only share the fetching: *stretches* of ``stretch_steps``
consecutive steps are dealt to the workers in turn (:meth:`EpochPlan.worker_stretches`), and
the batches are put back in step order, by the DataLoader's in-order round robin for
stretches of one step, or by
the step numbers the workers attach (``StatefulDataLoader``). So the order never depends on
``num_workers``.

Progress is one number, ``consumed_samples``: how many sequence indices all ranks together
have consumed this epoch (a multiple of the global batch size of the phase that consumed them).
A plan always starts at ``consumed_samples``, so resuming with another worker count, world
size or batch size just continues the same sequence: the union over ranks of what remains is
exactly what remains of the epoch.

End of epoch
------------
``drop_last=True``
    Every rank takes ``(num_samples - consumed_samples) // global_batch_size`` more steps;
    the final ``remainder`` indices of the sequence are skipped this epoch (they are
    different samples each epoch when shuffling).
``drop_last=False``
    Every rank takes ``ceil((num_samples - consumed_samples) / global_batch_size)`` more
    steps. The last global batch is filled by wrapping around to the start of the epoch's
    order (index ``i`` reads sequence index ``i mod num_samples``), as PyTorch's
    ``DistributedSampler`` pads, so every batch is full, every rank steps the same number of
    times and nobody waits at the epoch end. The wrapped samples are seen twice that epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rangestream.errors import LoaderConfigError, OutOfRangeError

__all__ = ["EpochPlan"]


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise LoaderConfigError(f"EpochPlan {name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class EpochPlan:
    """The remaining steps of one epoch for one rank.

    Parameters
    ----------
    num_samples : int
        Samples in the epoch (windows, documents or drawn temporal windows).
    batch_size : int
        Samples per batch on each rank.
    world_size : int, default 1
        Number of ranks.
    rank : int, default 0
        This rank, in ``[0, world_size)``.
    drop_last : bool, default True
        Skip the incomplete final global batch, or pad it by wrapping around (see module
        docstring).
    consumed_samples : int, default 0
        Sequence indices of this epoch already consumed by all ranks together.
    """

    num_samples: int
    batch_size: int
    world_size: int = 1
    rank: int = 0
    drop_last: bool = True
    consumed_samples: int = 0

    def __post_init__(self) -> None:
        _check_int("num_samples", self.num_samples, 0)
        _check_int("batch_size", self.batch_size, 1)
        _check_int("world_size", self.world_size, 1)
        _check_int("consumed_samples", self.consumed_samples, 0)
        if not 0 <= self.rank < self.world_size:
            raise LoaderConfigError(
                f"EpochPlan rank must lie in [0, world_size={self.world_size}), got {self.rank!r}"
            )

    @property
    def global_batch_size(self) -> int:
        """Samples consumed by one step of all ranks together."""
        return self.batch_size * self.world_size

    @property
    def num_steps(self) -> int:
        """Steps every rank takes from ``consumed_samples`` to the end of the epoch."""
        remaining = self.num_samples - self.consumed_samples
        if self.num_samples == 0 or remaining <= 0:
            return 0
        if self.drop_last:
            return remaining // self.global_batch_size
        return -(-remaining // self.global_batch_size)

    def worker_stretches(
        self, worker_id: int, num_workers: int, stretch_steps: int
    ) -> Iterator[range]:
        """Stretches of consecutive steps that worker ``worker_id`` builds, in its order.

        Stretches of ``stretch_steps`` steps are dealt round robin, so a worker's samples
        are adjacent in storage over a whole stretch (sequential order) and can be read with
        one range request. Stretches of more than one step follow a lead-in of one step per
        worker, so the first batches wait for one batch's read, not a stretch's. With
        ``stretch_steps=1`` a
        worker builds steps ``w, w + W, ...``; with more, and more than one worker, the
        DataLoader's round robin no longer yields steps in order, and whoever consumes the
        batches must put them back in order (as :class:`rangestream.loader.StatefulDataLoader`
        does with the step numbers).
        """
        if not 0 <= worker_id < num_workers:
            raise LoaderConfigError(
                f"worker_id must lie in [0, num_workers={num_workers}), got {worker_id}"
            )
        _check_int("stretch_steps", stretch_steps, 1)
        total = self.num_steps
        lead_in = num_workers if stretch_steps > 1 else 0
        if worker_id < min(lead_in, total):
            yield range(worker_id, worker_id + 1)
        for start in range(lead_in + worker_id * stretch_steps, total, stretch_steps * num_workers):
            yield range(start, min(start + stretch_steps, total))

    def sequence_indices(self, steps: range | np.ndarray) -> np.ndarray:
        """Epoch-sequence indices of this rank's batches at ``steps``.

        Parameters
        ----------
        steps : range or numpy.ndarray
            Step numbers in ``[0, num_steps)``.

        Returns
        -------
        numpy.ndarray
            ``int64`` array shaped ``(len(steps), batch_size)``; values are in
            ``[0, num_samples)`` (padding already wrapped around).
        """
        step_array = np.asarray(steps, dtype=np.int64).reshape(-1)
        if step_array.size and (step_array.min() < 0 or step_array.max() >= self.num_steps):
            raise OutOfRangeError(
                f"steps must lie in [0, {self.num_steps}) for {self!r}, found "
                f"[{step_array.min()}, {step_array.max()}]"
            )
        first = (
            self.consumed_samples
            + step_array * self.global_batch_size
            + self.rank * self.batch_size
        )
        indices = first[:, None] + np.arange(self.batch_size, dtype=np.int64)[None, :]
        return indices % self.num_samples if self.num_samples else indices
