"""Handing out batches in step order, advancing the loader position by one step each.

Workers build stretches of consecutive steps (one range request per stretch in sequential
order) and tag every batch with its step, so the DataLoader's worker round robin delivers
e.g. steps 0, 16, 1, 17, ...; batches that arrive early wait here, at most
``(num_workers - 1) * MAX_STRETCH_STEPS`` of them plus a bundle (workers send several
tagged batches per message: :mod:`rangestream.loader.bundles`).

With a head start (local storage, workers), the first stretch is read in this process on
the first ``next()``, and the workers are started on the second, from the step after that
stretch; until then, no worker exists.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rangestream.errors import StateError
from rangestream.loader.bundles import Bundle

if TYPE_CHECKING:
    from rangestream.loader.dataloader import StatefulDataLoader
    from rangestream.loader.position import LoaderPosition

__all__ = ["StepIterator"]

_MISSING = object()


class StepIterator(Iterator[Any]):
    """One ``for batch in loader`` loop: batches in step order, the position advanced."""

    def __init__(self, loader: StatefulDataLoader, generation: int) -> None:
        self._loader = loader
        self._generation = generation
        self._start: LoaderPosition = loader.dataset.position
        self._inner: Iterator[Any] | None = None
        self._head: Iterator[tuple[int, Any, Any]] | None = None
        self._step_offset = 0
        self._finished = False
        self._next_step = 0
        self._early: dict[int, Any] = {}
        self._bundle: deque[tuple[int, Any, Any]] = deque()  # the rest of a worker's message
        self._order_version = loader._order_version
        if loader._head_start():
            self._head = loader.dataset.head_stretch(self._start)

    def __iter__(self) -> StepIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        loader = self._loader
        if loader._generation != self._generation:
            raise StateError(
                "this loader iterator was superseded by a later iter(), set_epoch() or "
                "load_state_dict() on its StatefulDataLoader; continuing it would lose the "
                "position"
            )
        if self._order_version != loader._order_version:
            self._restart()
        batch = self._early.pop(self._next_step, _MISSING)
        if batch is _MISSING and self._head is not None and self._next_step == 0:
            step, batch, io = next(self._head, (0, _MISSING, None))
            assert step == 0, f"the head stretch started at step {step}"
            loader._count_io(io)
        while batch is _MISSING:
            workers = self._workers()
            batch = self._early.pop(self._next_step, _MISSING)  # the head stretch's rest
            if batch is not _MISSING:
                break
            try:
                step, received, io = self._next_tagged(workers)
            except StopIteration:
                self._finished = True
                if self._early:
                    raise StateError(
                        f"the workers ended the epoch without step {self._next_step} but "
                        f"with steps {sorted(self._early)}; a batch was lost"
                    ) from None
                loader._end_epoch()
                raise
            loader._count_io(io)
            step += self._step_offset
            if step == self._next_step:
                batch = received
            else:
                self._early[step] = received
        self._next_step += 1
        loader._advance()
        return batch

    def _next_tagged(self, workers: Iterator[Any]) -> tuple[int, Any, Any]:
        """The next tagged batch out of the workers, whose messages are bundles of them
        (:mod:`rangestream.loader.bundles`)."""
        if self._bundle:
            return self._bundle.popleft()
        received = next(workers)
        if type(received) is not Bundle:  # read in this process (no workers)
            return received  # type: ignore[no-any-return]
        self._bundle.extend(received)
        return self._bundle.popleft()

    def _restart(self) -> None:
        """The order changed (new mixture weights): drop what was read ahead under the old
        order and continue from the loader's position with fresh workers."""
        self._order_version = self._loader._order_version
        self._inner = None
        self._head = None
        self._early.clear()
        self._bundle.clear()
        self._start = self._loader.dataset.position
        self._next_step = 0
        self._step_offset = 0
        self._loader._iterator = None  # workers hold the old order: start new ones

    def _workers(self) -> Iterator[Any]:
        """The DataLoader's own iterator, started (workers and all) on first use."""
        if self._inner is None:
            start = self._start
            if self._head is not None:
                # the rest of the head stretch, then its reader closes: nothing is open at fork
                for step, batch, io in self._head:
                    self._early[step] = batch
                    self._loader._count_io(io)
                self._head = None
                self._step_offset = self._next_step + len(self._early)
                start = start.advanced(self._loader.dataset.options.global_batch_size,
                                       self._step_offset)  # fmt: skip
            self._inner = self._loader._start_workers(start)
        return self._inner
