"""How long the training loop waited for its batches: the data-stall figure.

A loader is the bottleneck when the step asks for a batch and has to wait. The loader's
iterator times each ``next()`` (a ``perf_counter`` pair: well under a microsecond) and
:class:`StallClock` keeps the count, the total, the maximum and a bounded sample of the
waits (every wait up to :data:`RESERVOIR`, then a uniform reservoir sample of them), from
which percentiles are computed only when asked for. Waits that end the epoch
(``StopIteration``) are not batches and are not counted.
"""

from __future__ import annotations

import math
import random

__all__ = ["RESERVOIR", "StallClock"]

RESERVOIR = 4096
"""Waits kept for the percentiles: exact up to this many batches, a uniform sample after."""


class StallClock:
    """Waits for batches, cumulative from the loader's creation or the last :meth:`reset`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every wait recorded so far (e.g. to measure one epoch)."""
        self.count = 0
        self.wait_seconds = 0.0
        self.max_seconds = 0.0
        self._first_ask: float | None = None
        self._last_delivery = 0.0
        self._sample: list[float] = []
        self._random = random.Random(0)  # a reservoir that does not depend on global seeds

    def record(self, asked: float, delivered: float) -> None:
        """One batch: asked for at ``asked``, handed over at ``delivered`` (``perf_counter``
        seconds)."""
        wait = delivered - asked
        if self._first_ask is None:
            self._first_ask = asked
        self._last_delivery = delivered
        self.count += 1
        self.wait_seconds += wait
        if wait > self.max_seconds:
            self.max_seconds = wait
        if len(self._sample) < RESERVOIR:
            self._sample.append(wait)
        else:  # Algorithm R: each wait so far is kept with probability RESERVOIR / count
            slot = self._random.randrange(self.count)
            if slot < RESERVOIR:
                self._sample[slot] = wait

    def stats(self) -> dict[str, float | int]:
        """``count`` (batches), ``wait_seconds`` (their total wait), ``wall_seconds`` (from
        the first ask to the last delivery), ``wait_fraction`` (of that wall time spent
        waiting: near 0, data keeps up; near 1, the step waits on data), and the waits'
        ``p50``, ``p90``, ``p99`` and ``max`` in seconds (0 before the first batch)."""
        wall = 0.0 if self._first_ask is None else self._last_delivery - self._first_ask
        ordered = sorted(self._sample)
        return {
            "count": self.count,
            "wait_seconds": self.wait_seconds,
            "wall_seconds": wall,
            "wait_fraction": self.wait_seconds / wall if wall > 0 else 0.0,
            "p50": _percentile(ordered, 50),
            "p90": _percentile(ordered, 90),
            "p99": _percentile(ordered, 99),
            "max": self.max_seconds,
        }


def _percentile(ordered: list[float], percent: float) -> float:
    """Nearest-rank percentile of sorted ``ordered`` (0 when empty)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]
