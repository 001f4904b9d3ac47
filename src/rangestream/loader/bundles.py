"""Several batches per message from a DataLoader worker to the main process.

Every item a worker hands the DataLoader costs a fixed price on both sides, whatever its
size: in the main process an index sent to the worker, a poll, a pipe read, an unpickle
and torch's per-item bookkeeping (about 250 us a message on these 2-core machines); in the
worker a queue put and its feeder thread's pickling and write. With batches of 8 token
windows that is most of the main process's time per batch; the main process is also the
training loop. A tagged worker (``StatefulDataLoader``) therefore sends its batches in
bundles of up to :data:`BUNDLE_BATCHES`, each batch still tagged with its step, and the
main process hands them out one by one in step order (:mod:`rangestream.loader.stepping`).

The first bundle of an iteration holds one batch, so the time to the first batch is that of
one batch; a bundle never waits past the end of the worker's share.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["BUNDLE_BATCHES", "Bundle", "bundled"]

#: Most batches per message after the first (main-process CPU per window, batches of 8
#: windows of 2,049 tokens over S3: 40-50 us with one batch per message, about 20 with
#: bundles of four; ``docs/design.md``).
BUNDLE_BATCHES = 4


class Bundle(list[Any]):
    """Tagged batches ``(step, batch, io)`` that travel as one DataLoader item."""

    __slots__ = ()


def bundled(items: Iterator[Any], most: int = BUNDLE_BATCHES) -> Iterator[Bundle]:
    """``items`` in bundles: the first alone, then up to ``most`` at a time."""
    size = 1
    while True:
        bundle = Bundle()
        for item in items:
            bundle.append(item)
            if len(bundle) >= size:
                break
        if not bundle:
            return
        yield bundle
        size = most
