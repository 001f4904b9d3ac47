"""Where a loader stands in its epochs: one value, plain data, one owner.

The position is the epoch and the samples of it consumed by all ranks together
(``consumed_samples``, as Megatron-LM counts). The block shuffle's order depends on the
setting it was played with (world size, batch size, workers), so it also keeps the
*phases* of the epoch (:class:`rangestream.loader.phases.EpochPosition`); the per-window
orders need only the count. The dataset owns its :class:`LoaderPosition`;
:class:`rangestream.loader.StatefulDataLoader` advances that same object as it hands out
batches, so there is never a second copy to keep in step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rangestream.arguments import integer
from rangestream.errors import StateError
from rangestream.loader.phases import EpochPosition

__all__ = ["LoaderPosition"]


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
