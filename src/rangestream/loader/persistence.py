"""What persistent DataLoader workers keep between epochs: their position and readers.

Persistent workers keep the dataset they were started with, so the loader's position
reaches them through shared memory (:class:`SharedPosition`), written before every
``iter()``; and a worker keeps its reader open across epochs (:class:`KeptReader`), so
that with the opened version kept in its process a new epoch opens nothing.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from rangestream.errors import StateError
from rangestream.loader.phases import EpochPosition
from rangestream.loader.position import LoaderPosition

__all__ = ["MAX_SHARED_PHASES", "KeptReader", "SharedPosition"]

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
