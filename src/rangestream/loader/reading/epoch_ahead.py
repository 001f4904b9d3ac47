"""A persistent worker's next epoch, planned and its first read sent as this one ends.

Why: between its last read of an epoch and the first batch of the next, a kept worker
(``persistent_workers``) waits for the training loop to finish the epoch; then the next
epoch's first batch costs a plan and a round trip (over S3 with 20 ms per request, 56-100
ms measured) while the loop waits. Started once this epoch's read-ahead has issued its last
read (its tail is then only being handed out), the next epoch's iteration is planned, and
it has its first read (the first step's windows, or the small runs holding them:
``blocks._first_step``) in flight or arrived when the loop asks for it (8-15 ms measured),
and nothing more: the read-ahead sends the first read alone and the rest only as batches
are taken, so an epoch that never comes costs that one read.

That read is sent ahead only by a worker that has already been iterated again (from its
second epoch on): a loader iterated once (one epoch, an evaluation pass) reads nothing
beyond what it hands out, and its next epoch, if one comes, is planned but reads when asked.

It is used only if the loader's position is then exactly where the finished epoch leads
(the next epoch, from its start, with the same setting and worker); a position moved by
``load_state_dict`` or ``set_epoch`` starts its own iteration and the one read ahead is
cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

from rangestream.loader.reading.batches import BatchIterator, EpochStrategy, ReadSpec, Start

__all__ = ["EpochAhead"]


class EpochAhead:
    """The iterations of one persistent worker, each starting the next one ahead."""

    def __init__(self) -> None:
        self._ahead: BatchIterator | None = None
        self._iterations = 0  # iterations this worker has started

    def iterator(
        self,
        spec: ReadSpec,
        strategy: EpochStrategy,
        start: Start,
        following: Callable[[Start], Start] | None,
    ) -> BatchIterator:
        """The iteration starting at ``start``: the one started ahead if it starts there
        (and reads for the same consumer), else a new one. ``following`` gives where the
        epoch after an iteration starts (``None``: never start one ahead)."""
        self._iterations += 1
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead.start == start and ahead.spec.tagged == spec.tagged:
                self._chain(ahead, spec, strategy, following)
                return ahead
            ahead.close()  # the position moved: its read is cancelled
        iterator = BatchIterator(spec, strategy, start)
        self._chain(iterator, spec, strategy, following)
        return iterator

    def _chain(
        self,
        iterator: BatchIterator,
        spec: ReadSpec,
        strategy: EpochStrategy,
        following: Callable[[Start], Start] | None,
    ) -> None:
        """Start the epoch after ``iterator``'s once it has issued its last read."""
        if following is None:
            return

        def begin_next() -> None:
            # planned always; its first read sent only by a worker iterated again already
            held = self._iterations < 2
            self._ahead = BatchIterator(spec, strategy, following(iterator.start), held=held)

        iterator.after_last_read(begin_next)

    def close(self) -> None:
        """Cancel an iteration started ahead (idempotent)."""
        self._iterations += 1
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()
