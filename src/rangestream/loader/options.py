"""How batches are cut and delivered: one value object, validated once, passed whole.

Every loader dataset needs the same handful of settings (samples per batch, this rank and
the number of ranks, the end-of-epoch policy, the read-ahead budget, the collate function).
They live in :class:`BatchOptions`, checked when it is made, so no other signature restates
them and no other place validates them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed

from rangestream.arguments import integer, positive_integer
from rangestream.errors import LoaderConfigError
from rangestream.loader.collate import stack_collate
from rangestream.loader.reading.batches import DEFAULT_PREFETCH

__all__ = ["DEFAULT_PREFETCH", "BatchOptions", "Collate", "resolve_distributed"]

Collate = Callable[[list[Any]], Any]


def resolve_distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill in ``rank`` and ``world_size`` from ``torch.distributed`` when left as ``None``.

    Parameters
    ----------
    rank, world_size : int or None
        Explicit values win; ``None`` takes the initialised process group's value, or
        ``0`` / ``1`` without one.

    Returns
    -------
    tuple of int
        ``(rank, world_size)``, validated.
    """
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    world_size = positive_integer(world_size, "world_size", error=LoaderConfigError)
    rank = integer(rank, "rank", error=LoaderConfigError)
    if not 0 <= rank < world_size:
        raise LoaderConfigError(f"rank must lie in [0, world_size={world_size}), got {rank!r}")
    return rank, world_size


@dataclass(frozen=True)
class BatchOptions:
    """How one rank's batches are cut from the epoch's order and handed over.

    Parameters
    ----------
    batch_size : int, default 8
        Samples per batch on each rank.
    rank, world_size : int or None
        This rank and the number of ranks; ``None`` reads the initialised
        ``torch.distributed`` process group (else 0 and 1). Resolved when the options are
        made, so the values are fixed from then on.
    drop_last : bool, default True
        Skip the incomplete last global batch, or pad it by wrapping around to the start of
        the epoch's order (see :mod:`rangestream.loader.orders.sequence_plan`).
    prefetch : int, optional
        Samples in flight per worker; by default two stretches of sequential windows
        (about 8 MiB), else :data:`DEFAULT_PREFETCH`.
    collate_fn : callable, optional
        Builds a batch from a list of samples, inside the worker; defaults to
        :func:`rangestream.loader.stack_collate`.
    """

    batch_size: int = 8
    rank: int | None = None
    world_size: int | None = None
    drop_last: bool = True
    prefetch: int | None = None
    collate_fn: Collate | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "batch_size", positive_integer(self.batch_size, "batch_size",
                                                       error=LoaderConfigError))  # fmt: skip
        if self.prefetch is not None:
            set_field(self, "prefetch", positive_integer(self.prefetch, "prefetch or None",
                                                         error=LoaderConfigError))  # fmt: skip
        rank, world_size = resolve_distributed(self.rank, self.world_size)
        set_field(self, "rank", rank)
        set_field(self, "world_size", world_size)
        set_field(self, "drop_last", bool(self.drop_last))
        if self.collate_fn is None:
            set_field(self, "collate_fn", stack_collate)

    @property
    def global_batch_size(self) -> int:
        """Samples one step consumes across all ranks."""
        return self.batch_size * self.world_size  # type: ignore[operator]
