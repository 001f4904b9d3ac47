"""How batches are cut and delivered: one value object, validated once, passed whole.

Every loader dataset needs the same handful of settings (samples per batch, this rank and
the number of ranks, the end-of-epoch policy, the read-ahead budget, the collate function).
They live in :class:`BatchOptions`, checked when it is made, so no other signature restates
them and no other place validates them. Rank and world size left as ``None`` are filled in
from ``torch.distributed`` when an iteration starts (:meth:`BatchOptions.resolve`), not when
the options are made: a loader built before the process group exists still shards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch.distributed

from rangestream.arguments import integer, positive_integer
from rangestream.errors import LoaderConfigError
from rangestream.loader.collate import stack_collate
from rangestream.loader.reading.batches import DEFAULT_PREFETCH

__all__ = [
    "DEFAULT_PREFETCH",
    "LAUNCHER_VARIABLES",
    "BatchOptions",
    "Collate",
    "launcher_environment",
    "resolve_distributed",
]

Collate = Callable[[list[Any]], Any]


LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
"""What torchrun, Lightning's launchers and accelerate set in every rank's environment."""


def launcher_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher variables set in ``environ`` (``os.environ`` by default), if they say
    this process is one of several ranks; empty otherwise.

    ``WORLD_SIZE`` decides when set (more than 1: distributed); without it, a ``RANK`` or
    ``LOCAL_RANK`` says a launcher started this process as one of several.
    """
    environ = os.environ if environ is None else environ
    seen = {name: environ[name] for name in LAUNCHER_VARIABLES if name in environ}
    world_size = seen.get("WORLD_SIZE")
    if world_size is not None:
        try:
            several = int(world_size) > 1
        except ValueError:
            several = True  # not a count: do not guess one rank
    else:
        several = bool(seen)
    return seen if several else {}


def resolve_distributed(
    rank: int | None, world_size: int | None, *, check_environment: bool = True
) -> tuple[int, int]:
    """Fill in ``rank`` and ``world_size`` from ``torch.distributed`` when left as ``None``.

    Called when an iteration starts (not when the loader is built), so a loader made before
    ``init_process_group`` (in a ``LightningDataModule.__init__``, before
    ``accelerator.prepare``) shards by the real ranks.

    Parameters
    ----------
    rank, world_size : int or None
        Explicit values win; ``None`` takes the initialised process group's value, or
        ``0`` / ``1`` without one.
    check_environment : bool, default True
        Refuse to fill in ``0`` / ``1`` when the launcher's variables (``WORLD_SIZE``,
        ``RANK``, ``LOCAL_RANK``) say this is one of several ranks: every rank would read
        the whole epoch, silently.

    Returns
    -------
    tuple of int
        ``(rank, world_size)``, validated.

    Raises
    ------
    LoaderConfigError
        The environment says distributed but no process group is initialised.
    """
    if rank is None or world_size is None:
        initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
        if initialised:
            world_size = torch.distributed.get_world_size() if world_size is None else world_size
            rank = torch.distributed.get_rank() if rank is None else rank
        else:
            seen = launcher_environment() if check_environment else {}
            if seen:
                variables = ", ".join(f"{name}={value}" for name, value in seen.items())
                raise LoaderConfigError(
                    f"the environment says this process is one of several ranks ({variables}) "
                    "but no torch.distributed process group exists as the loader starts "
                    "iterating: call torch.distributed.init_process_group() before iterating "
                    "(the loader may be built before it), or pass rank= and world_size="
                )
            world_size = 1 if world_size is None else world_size
            rank = 0 if rank is None else rank
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
        ``torch.distributed`` process group (else 0 and 1) when an iteration starts
        (:meth:`resolve`), so options made before ``init_process_group`` shard by the real
        ranks. Explicit values always win.
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
        if self.world_size is not None:
            set_field(self, "world_size", positive_integer(self.world_size, "world_size",
                                                           error=LoaderConfigError))  # fmt: skip
        if self.rank is not None:
            set_field(self, "rank", integer(self.rank, "rank", error=LoaderConfigError))
            if self.world_size is not None and not 0 <= self.rank < self.world_size:
                raise LoaderConfigError(
                    f"rank must lie in [0, world_size={self.world_size}), got {self.rank!r}"
                )
        set_field(self, "drop_last", bool(self.drop_last))
        if self.collate_fn is None:
            set_field(self, "collate_fn", stack_collate)

    @property
    def resolved(self) -> bool:
        """Whether rank and world size are known (given, or filled in by :meth:`resolve`)."""
        return self.rank is not None and self.world_size is not None

    def resolve(self, *, check_environment: bool = True) -> BatchOptions:
        """These options with rank and world size filled in now (:func:`resolve_distributed`);
        ``self`` when both were given."""
        if self.resolved:
            return self
        rank, world_size = resolve_distributed(
            self.rank, self.world_size, check_environment=check_environment
        )
        return replace(self, rank=rank, world_size=world_size)

    @property
    def global_batch_size(self) -> int:
        """Samples one step consumes across all ranks (of resolved options)."""
        if self.world_size is None:
            raise LoaderConfigError("the world size is resolved when iteration starts")
        return self.batch_size * self.world_size
