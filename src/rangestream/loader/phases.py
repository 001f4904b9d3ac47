"""The phases of an epoch: settings of ranks, batch size and workers, and steps taken.

The block shuffle cuts what remains of an epoch by the setting it is played with; a resume
with another setting starts a new phase over what remains. :class:`EpochPosition` lists
the phases, five integers each, so it is saved as plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rangestream.errors import StateError
from rangestream.loader.geometry import check_count

__all__ = ["EpochPosition", "Phase"]


@dataclass(frozen=True)
class Phase:
    """Steps taken in an epoch with one setting of ranks, batch size and workers.

    Parameters
    ----------
    world_size, batch_size, num_workers : int
        The setting (``num_workers`` counts DataLoader workers per rank; 0 means 1).
    drop_last : bool
        End-of-epoch policy of this phase.
    steps : int, default 0
        Steps every rank took in this phase.
    """

    world_size: int
    batch_size: int
    num_workers: int
    drop_last: bool
    steps: int = 0

    def __post_init__(self) -> None:
        check_count("Phase", "world_size", self.world_size, 1)
        check_count("Phase", "batch_size", self.batch_size, 1)
        check_count("Phase", "num_workers", self.num_workers, 0)
        check_count("Phase", "steps", self.steps, 0)
        object.__setattr__(self, "num_workers", max(1, int(self.num_workers)))
        object.__setattr__(self, "drop_last", bool(self.drop_last))

    @property
    def global_batch_size(self) -> int:
        """Windows one step consumes over all ranks."""
        return self.world_size * self.batch_size

    def same_setting(self, other: Phase) -> bool:
        """Whether ``other`` continues this phase (everything equal but the steps)."""
        return (self.world_size, self.batch_size, self.num_workers, self.drop_last) == (
            other.world_size,
            other.batch_size,
            other.num_workers,
            other.drop_last,
        )


@dataclass(frozen=True)
class EpochPosition:
    """Where an epoch stands: the phases played so far, the last one current.

    Plain integers throughout (:meth:`state_dict`), so it is saved in any checkpoint.
    ``consumed_samples`` (the loader's counter) is the sum over phases of steps times the
    global batch size.
    """

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise StateError("EpochPosition needs at least one phase")
        object.__setattr__(self, "phases", tuple(self.phases))

    @classmethod
    def start(
        cls, *, world_size: int, batch_size: int, num_workers: int, drop_last: bool = True
    ) -> EpochPosition:
        """The start of an epoch played with one setting."""
        return cls((Phase(world_size, batch_size, num_workers, drop_last),))

    @property
    def phase(self) -> Phase:
        """The current phase."""
        return self.phases[-1]

    @property
    def consumed_samples(self) -> int:
        """Windows consumed by all ranks together (padding included)."""
        return sum(phase.steps * phase.global_batch_size for phase in self.phases)

    def advance(self, steps: int = 1) -> EpochPosition:
        """The position after ``steps`` more steps of the current phase."""
        steps = check_count("EpochPosition", "steps", steps, 0)
        last = self.phase
        moved = Phase(last.world_size, last.batch_size, last.num_workers, last.drop_last,
                      last.steps + steps)  # fmt: skip
        return EpochPosition((*self.phases[:-1], moved))

    def resume(
        self, *, world_size: int, batch_size: int, num_workers: int, drop_last: bool
    ) -> EpochPosition:
        """The position to continue from with a (possibly) new setting.

        The same setting continues the current phase, so the order is the one an
        uninterrupted run would have seen. Another setting starts a new phase over what
        remains; a current phase without steps is simply replaced.
        """
        wanted = Phase(world_size, batch_size, num_workers, drop_last)
        if wanted.same_setting(self.phase):
            return self
        if self.phase.steps == 0:
            return EpochPosition((*self.phases[:-1], wanted))
        return EpochPosition((*self.phases, wanted))

    def state_dict(self) -> dict[str, list[list[int]]]:
        """``{"phases": [[world_size, batch_size, num_workers, drop_last, steps], ...]}``."""
        return {
            "phases": [
                [p.world_size, p.batch_size, p.num_workers, int(p.drop_last), p.steps]
                for p in self.phases
            ]
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> EpochPosition:
        """Inverse of :meth:`state_dict`."""
        try:
            rows = state["phases"]
            phases = tuple(
                Phase(int(w), int(b), int(nw), bool(int(drop)), int(steps))
                for w, b, nw, drop, steps in rows
            )
        except (KeyError, TypeError, ValueError) as error:
            raise StateError(f"malformed EpochPosition state {state!r}: {error}") from error
        return cls(phases)
