"""Where a loader stands in its epochs: one value, plain data, one owner.

The position is the epoch and the samples of it consumed by all ranks together
(``consumed_samples``, as Megatron-LM counts). The block shuffle's order depends on the
setting it was played with (world size, batch size, workers), so it also keeps the
*phases* of the epoch (:class:`rangestream.loader.orders.phases.EpochPosition`); the per-window
orders need only the count. The dataset owns its :class:`LoaderPosition`;
:class:`rangestream.loader.StatefulDataLoader` advances that same object as it hands out
batches, so there is never a second copy to keep in step.

What persistent DataLoader workers keep between epochs lives here too: they keep the dataset
they were started with, so the loader's position reaches them through shared memory
(:class:`SharedPosition`), written before every ``iter()``; and a worker keeps its reader
open across epochs (:class:`KeptReader`), so that with the opened version kept in its
process a new epoch opens nothing.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, replace
from typing import Any

from rangestream.arguments import integer
from rangestream.errors import StateError
from rangestream.loader.orders.phases import EpochPosition

__all__ = ["MAX_SHARED_PHASES", "KeptReader", "LoaderPosition", "SharedPosition"]


@dataclass(frozen=True)
class LoaderPosition:
    """An epoch and how far into it all ranks together have come.

    Parameters
    ----------
    epoch : int
        The epoch played next (or being played).
    consumed_samples : int
        Samples of ``epoch`` consumed by all ranks together.
    phases : EpochPosition, optional
        The block shuffle's phases of ``epoch`` (settings and steps); ``None`` until a
        block-shuffled epoch takes its first step, and for the per-window orders.
    """

    epoch: int = 0
    consumed_samples: int = 0
    phases: EpochPosition | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "epoch", integer(self.epoch, "epoch", minimum=0, error=StateError))
        consumed = integer(self.consumed_samples, "consumed_samples", minimum=0, error=StateError)
        object.__setattr__(self, "consumed_samples", consumed)
        if self.phases is not None and self.phases.consumed_samples != consumed:
            raise StateError(
                f"position consumed_samples={consumed} disagrees with its phases, which "
                f"consumed {self.phases.consumed_samples}"
            )

    def advanced(self, global_batch_size: int, steps: int = 1) -> LoaderPosition:
        """The position after ``steps`` more steps of ``global_batch_size`` samples."""
        phases = None if self.phases is None else self.phases.advance(steps)
        return replace(
            self,
            consumed_samples=self.consumed_samples + steps * global_batch_size,
            phases=phases,
        )

    def next_epoch(self) -> LoaderPosition:
        return LoaderPosition(self.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "consumed_samples"}``, plus ``"phases"`` for the block shuffle."""
        state: dict[str, Any] = {"epoch": self.epoch, "consumed_samples": self.consumed_samples}
        if self.phases is not None:
            state.update(self.phases.state_dict())
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> LoaderPosition:
        """Inverse of :meth:`state_dict` (values checked: a state is untrusted input)."""
        values = {}
        for key in ("epoch", "consumed_samples"):
            value = state.get(key)
            if type(value) is not int or value < 0:
                raise StateError(f"state {key} must be a non-negative integer, got {value!r}")
            values[key] = value
        phases = EpochPosition.from_state_dict(state) if "phases" in state else None
        return cls(values["epoch"], values["consumed_samples"], phases)


MAX_SHARED_PHASES = 64
"""Phases a shared position carries to persistent workers (each resume with a new setting
adds one; a run that changes its setting more often within one epoch is refused)."""


class SharedPosition:
    """The position, in memory shared with persistent workers (written before each epoch).

    Persistent workers keep the dataset they were started with; the loader writes the
    position here before every ``iter()``, and each worker reads it when its iteration is
    re-created.
    """

    def __init__(self) -> None:
        self._cells = multiprocessing.RawArray("q", 3 + 5 * MAX_SHARED_PHASES)

    def __getstate__(self) -> dict[str, Any]:
        # to a worker being started, the shared memory itself; anywhere else (a loader
        # pickled whole, as Lightning's ddp_spawn sends it), a copy of the values, in memory
        # of the receiving process's own (shared ctypes pickle only into a new child)
        if multiprocessing.context.get_spawning_popen() is not None:
            return {"cells": self._cells}
        return {"values": list(self._cells)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "cells" in state:
            self._cells = state["cells"]
            return
        self._cells = multiprocessing.RawArray("q", 3 + 5 * MAX_SHARED_PHASES)
        self._cells[:] = state["values"]

    def write(self, position: LoaderPosition) -> None:
        cells = self._cells
        phases = [] if position.phases is None else position.phases.state_dict()["phases"]
        if len(phases) > MAX_SHARED_PHASES:
            raise StateError(
                f"persistent workers carry at most {MAX_SHARED_PHASES} phases of an epoch, "
                f"the position has {len(phases)}"
            )
        cells[0], cells[1], cells[2] = position.epoch, position.consumed_samples, len(phases)
        for number, row in enumerate(phases):
            cells[3 + 5 * number : 8 + 5 * number] = row

    def read(self) -> LoaderPosition:
        cells = self._cells
        count = cells[2]
        if not count:
            return LoaderPosition(cells[0], cells[1])
        rows = [list(cells[3 + 5 * n : 8 + 5 * n]) for n in range(count)]
        return LoaderPosition(cells[0], cells[1], EpochPosition.from_state_dict({"phases": rows}))


class KeptReader:
    """A reader kept open across iterations: entering yields it, leaving keeps it open."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def __enter__(self) -> Any:
        return self._reader

    def __exit__(self, *exc: object) -> None:
        return None
